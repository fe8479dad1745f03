"""Structured-output benchmark: `python -m specjax.bench.structured --model smollm2`.

Every schema of specjax/bench/data/schemas.jsonl (JSONSchemaBench's kinds: flat, nested,
arrays, enums, string formats, bounded numbers, optional fields) is asked for in the model's
chat template (the schema in the message), then decoded greedily at batch 1 by each method:
constrained speculation (forced tokens + prompt lookup), forced tokens alone, constrained AR
and unconstrained AR. Reported: compliance (the output parses as JSON and validates with the
`jsonschema` package; outputs cut off by the token limit are counted apart), tau and tokens/s
(decoding time, compilation excluded: the median over repeats).
"""

from __future__ import annotations

import argparse
import json
import statistics
from importlib import resources
from pathlib import Path

import jax

import specjax as sj

METHODS = {  # name -> (drafter factory, constrained)
    "constrained-forced+prompt-lookup": (lambda: sj.drafters.Forced(sj.drafters.PromptLookup()), True),
    "constrained-forced": (lambda: sj.drafters.Forced(), True),
    "constrained-ar": (lambda: None, True),
    "unconstrained-ar": (lambda: None, False),
}


def schemas(path: str | None = None) -> list[dict]:
    """The schema set: {name, kind, schema, prompt} per line."""
    text = Path(path).read_text() if path else \
        resources.files("specjax.bench").joinpath("data/schemas.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def compliance(text: str, schema: dict) -> str:
    """'valid', 'invalid' (not JSON, or not valid under the schema)."""
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return "invalid"
    return "valid"


def run(model_name: str, methods: list[str], max_new_tokens: int, repeats: int, limit: int | None,
        path: str | None = None) -> list[dict]:
    model, tokenizer = sj.load(model_name), sj.load_tokenizer(model_name)
    eos = list(tokenizer.eos_token_ids)
    rows = []
    for item in schemas(path)[:limit]:
        constraint = sj.constraints.json_schema(item["schema"], tokenizer, vocab_size=model.config.vocab_size)
        message = f"{item['prompt']}\nThe JSON schema:\n{json.dumps(item['schema'])}"
        ids = tokenizer.chat([{"role": "user", "content": message}]) if tokenizer.chat_template \
            else tokenizer.encode(message)
        for method in methods:
            make, constrained = METHODS[method]
            runs = [sj.generate(model, [ids], max_new_tokens=max_new_tokens, drafter=make(), eos_token_id=eos,
                                constraint=constraint if constrained else None, key=jax.random.key(0))
                    for _ in range(repeats + 1)][1:]  # the first call compiles
            out = runs[0]
            n = int(out.num_tokens[0])
            tokens = out.tokens[0, :n].tolist()
            ended = bool(tokens) and tokens[-1] in eos
            text = tokenizer.decode(tokens, skip_special_tokens=True)
            rows.append({"schema": item["name"], "kind": item["kind"], "method": method,
                         "new_tokens": n, "cut_off": not ended,
                         "compliance": compliance(text, item["schema"]) if ended else "cut off",
                         "tau": out.stats["tau"],
                         "tokens_per_s": statistics.median(r.stats["tokens_per_s"] for r in runs),
                         "output": text})
            print(f"{item['name']:18s} {method:34s} {rows[-1]['compliance']:8s} tau {out.stats['tau']:.2f} "
                  f"{rows[-1]['tokens_per_s']:.1f} tok/s", flush=True)
    return rows


def summary(rows: list[dict]) -> str:
    """A markdown table per method: compliance, tau, tokens/s (medians over schemas)."""
    lines = ["| method | valid | invalid | cut off | tau (median) | tokens/s (median) |", "|---|---|---|---|---|---|"]
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        count = {c: sum(r["compliance"] == c for r in mine) for c in ("valid", "invalid", "cut off")}
        lines.append(f"| {method} | {count['valid']}/{len(mine)} | {count['invalid']} | {count['cut off']} | "
                     f"{statistics.median(r['tau'] for r in mine):.2f} | "
                     f"{statistics.median(r['tokens_per_s'] for r in mine):.1f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m specjax.bench.structured", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--limit", type=int, default=None, help="the first N schemas only")
    ap.add_argument("--schemas", default=None, help="a JSONL file of {name, kind, schema, prompt}")
    ap.add_argument("--out", default="benchmarks/structured")
    args = ap.parse_args(argv)
    rows = run(args.model, args.methods, args.max_new_tokens, args.repeats, args.limit, args.schemas)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    table = summary(rows)
    (out / "results.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
