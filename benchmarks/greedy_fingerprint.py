"""Greedy fingerprint of every named drafter: a hash of its tokens and its tau, per model.

A refactor or a kernel that must not change what specjax says is checked by running this before
and after and comparing the two JSON files (`--compare`): the tokens must be equal for every
drafter (a float-reordering kernel may flip an exact argmax tie; the script then names the row
and the first step that differs).

    python benchmarks/greedy_fingerprint.py --model tiny --out before.json
    python benchmarks/greedy_fingerprint.py --model tiny --compare before.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

import numpy as np

import specjax as sj

PROMPTS = {
    "tiny": ["def parse_args(argv):", "class Stack:\n    def push(self, item):",
             "import os\n\ndef walk(path):"],
    "smollm2": ["Write a Python function that checks whether a number is prime.",
                "Explain what a hash map is in two sentences."],
}


def prompt_ids(model_name: str):
    tok = sj.load_tokenizer(model_name)
    if model_name == "tiny":
        return tok, [tok.encode(p) for p in PROMPTS[model_name]]
    return tok, [tok.chat([{"role": "user", "content": p}]) for p in PROMPTS[model_name]]


def registered():
    """The named drafters of the method registry: their names, and make(name, target)."""
    from specjax.methods import METHODS, make
    return [m.name for m in METHODS.values() if m.runner == "drafter" and not m.argument], make


def fingerprint(model_name: str, names, max_new_tokens: int, drafters=registered,
                tau=lambda stats: stats.tau) -> dict:
    """`drafters()` gives the names and their factory, `tau(stats)` reads tau from the stats
    (both differ in a checkout from before the method registry: benchmarks/house-refactor/)."""
    model = sj.load(model_name)
    tok, prompts = prompt_ids(model_name)
    eos = getattr(tok, "eos_token_ids", None)
    all_names, make = drafters()
    result = {}
    for name in names or all_names:
        try:  # a drafter with nothing shipped for this target fails in make or in generate's check
            out = sj.generate(model, prompts, max_new_tokens=max_new_tokens, drafter=make(name, model),
                              eos_token_id=eos)
        except Exception as e:
            result[name] = {"skipped": f"{type(e).__name__}: {e}"}
            print(f"{name:16s} skipped: {result[name]['skipped']}", flush=True)
            continue
        tokens = [out.tokens[i][: out.num_tokens[i]].tolist() for i in range(len(prompts))]
        result[name] = {"sha256": hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16],
                        "tau": round(float(tau(out.stats)), 4), "tokens": tokens}
        print(f"{name:16s} {result[name]['sha256']} tau {result[name]['tau']}", flush=True)
    return result


def compare(now: dict, before: dict) -> int:
    bad = 0
    for name, old in before.items():
        new = now.get(name)
        if new is None or ("skipped" in old and "skipped" in new):
            continue
        if ("skipped" in old) != ("skipped" in new):
            bad += 1
            print(f"DIFF {name}: {old.get('skipped', 'ran')} -> {new.get('skipped', 'ran')}")
            continue
        if new["tokens"] != old["tokens"]:
            bad += 1
            for row, (a, b) in enumerate(zip(old["tokens"], new["tokens"])):
                if a != b:
                    step = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                    print(f"DIFF {name}: row {row} first differs at token {step}")
        elif abs(new["tau"] - old["tau"]) > 1e-6:
            bad += 1
            print(f"DIFF {name}: tau {old['tau']} -> {new['tau']}")
    print("identical" if not bad else f"{bad} drafter(s) differ")
    return int(bad > 0)


def main(**fingerprint_settings):
    """The command line; `fingerprint_settings` go to `fingerprint` (drafters=, tau=)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny", help="tiny or smollm2")
    p.add_argument("--drafters", nargs="*", help="named drafters (default: all)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--out", help="write the fingerprint JSON here")
    p.add_argument("--compare", help="a fingerprint JSON to compare with")
    args = p.parse_args()
    now = fingerprint(args.model, args.drafters, args.max_new_tokens, **fingerprint_settings)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(now, f)
    if args.compare:
        with open(args.compare) as f:
            sys.exit(compare(now, json.load(f)))


if __name__ == "__main__":
    main()
