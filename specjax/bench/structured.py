"""Structured-output benchmark: `python -m specjax.bench.structured --model smollm2`.

Every schema of specjax/bench/data/schemas.jsonl (JSONSchemaBench's kinds: flat, nested,
arrays, enums, string formats, bounded numbers, optional fields) is asked for in the model's
chat template (the schema in the message), then decoded greedily at batch 1 by each method:
the methods that need a constraint (`specjax.methods`: forced tokens + prompt lookup, forced
tokens alone) and AR, constrained, and unconstrained AR. Reported: compliance (the output
parses as JSON and validates with the `jsonschema` package; outputs cut off by the token limit
are counted apart), tau, and tokens/s of the decoding alone (compilation excluded): a first
call per method (it compiles), then `repeats` rounds of the methods in a fresh random order;
each method's fastest call counts (interference on a shared machine only adds time). Speedups
are per schema, over constrained AR on the same schema; the table gives their median and
geometric mean over the schemas.
"""

from __future__ import annotations

import json
import statistics
import sys
from importlib import resources
from pathlib import Path

import jax
import numpy as np

from specjax import cli
from specjax import methods as registry
from specjax.constraints import json_schema
from specjax.convert import load
from specjax.decoding import generate
from specjax.tokenizer import load_tokenizer

# row name -> (registered method, constrained)
METHODS = {**{f"constrained-{u}": (u, True) for u, m in registry.METHODS.items() if "constraint" in m.needs},
           "constrained-ar": ("ar", True), "unconstrained-ar": ("ar", False)}


def schemas(path: str | None = None) -> list[dict]:
    """The schema set: {name, kind, schema, prompt} per line (a ValueError names a bad line)."""
    text = Path(path).read_text() if path else \
        resources.files("specjax.bench").joinpath("data/schemas.jsonl").read_text()
    rows = []
    for line_no, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{line_no}: not JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(row, dict) or not {"name", "kind", "schema", "prompt"} <= set(row):
                raise ValueError(f"{path}:{line_no}: a row is a JSON object with name, kind, schema and prompt")
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no schemas")
    return rows


def compliance(text: str, schema: dict) -> str:
    """'valid', 'invalid' (not JSON, or not valid under the schema)."""
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return "invalid"
    return "valid"


def constraints(model, tokenizer, items: list[dict]) -> list:
    """Each schema's constraint (a ValueError names a schema the compiler cannot enforce)."""
    out = []
    for item in items:
        try:
            out.append(json_schema(item["schema"], tokenizer, vocab_size=model.config.vocab_size))
        except ValueError as e:
            raise ValueError(f"schema {item['name']!r}: {e}") from None
    return out


def run(model, tokenizer, items: list[dict], compiled: list, methods: list[str], max_new_tokens: int,
        repeats: int) -> list[dict]:
    """Decode every schema of `items` (`compiled`: their `constraints`) with every method (see
    the module's docstring)."""
    eos = list(tokenizer.eos_token_ids)
    rows, rng = [], np.random.default_rng(0)
    for item, constraint in zip(items, compiled):
        message = f"{item['prompt']}\nThe JSON schema:\n{json.dumps(item['schema'])}"
        ids = tokenizer.chat([{"role": "user", "content": message}]) if tokenizer.chat_template \
            else tokenizer.encode(message)
        calls = {m: lambda m=m: generate(
            model, [ids], max_new_tokens=max_new_tokens, drafter=registry.make(METHODS[m][0], model),
            eos_token_id=eos, constraint=constraint if METHODS[m][1] else None, key=jax.random.key(0))
            for m in methods}
        first = {m: call() for m, call in calls.items()}  # compiles; its output is the one checked
        best = {m: out.stats.tokens_per_s for m, out in first.items()}  # compilation excluded
        for _ in range(repeats):
            for m in rng.permutation(methods):
                best[m] = max(best[m], calls[m]().stats.tokens_per_s)
        for method in methods:
            out = first[method]
            tokens = _new_tokens(out)
            n = len(tokens)
            ended = bool(tokens) and tokens[-1] in eos
            text = tokenizer.decode(tokens, skip_special_tokens=True)
            rows.append({"schema": item["name"], "kind": item["kind"], "method": method,
                         "new_tokens": n, "cut_off": not ended,
                         "compliance": compliance(text, item["schema"]) if ended else "cut off",
                         "tau": out.stats.tau, "tokens_per_s": best[method],
                         "speedup": best[method] / best["constrained-ar"] if "constrained-ar" in best else None,
                         "equals_constrained_ar": None if "constrained-ar" not in first or not METHODS[method][1]
                         else tokens == _new_tokens(first["constrained-ar"]),
                         "output": text})
            print(f"{item['name']:18s} {method:34s} {rows[-1]['compliance']:8s} tau {out.stats.tau:.2f} "
                  f"{rows[-1]['tokens_per_s']:.1f} tok/s", flush=True)
    return rows


def _new_tokens(out) -> list[int]:
    """The one row's generated ids."""
    return out.tokens[0, :int(out.num_tokens[0])].tolist()


def summary(rows: list[dict]) -> str:
    """A markdown table per method: compliance, tau and tokens/s (medians over schemas), and the
    speedup over constrained AR (median and geometric mean of the per-schema speedups)."""
    lines = ["| method | valid | invalid | cut off | = constrained AR | tau (median) | tokens/s (median) "
             "| speedup (median) | speedup (geomean) |", "|---|---|---|---|---|---|---|---|---|"]
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        count = {c: sum(r["compliance"] == c for r in mine) for c in ("valid", "invalid", "cut off")}
        ups = [r["speedup"] for r in mine if r.get("speedup")]
        up = (f"{statistics.median(ups):.2f}x | {statistics.geometric_mean(ups):.2f}x" if ups else "- | -")
        same = [r["equals_constrained_ar"] for r in mine if r.get("equals_constrained_ar") is not None]
        lines.append(f"| {method} | {count['valid']}/{len(mine)} | {count['invalid']} | {count['cut off']} | "
                     f"{f'{sum(same)}/{len(same)}' if same else '-'} | "
                     f"{statistics.median(r['tau'] for r in mine):.2f} | "
                     f"{statistics.median(r['tokens_per_s'] for r in mine):.1f} | {up} |")
    return "\n".join(lines)


def parser() -> cli.ArgumentParser:
    ap = cli.ArgumentParser(prog="python -m specjax.bench.structured", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="model name, HF folder or .gguf file")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS), metavar="NAME",
                    help=f"the rows to run: {', '.join(METHODS)}")
    ap.add_argument("--max-new-tokens", type=cli.integer(1), default=256, help="new tokens per output at most")
    ap.add_argument("--repeats", type=cli.integer(1), default=3, help="timed rounds (>= 1); the best counts")
    ap.add_argument("--limit", type=cli.integer(1), default=None, help="the first N schemas only")
    ap.add_argument("--schemas", default=None, help="a JSONL file of {name, kind, schema, prompt} "
                                                      "(default: the shipped set)")
    ap.add_argument("--out", default="benchmarks/structured", help="folder for results.json, results.md")
    return ap


def main(argv=None) -> int:
    def command():
        args = parser().parse_args(argv)
        try:
            model, tokenizer = load(args.model), load_tokenizer(args.model)
            items = schemas(args.schemas)[:args.limit]
            compiled = constraints(model, tokenizer, items)  # every schema, before anything is timed
        except ImportError:
            raise cli.UsageError("the structured bench needs outlines-core and jsonschema: "
                                 "pip install 'specjax[constraints]'") from None
        except (ValueError, OSError, KeyError) as e:
            raise cli.UsageError(str(e)) from None
        rows = run(model, tokenizer, items, compiled, args.methods, args.max_new_tokens, args.repeats)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(rows, indent=1))
        table = summary(rows)
        (out / "results.md").write_text(table + "\n")
        print(table)

    return cli.run(command)


if __name__ == "__main__":
    sys.exit(main())
