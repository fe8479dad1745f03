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


def fingerprint(model_name: str, names, max_new_tokens: int) -> dict:
    from specjax.methods import METHODS, make

    model = sj.load(model_name)
    tok, prompts = prompt_ids(model_name)
    eos = getattr(tok, "eos_token_ids", None)
    result = {}
    for name in names or [m.name for m in METHODS.values() if m.runner == "drafter" and not m.argument]:
        try:
            drafter = make(name, model)
        except Exception as e:  # a drafter with nothing shipped for this target
            result[name] = {"skipped": f"{type(e).__name__}: {e}"}
            continue
        out = sj.generate(model, prompts, max_new_tokens=max_new_tokens, drafter=drafter,
                          eos_token_id=eos)
        tokens = [out.tokens[i][: out.num_tokens[i]].tolist() for i in range(len(prompts))]
        result[name] = {"sha256": hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16],
                        "tau": round(float(out.stats.tau), 4), "tokens": tokens}
        print(f"{name:16s} {result[name]['sha256']} tau {result[name]['tau']}", flush=True)
    return result


def compare(now: dict, before: dict) -> int:
    bad = 0
    for name, old in before.items():
        new = now.get(name)
        if new is None or "skipped" in old or "skipped" in new:
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


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny", help="tiny or smollm2")
    p.add_argument("--drafters", nargs="*", help="named drafters (default: all)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--out", help="write the fingerprint JSON here")
    p.add_argument("--compare", help="a fingerprint JSON to compare with")
    args = p.parse_args()
    now = fingerprint(args.model, args.drafters, args.max_new_tokens)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(now, f)
    if args.compare:
        with open(args.compare) as f:
            sys.exit(compare(now, json.load(f)))


if __name__ == "__main__":
    main()
