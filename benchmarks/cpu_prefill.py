"""What a prompt's prefill costs: SmolLM2's `sj.generate` of one new token after a prompt of N
tokens (random ids), batch 1, greedy; seconds, the least of `--reps` calls after a compiling
one, and the width the prompt compiled at (`specjax.decoding.prompt_bucket`). One JSON line a
length to `--out` as well, for runs of two trees interleaved side by side.

    python benchmarks/cpu_prefill.py --lengths 500 1000 2000 2181 4000 6000 --out prefill.jsonl
"""
import argparse
import json
import time

import numpy as np

import specjax as sj
from specjax import decoding
from specjax.bench.report import machine

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--model", default="smollm2")
ap.add_argument("--lengths", type=int, nargs="+", default=[500, 1000, 2000, 2181, 4000, 6000])
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--out", default=None, help="append one JSON line a length here")
ap.add_argument("--label", default="", help="a name for this tree in --out")
args = ap.parse_args()

model = sj.load(args.model)
print(machine())
print(f"\n| prompt tokens | compiled width | prefill + 1 token (s) |\n|---|---|---|")
for n in args.lengths:
    ids = np.random.default_rng(n).integers(100, model.config.vocab_size - 100, n).tolist()
    call = lambda: sj.generate(model, [ids], max_new_tokens=1)
    call()  # compiles
    best = float("inf")
    for _ in range(args.reps):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    width = decoding.prompt_bucket(n)
    print(f"| {n} | {width} | {best:.2f} |", flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps({"label": args.label, "tokens": n, "width": width, "seconds": best}) + "\n")
