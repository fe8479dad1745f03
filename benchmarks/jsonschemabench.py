"""Structured output on real schemas: a seeded sample of JSONSchemaBench (issue #33) compiled,
masked and decoded with SmolLM2's tokenizer and model.

    git clone https://github.com/guidance-ai/jsonschemabench
    python benchmarks/jsonschemabench.py --data jsonschemabench/data --out benchmarks/structured-real

--data is the checkout's data/ folder, the checkout, or a git directory of it (read at HEAD:
a bare mirror needs no work tree). Only the sampling is kept here, not the data: each category's
file names, sorted, shuffled by a Random seeded with (SEED, category); the first --per-category
are the sample, and the first schemas of it that compiled are the decode subset.

1. compile: `sj.constraints.json_schema` on every sampled schema, in a worker process capped by
   RLIMIT_AS and a time limit (a compile over either is counted and the worker restarted), warm
   (imports and the tokenizer's tables paid before); peak memory is the worker's resident
   high-water mark during the compile above its size before (reset through /proc/self/clear_refs).
   Beside it, llguidance's own coverage (grammar_from_json_schema + validate_grammar, its
   default options) for reference.
2. decode: the decode subset, asked for in the chat template with the schema in the message,
   decoded greedily at batch 1 by constrained AR, constrained speculation
   (Forced(PromptLookup())) and unconstrained AR: a first call per method (it compiles; its output
   is checked), then --repeats rounds in random order, each method's fastest counting. Outputs
   that ended are checked with `jsonschema` (formats apart); cut-off ones are counted apart.
3. masks: the host's per-step work (`Matchers.tree_masks`, `Matchers.forced`) timed directly,
   stepping along each constrained AR output of part 2 (every position; batch 8: eight rows at
   eight places of it), against SmolLM2's AR step measured in the same run, unconstrained and
   under a grammar allowing every text (the loop's own cost of a constraint, end to end).
4. batch: per --batch-categories, its first --batch compiled schemas whose prompt fits
   --batch-max-prompt-tokens decoded together, one a row, each under its own constraint (a
   list), by the methods of part 2; per row compliance, spec == AR and AR == part 2's batch-1
   output, and the batch's tokens/s.

Results are saved after every schema (--resume goes on from them) to OUT/results.json, the
tables to OUT/results.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import select
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

CATEGORIES = ("Github_trivial", "Github_easy", "Github_medium", "Github_hard", "Github_ultra", "Glaiveai2K",
              "Kubernetes", "Snowplow", "JsonSchemaStore", "WashingtonPost")
SEED = 0
MODEL = "smollm2"
INSTRUCTION = "Give an example of a JSON object valid under the JSON schema below. Answer with the JSON object alone."
METHODS = ("constrained-ar", "constrained-spec", "unconstrained-ar")
GOAL_SECONDS, GOAL_MB = 2.0, 1024


# ---- the data ------------------------------------------------------------------------------------

class Dataset:
    """JSONSchemaBench's schema files: `path` is its data/ folder, the checkout, or a git
    directory (read at HEAD)."""

    def __init__(self, path: str):
        root = Path(path)
        self.git = None
        if (root / "data").is_dir():
            root = root / "data"
        if not any((root / c).is_dir() for c in CATEGORIES):
            probe = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD:data"], capture_output=True, text=True)
            if probe.returncode:
                raise SystemExit(f"{path}: neither JSONSchemaBench's data/ folder nor a git directory of it; "
                                 "get it with: git clone https://github.com/guidance-ai/jsonschemabench")
            self.git = str(root)
            self.revision = self._git("rev-parse", "HEAD").strip()
        else:
            self.revision = None
        self.root = root

    def names(self, category: str) -> list[str]:
        if self.git:
            listing = self._git("ls-tree", "--name-only", f"HEAD:data/{category}")
            return sorted(n for n in listing.splitlines() if n.endswith(".json"))
        return sorted(p.name for p in (self.root / category).glob("*.json"))

    def text(self, category: str, name: str) -> str:
        if self.git:
            return self._git("show", f"HEAD:data/{category}/{name}")
        return (self.root / category / name).read_text()

    def _git(self, *args: str) -> str:
        return subprocess.run(["git", "-C", self.git, *args], capture_output=True, text=True, check=True).stdout


def sample(data: Dataset, per_category: int, seed: int = SEED) -> list[tuple[str, str]]:
    """(category, file name) of each category's first `per_category` in its seeded order."""
    out = []
    for category in CATEGORIES:
        names = data.names(category)
        random.Random(f"{seed}/{category}").shuffle(names)
        out += [(category, name) for name in names[:per_category]]
    return out


def key(category: str, name: str) -> str:
    return f"{category}/{name}"


# ---- 1. compile, in a capped worker ---------------------------------------------------------------

def _status_kb(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _reset_peak() -> bool:
    """Reset the resident high-water mark (VmHWM) to the current size; False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def worker(memory_gb: float) -> None:
    """The compile worker: one JSON request a line on stdin ({"schema": text}), one
    'RESULT {...}' line a request on stdout."""
    cap = int(memory_gb * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    import llguidance

    import specjax as sj
    from specjax.constraints import matchers

    tok = sj.load_tokenizer(MODEL)
    ll_tok = matchers.ll_tokenizer(tok.tokenizer, tuple(tok.eos_token_ids), tok.tokenizer.get_vocab_size())
    for warm in ({"type": "object", "properties": {"a": {"type": "string"}}}, {"enum": ["yes", "no"]}):
        sj.constraints.json_schema(warm, tok)
    print("READY", flush=True)
    for line in sys.stdin:
        schema = json.loads(json.loads(line)["schema"])
        result = {"rss_before_mb": _status_kb("VmRSS") / 1024, "peak_reset": _reset_peak()}
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            grammar = sj.constraints.json_schema(schema, tok)
            result.update(status="compiled", on_device=grammar.on_device)
        except sj.constraints.UnsupportedSchema as e:
            result.update(status="refused", message=str(e)[:400])
        except MemoryError:
            result.update(status="over memory", message="MemoryError")
        except Exception as e:  # a crash of the compiler: a bug to report
            result.update(status="error", message=f"{type(e).__name__}: {e}"[:400])
        result.update(seconds=time.perf_counter() - wall, cpu_seconds=time.process_time() - cpu,
                      peak_mb=_status_kb("VmHWM") / 1024 - result["rss_before_mb"])
        grammar = None
        wall = time.perf_counter()
        try:
            ll_grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
            is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(ll_grammar, ll_tok)
            reference = {"status": "refused" if is_error else "compiled", "message": messages[0][:400] if is_error else ""}
        except Exception as e:
            reference = {"status": "refused", "message": f"{type(e).__name__}: {e}"[:400]}
        result["llguidance"] = {**reference, "seconds": time.perf_counter() - wall}
        print("RESULT " + json.dumps(result), flush=True)


class CompileWorker:
    """The parent's side of `worker`: a compile past `seconds` or the memory cap is counted
    (the worker killed or dead) and a new worker started for the next."""

    def __init__(self, memory_gb: float, seconds: float, log):
        self.memory_gb, self.seconds, self.log = memory_gb, seconds, log
        self.proc, self.buffer = None, b""

    def compile(self, text: str) -> dict:
        if self.proc is None:
            self._start()
        self.proc.stdin.write((json.dumps({"schema": text}) + "\n").encode())
        self.proc.stdin.flush()
        line = self._line(self.seconds)
        if line is not None:
            return json.loads(line)
        if self.proc.poll() is None:  # still compiling: over the time limit
            self._stop()
            return {"status": "over time", "message": f"killed after {self.seconds:.0f} s", "seconds": self.seconds}
        code = self.proc.returncode
        self._stop()
        return {"status": "over memory", "message": f"the worker died ({_exit(code)}) under the {self.memory_gb:g} GB "
                                                     "address-space cap"}

    def close(self) -> None:
        if self.proc is not None:
            self._stop()

    def _start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", "--memory-gb", str(self.memory_gb)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log)
        self.buffer = b""
        if self._line(600, "READY") is None:
            raise RuntimeError("the compile worker did not start (see the log)")

    def _stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.proc = None

    def _line(self, seconds: float, prefix: str = "RESULT") -> str | None:
        """The payload of the next stdout line starting with `prefix` within `seconds`; None on
        timeout or end of output (other lines, e.g. a library's prints, are skipped)."""
        deadline = time.monotonic() + seconds
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" in self.buffer:
                raw, self.buffer = self.buffer.split(b"\n", 1)
                text = raw.decode(errors="replace")
                if text.startswith(prefix):
                    return text[len(prefix):].strip()
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self.buffer += chunk


def _exit(code: int) -> str:
    import signal

    return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"


# ---- 2. decode --------------------------------------------------------------------------------------

def validity(text: str, schema) -> tuple[str, str]:
    """('valid' | 'invalid' | 'unchecked', why): the output against the schema with `jsonschema`
    (formats not asserted, as jsonschema.validate); 'unchecked' where the validator cannot read
    the schema (a remote $ref, an unknown draft)."""
    import jsonschema

    try:
        document = json.loads(text)
    except json.JSONDecodeError as e:
        return "invalid", f"not JSON: {e}"
    try:
        cls = jsonschema.validators.validator_for(schema)
        error = jsonschema.exceptions.best_match(cls(schema).iter_errors(document))
    except Exception as e:
        return "unchecked", f"{type(e).__name__}: {e}"[:300]
    return ("valid", "") if error is None else ("invalid", error.message[:300])


def format_errors(text: str, schema) -> list[str]:
    """The `format` keywords the output fails where jsonschema can check them."""
    import jsonschema

    try:
        cls = jsonschema.validators.validator_for(schema)
        return [e.message[:200] for e in cls(schema, format_checker=cls.FORMAT_CHECKER).iter_errors(json.loads(text))
                if e.validator == "format"]
    except Exception:
        return []


def prompt_text(schema) -> str:
    return f"{INSTRUCTION}\nThe JSON schema:\n{json.dumps(schema)}"


def timed(model, prompts: list, constraint, max_new_tokens: int, repeats: int, rng, eos: list[int]):
    """Every method on `prompts` (constraint: a Grammar, or a list of them, one a row): a first
    call each (it compiles; its output is the one checked), then `repeats` rounds in random
    order. Returns ({method: the first call's output}, {method: its fastest tokens/s})."""
    import jax

    import specjax as sj

    drafters = {"constrained-ar": None, "constrained-spec": sj.drafters.Forced(sj.drafters.PromptLookup()),
                "unconstrained-ar": None}
    calls = {m: lambda m=m: sj.generate(model, prompts, max_new_tokens=max_new_tokens, drafter=drafters[m],
                                        eos_token_id=eos, key=jax.random.key(0),
                                        constraint=None if m == "unconstrained-ar" else constraint)
             for m in METHODS}
    first = {m: call() for m, call in calls.items()}
    best = {m: out.stats.tokens_per_s for m, out in first.items()}
    for _ in range(repeats):
        for m in rng.permutation(METHODS):
            best[m] = max(best[m], calls[m]().stats.tokens_per_s)
    return first, best


def checked(out, row: int, tok, schema, eos: list[int]) -> dict:
    """Row `row` of a generate output: its tokens and text, and its compliance with `schema`
    where it ended (a cut-off output is counted apart)."""
    tokens = out.tokens[row, :int(out.num_tokens[row])].tolist()
    ended = bool(tokens) and tokens[-1] in eos
    text = tok.decode(tokens, skip_special_tokens=True)
    status, why = validity(text, schema) if ended else ("cut off", "")
    return {"tokens": tokens, "new_tokens": len(tokens), "compliance": status, "why": why,
            "format_errors": format_errors(text, schema) if status == "valid" else [], "output": text[:4000]}


def same_start(a: list[int], b: list[int]) -> bool:
    """Whether two outputs agree over the shorter (decodes capped at different lengths)."""
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def chat_ids(tok, schema) -> list[int]:
    return tok.chat([{"role": "user", "content": prompt_text(schema)}])


def passed_over(row: dict | None, prompt: int, max_prompt: int) -> bool:
    """Whether a schema is not decoded for its prompt length: over the limit, and not decoded by an
    earlier round (whose decode is kept when a later round has a smaller limit)."""
    return prompt > max_prompt and (row is None or "skipped" in row)


def decode(model, tok, schema, grammar, max_new_tokens: int, repeats: int, rng) -> dict:
    """One schema decoded by every method (see the module); per method its output and timing."""
    ids, eos = chat_ids(tok, schema), list(tok.eos_token_ids)
    first, best = timed(model, [ids], grammar, max_new_tokens, repeats, rng, eos)
    row = {"prompt_tokens": len(ids)}
    for m in METHODS:
        row[m] = {**checked(first[m], 0, tok, schema, eos), "tau": first[m].stats.tau, "tokens_per_s": best[m]}
    row["spec_equals_ar"] = row["constrained-spec"]["tokens"] == row["constrained-ar"]["tokens"]
    row["spec_speedup"] = best["constrained-spec"] / best["constrained-ar"]
    return row


def decode_batch(model, tok, schemas: dict, grammars: list, max_new_tokens: int, repeats: int, rng) -> dict:
    """Schemas {key: schema} decoded together, one a row of one batch, each row under its own
    constraint (a list); per method each row's output and the batch's tokens/s (every row's new
    tokens over the call's time)."""
    ids, eos = [chat_ids(tok, s) for s in schemas.values()], list(tok.eos_token_ids)
    first, best = timed(model, ids, list(grammars), max_new_tokens, repeats, rng, eos)
    result = {"schemas": list(schemas), "prompt_tokens": [len(i) for i in ids]}
    for m in METHODS:
        stats = first[m].stats
        result[m] = {"rows": [checked(first[m], r, tok, s, eos) for r, s in enumerate(schemas.values())],
                     "tau": stats.tau, "steps": stats.target_calls, "tokens_per_s": best[m]}
    result["spec_equals_ar"] = [s["tokens"] == a["tokens"] for s, a in
                                zip(result["constrained-spec"]["rows"], result["constrained-ar"]["rows"])]
    result["spec_speedup"] = best["constrained-spec"] / best["constrained-ar"]
    return result


# ---- 3. per-step mask cost --------------------------------------------------------------------------

def ar_steps(model, tok, batch: int, repeats: int = 3) -> dict:
    """SmolLM2's AR step in ms at `batch`: unconstrained ("ar") and under a host grammar that
    allows every text ("ar_any_grammar": the loop's own cost of a constraint, its callback,
    masking and advancing, with the cheapest mask); 64 tokens of a story, the two interleaved,
    the fastest of `repeats` each; same_tokens: whether the two wrote the same text."""
    import specjax as sj

    ids = tok.chat([{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}])
    anything = sj.constraints.regex(r"(.|\n)*", tok, vocab_size=model.config.vocab_size, engine="llguidance")
    calls = {m: lambda c=c: sj.generate(model, [ids] * batch, max_new_tokens=64, eos_token_id=list(tok.eos_token_ids),
                                         constraint=c) for m, c in (("ar", None), ("ar_any_grammar", anything))}
    first = {m: call() for m, call in calls.items()}  # compiles
    best = {m: float("inf") for m in calls}
    for _ in range(repeats):
        for m, call in calls.items():
            stats = call().stats
            best[m] = min(best[m], 1000 * stats.wall_time_s / stats.target_calls)
    same = all(np.array_equal(first["ar"].tokens[r, :int(first["ar"].num_tokens[r])],
                              first["ar_any_grammar"].tokens[r, :int(first["ar_any_grammar"].num_tokens[r])])
               for r in range(batch))
    return {**best, "same_tokens": same}


def mask_cost(grammar, output: list[int], batch: int, nodes: int) -> dict[str, list[float]]:
    """Milliseconds of each host call a decode step makes, stepping along `output` one token a
    step (row r of `batch` starts r/batch of the way along it): tree_masks for the root alone
    (AR), for a chain of `nodes` along the output (speculation), and forced."""
    from specjax.constraints import matchers
    from specjax.tree import DraftTree

    host = matchers.lookup(int(grammar.handle))
    length = len(output)
    chain = DraftTree.build(np.zeros((1, nodes), np.int32), np.arange(-1, nodes - 1))
    paths, depth = np.asarray(chain.paths), np.asarray(chain.depth)
    consumed = np.zeros((batch, length), np.int32)
    consumed[:] = output
    out = {}
    for name, n in (("ar", 1), (f"chain{nodes}", nodes), ("forced", nodes)):
        times = []
        for step in range(length - 1):
            place = 1 + (step + np.arange(batch) * (length - 1) // batch) % (length - 1)  # root = output[place - 1]
            tokens = np.zeros((batch, n), np.int32)
            valid = np.zeros((batch, n), bool)
            for r, p in enumerate(place):
                drafts = output[p - 1: p - 1 + n]
                tokens[r, :len(drafts)], valid[r, :len(drafts)] = drafts, True
            count = place.astype(np.int32)
            start = time.perf_counter()
            if name == "forced":
                host.forced(consumed, count, n)
            else:
                host.tree_masks(consumed, count, tokens, np.broadcast_to(paths[:, :n, :n], (batch, n, n)),
                                np.broadcast_to(depth[:, :n], (batch, n)), valid)
            times.append(round(1000 * (time.perf_counter() - start), 3))
        out[name] = times
    return out


# ---- tables -------------------------------------------------------------------------------------------

def _median(xs) -> float:
    return statistics.median(xs) if xs else float("nan")


def _in(results: dict, category: str) -> list:
    return [v for k, v in results.items() if k.split("/")[0] == category]


def compile_table(compiled: dict) -> str:
    lines = ["| category | sampled | specjax compiled | on device | refused | over time | over memory | errors "
             "| compile median / max (s) | CPU median / max (s) | peak MB median / max | llguidance compiled |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for category in (*CATEGORIES, "all"):
        rows = list(compiled.values()) if category == "all" else _in(compiled, category)
        if not rows:
            continue
        count = {s: sum(r["status"] == s for r in rows) for s in ("compiled", "refused", "over time", "over memory", "error")}
        ok = [r for r in rows if "seconds" in r and r["status"] != "over time"]
        secs, cpu, peak = ([r[f] for r in ok if f in r] for f in ("seconds", "cpu_seconds", "peak_mb"))
        ref = sum(r.get("llguidance", {}).get("status") == "compiled" for r in rows)
        name = f"**{category}**" if category == "all" else category
        lines.append(f"| {name} | {len(rows)} | {count['compiled']} ({100 * count['compiled'] / len(rows):.0f}%) "
                     f"| {sum(bool(r.get('on_device')) for r in rows)} | {count['refused']} | {count['over time']} "
                     f"| {count['over memory']} | {count['error']} | {_median(secs):.3f} / {max(secs, default=0):.2f} "
                     f"| {_median(cpu):.3f} / {max(cpu, default=0):.2f} | {_median(peak):.0f} / {max(peak, default=0):.0f} "
                     f"| {ref} ({100 * ref / len(rows):.0f}%) |")
    return "\n".join(lines)


ENDED = ("valid", "invalid", "cut off")  # the outcomes of a row that was checked


def _tally(compliances, *kinds) -> str:
    """"n / n / ..." of each outcome in `kinds` (default: every outcome, "unchecked" last)."""
    return " / ".join(str(sum(c == k for c in compliances)) for k in kinds or (*ENDED, "unchecked"))


def decode_table(decoded: dict) -> str:
    lines = ["| category | decoded | constrained AR: valid / invalid / cut off / unchecked | spec: valid / invalid / "
             "cut off | spec = AR | unconstrained: valid / invalid / cut off | tokens/s c-AR / spec / u-AR (median) "
             "| spec tau (median) | spec over c-AR (median) |", "|---|---|---|---|---|---|---|---|---|"]
    for category in (*CATEGORIES, "all"):
        rows = [r for r in (decoded.values() if category == "all" else _in(decoded, category)) if "skipped" not in r]
        if not rows:
            continue

        counts = lambda m, *kinds: _tally([r[m]["compliance"] for r in rows], *kinds)
        speed = " / ".join(f"{_median([r[m]['tokens_per_s'] for r in rows]):.1f}" for m in METHODS)
        name = f"**{category}**" if category == "all" else category
        lines.append(f"| {name} | {len(rows)} | {counts('constrained-ar')} | {counts('constrained-spec', *ENDED)} "
                     f"| {sum(r['spec_equals_ar'] for r in rows)}/{len(rows)} "
                     f"| {counts('unconstrained-ar', *ENDED)} | {speed} "
                     f"| {_median([r['constrained-spec']['tau'] for r in rows]):.2f} "
                     f"| {_median([r['spec_speedup'] for r in rows]):.2f}x |")
    return "\n".join(lines)


def batch_table(batched: dict) -> str:
    lines = ["| category | rows | constrained AR: valid / invalid / cut off / unchecked | spec: valid / invalid / cut off "
             "| spec = AR (rows) | AR batch 8 = batch 1 (rows decoded at both) | unconstrained: valid / invalid / cut off "
             "| tokens/s c-AR / spec / u-AR (the batch) | spec tau | spec over c-AR |", "|---|---|---|---|---|---|---|---|---|---|"]
    every = list(batched.values())
    for category, runs in [(c, [batched[c]]) for c in CATEGORIES if c in batched] + [("all", every)]:
        rows = {m: [r for run in runs for r in run[m]["rows"]] for m in METHODS}

        counts = lambda m, *kinds: _tally([r["compliance"] for r in rows[m]], *kinds)
        same = [x for run in runs for x in run["spec_equals_ar"]]
        b1 = [x for run in runs for x in run["ar_equals_batch1"] if x is not None]
        speed = " / ".join(f"{_median([run[m]['tokens_per_s'] for run in runs]):.1f}" for m in METHODS)
        name = f"**{category}** (median of batches)" if category == "all" else category
        lines.append(f"| {name} | {len(rows['constrained-ar'])} | {counts('constrained-ar')} "
                     f"| {counts('constrained-spec', *ENDED)} | {sum(same)}/{len(same)} "
                     f"| {sum(b1)}/{len(b1)} | {counts('unconstrained-ar', *ENDED)} | {speed} "
                     f"| {_median([run['constrained-spec']['tau'] for run in runs]):.2f} "
                     f"| {_median([run['spec_speedup'] for run in runs]):.2f}x |")
    return "\n".join(lines)


def mask_table(masks: dict, step_ms: dict) -> str:
    calls = list(next(iter(masks.values()))["b1"])  # ar, chain<N>, forced
    lines = ["| category | schemas (steps) | " + " | ".join(f"{c} b{b} median / p90 (ms)" for b in (1, 8) for c in calls)
             + f" | {calls[1]} + forced b1, % of an AR step b1 | b8, % of an AR step b8 |",
             "|---|---|" + "---|" * (2 * len(calls) + 2)]
    for category in (*CATEGORIES, "all"):
        rows = list(masks.values()) if category == "all" else _in(masks, category)
        if not rows:
            continue
        pooled = {(c, b): [t for r in rows for t in r[f"b{b}"][c]] for c in calls for b in (1, 8)}
        cells = [f"{_median(pooled[c, b]):.2f} / {np.percentile(pooled[c, b], 90):.2f}" for b in (1, 8) for c in calls]
        share = [100 * (_median(pooled[calls[1], b]) + _median(pooled["forced", b])) / step_ms[f"b{b}"]["ar"]
                 for b in (1, 8)]
        name = f"**{category}**" if category == "all" else category
        lines.append(f"| {name} | {len(rows)} ({len(pooled['ar', 1])}) | " + " | ".join(cells)
                     + f" | {share[0]:.1f}% | {share[1]:.1f}% |")
    return "\n".join(lines)


def dumps(doc: dict) -> str:
    """JSON with a line per schema of each section (small, and greppable by schema)."""
    parts = []
    for name, value in doc.items():
        if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            rows = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in value.items())
            parts.append(f" {json.dumps(name)}: {{\n{rows}\n }}")
        else:
            parts.append(f" {json.dumps(name)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


# ---- the run -----------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--data", help="JSONSchemaBench's data/ folder, its checkout, or a git directory of it")
    ap.add_argument("--out", default="benchmarks/structured-real", help="folder for results.json and results.md")
    ap.add_argument("--per-category", type=int, default=30, help="schemas sampled per category")
    ap.add_argument("--decode-per-category", type=int, default=3, help="compiled schemas decoded per category")
    ap.add_argument("--parts", nargs="+", default=["compile", "decode", "masks", "batch"],
                    choices=["compile", "decode", "masks", "batch"])
    ap.add_argument("--memory-gb", type=float, default=4.0, help="a compile worker's address-space cap")
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds a compile may take")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--max-prompt-tokens", type=int, default=None,
                    help="longer prompts (big schemas) are not decoded (default: what fits the model's context "
                         "with --max-new-tokens)")
    ap.add_argument("--repeats", type=int, default=1, help="timed decode rounds after the compiling one")
    ap.add_argument("--batch", type=int, default=8, help="rows of the batch part: that many schemas of a category")
    ap.add_argument("--batch-categories", nargs="+", default=list(CATEGORIES), choices=CATEGORIES,
                    help="categories the batch part decodes (one batch each)")
    ap.add_argument("--batch-max-prompt-tokens", type=int, default=512, help="longer prompts are left out of a batch")
    ap.add_argument("--mask-nodes", type=int, default=8, help="nodes of the chain tree the masks are timed on")
    ap.add_argument("--resume", action="store_true", help="keep the schemas OUT/results.json already has")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.memory_gb)
        return 0
    if not args.data:
        ap.error("--data is required: JSONSchemaBench's data/ folder "
                 "(git clone https://github.com/guidance-ai/jsonschemabench)")

    data = Dataset(args.data)
    items = sample(data, args.per_category)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    config = {"seed": SEED, "per_category": args.per_category, "data_revision": data.revision, "model": MODEL,
              "memory_gb": args.memory_gb, "time_limit_s": args.time_limit, "max_new_tokens": args.max_new_tokens,
              "max_prompt_tokens": args.max_prompt_tokens, "repeats": args.repeats, "mask_nodes": args.mask_nodes,
              "batch": args.batch, "batch_max_prompt_tokens": args.batch_max_prompt_tokens}
    results = {"compile": {}, "decode": {}, "masks": {}, "ar_step_ms": {}, "batch": {}}
    if args.resume and path.exists():
        results.update({k: v for k, v in json.loads(path.read_text()).items() if k in results})
    from specjax.bench.report import machine  # imports jax: after the worker's branch

    def save():
        path.write_text(dumps({"command": " ".join(["python", *sys.argv]), "config": config, "machine": machine(),
                               "load_average": os.getloadavg(), **results}))

    if "compile" in args.parts:
        with open(out / "compile-worker.log", "a") as log:
            compiler = CompileWorker(args.memory_gb, args.time_limit, log)
            try:
                for category, name in items:
                    if key(category, name) in results["compile"]:
                        continue
                    r = compiler.compile(data.text(category, name))
                    results["compile"][key(category, name)] = r
                    print(f"compile {key(category, name):40s} {r['status']:11s} {r.get('seconds', 0):7.3f} s "
                          f"{r.get('peak_mb', 0):7.0f} MB  llguidance {r.get('llguidance', {}).get('status', '-')}  "
                          f"{r.get('message', '')[:100]}", flush=True)
                    save()
            finally:
                compiler.close()
        print(compile_table(results["compile"]), flush=True)

    if {"decode", "masks", "batch"} & set(args.parts):
        import specjax as sj

        model, tok = sj.load(MODEL), sj.load_tokenizer(MODEL)
        max_prompt = args.max_prompt_tokens or model.config.max_position_embeddings - args.max_new_tokens
        rng = np.random.default_rng(SEED)
        grammars, decoded = {}, {c: 0 for c in CATEGORIES}
        for category, name in items if {"decode", "masks"} & set(args.parts) else ():  # the first compiled schemas of each category whose prompt fits
            k = key(category, name)
            if results["compile"].get(k, {}).get("status") != "compiled" or decoded[category] >= args.decode_per_category:
                continue
            schema = json.loads(data.text(category, name))
            prompt = len(chat_ids(tok, schema))
            if passed_over(results["decode"].get(k), prompt, max_prompt):
                results["decode"][k] = {"skipped": f"prompt of {prompt} tokens"}
                print(f"decode  {k:40s} skipped: prompt of {prompt} tokens", flush=True)
                continue
            decoded[category] += 1
            grammars[k] = sj.constraints.json_schema(schema, tok, vocab_size=model.config.vocab_size)
            if "skipped" in results["decode"].get(k, {}):  # skipped at a smaller limit: it fits now
                del results["decode"][k]
            if k not in results["decode"] and "decode" in args.parts:
                row = decode(model, tok, schema, grammars[k], args.max_new_tokens, args.repeats, rng)
                results["decode"][k] = row
                print(f"decode  {k:40s} " + "  ".join(f"{m} {row[m]['compliance']} {row[m]['new_tokens']} tok "
                                                      f"{row[m]['tokens_per_s']:.1f}/s" for m in METHODS)
                      + f"  spec=AR {row['spec_equals_ar']} {row['spec_speedup']:.2f}x", flush=True)
                save()
        if "masks" in args.parts:
            results["ar_step_ms"] = {f"b{b}": ar_steps(model, tok, b) for b in (1, 8)}
            print(f"AR step: {results['ar_step_ms']}", flush=True)
            for k, grammar in grammars.items():
                row = results["decode"].get(k, {})
                if "constrained-ar" not in row or grammar.on_device or row["constrained-ar"]["new_tokens"] < 2:
                    continue
                output = row["constrained-ar"]["tokens"]
                results["masks"][k] = {"steps": len(output) - 1,
                                       **{f"b{b}": mask_cost(grammar, output, b, args.mask_nodes) for b in (1, 8)}}
                print(f"masks   {k:40s} chain b1 {_median(results['masks'][k]['b1'][f'chain{args.mask_nodes}']):.2f} ms",
                      flush=True)
                save()
        if "batch" in args.parts:
            for category in args.batch_categories:
                if category in results["batch"]:
                    continue
                chosen = {}  # the first compiled schemas of the category whose prompt fits
                for c, name in items:
                    if c == category and results["compile"].get(key(c, name), {}).get("status") == "compiled":
                        schema = json.loads(data.text(c, name))
                        if len(chosen) < args.batch and len(chat_ids(tok, schema)) <= args.batch_max_prompt_tokens:
                            chosen[key(c, name)] = schema
                if len(chosen) < args.batch:
                    print(f"batch   {category:40s} skipped: {len(chosen)} compiled schemas with prompts of at most "
                          f"{args.batch_max_prompt_tokens} tokens", flush=True)
                    continue
                row = decode_batch(model, tok, chosen, [sj.constraints.json_schema(s, tok, vocab_size=model.config.vocab_size)
                                                        for s in chosen.values()], args.max_new_tokens, args.repeats, rng)
                single = [results["decode"].get(k, {}).get("constrained-ar") for k in chosen]
                row["ar_equals_batch1"] = [None if b1 is None else same_start(b1["tokens"], r["tokens"])
                                           for b1, r in zip(single, row["constrained-ar"]["rows"])]
                results["batch"][category] = row
                print(f"batch   {category:40s} " + "  ".join(
                    f"{m} {sum(r['compliance'] == 'valid' for r in row[m]['rows'])} valid {row[m]['tokens_per_s']:.1f}/s"
                    for m in METHODS) + f"  spec=AR {sum(row['spec_equals_ar'])}/{args.batch} {row['spec_speedup']:.2f}x",
                      flush=True)
                save()
    save()
    tables = [f"Machine: {machine()}", f"Command: `{' '.join(['python', *sys.argv])}`"]
    if results["compile"]:
        tables.append("Compile:\n\n" + compile_table(results["compile"]))
    if results["decode"]:
        tables.append("Decode (greedy, batch 1):\n\n" + decode_table(results["decode"]))
    if results["batch"]:
        tables.append("Decode (greedy, batch 8: a category's schemas, one a row, a constraint a row):\n\n"
                      + batch_table(results["batch"]))
    if results["masks"] and results["ar_step_ms"]:
        steps = results["ar_step_ms"]
        tables.append("Host mask cost per step; SmolLM2's AR step: " + ", ".join(
            f"batch {b[1:]}: {s['ar']:.1f} ms unconstrained, {s['ar_any_grammar']:.1f} ms under a grammar allowing "
            f"every text ({100 * (s['ar_any_grammar'] / s['ar'] - 1):+.1f}%, same tokens: {s['same_tokens']})"
            for b, s in steps.items()) + ":\n\n" + mask_table(results["masks"], steps))
    (out / "results.md").write_text("\n\n".join(tables) + "\n")
    print("\n\n".join(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
