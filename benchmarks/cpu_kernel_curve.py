"""The forward-cost curve of SmolLM2 on this CPU, the kernels against XLA, side by side.

One forward over N new tokens (N = 1..32: an AR step and verify passes) with 200 tokens cached,
and an AR step against the allocated cache (64..2048 slots). Each implementation runs in its
own process (`SPECJAX_CPU_KERNELS=1` / `0`), the two interleaved `--repeats` times; each figure
is the least over repeats (interference on a shared machine only adds time). Prints a markdown
table headed by the host's CPU model and vector flags.

    python benchmarks/cpu_kernel_curve.py --repeats 3 > benchmarks/cpu-kernels/forward_curve.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from specjax.bench.report import cpu

NODES = (1, 2, 4, 8, 16, 32)
SLOTS = ((64, 48), (256, 48), (2048, 48), (256, 200), (512, 200), (1024, 200), (2048, 200))


def measure(model_name: str, dtype: str) -> dict:
    import specjax as sj
    from specjax.bench.forward_cost import forward_seconds

    model = sj.load(model_name)
    if dtype != "float32":
        model = sj.quantize(model, dtype)
    out = {}
    for n in NODES:
        out[f"n{n}"] = forward_seconds(model, 1, n, cached=200, cache_len=256, loop=8, reps=3)
    for slots, used in SLOTS:
        out[f"s{slots}u{used}"] = forward_seconds(model, 1, 1, cached=used, cache_len=slots, loop=8, reps=3)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--dtype", default="float32", help="float32, int8 or int4 (quantized by specjax)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(args.model, args.dtype)))
        return
    best: dict[str, dict[str, float]] = {"1": {}, "0": {}}
    for _ in range(args.repeats):
        for kernels in ("1", "0"):
            env = {**os.environ, "SPECJAX_CPU_KERNELS": kernels}
            done = subprocess.run([sys.executable, __file__, "--child", "--model", args.model,
                                   "--dtype", args.dtype], env=env, capture_output=True, text=True)
            if done.returncode:
                sys.exit(done.stderr[-3000:])
            for key, sec in json.loads(done.stdout.strip().splitlines()[-1]).items():
                best[kernels][key] = min(sec, best[kernels].get(key, float("inf")))
    k, x = best["1"], best["0"]
    print(f"{args.model} {args.dtype}, batch 1; host: {cpu()}, {os.cpu_count()} cores; least of {args.repeats} interleaved runs\n")
    print("| forward | kernels ms | XLA ms | XLA / kernels | kernels vs their 1-token step |")
    print("|---|---|---|---|---|")
    for n in NODES:
        key = f"n{n}"
        print(f"| {n} new tokens, 200 cached, 256 slots | {k[key]*1e3:.1f} | {x[key]*1e3:.1f} | "
              f"{x[key]/k[key]:.2f}x | {k[key]/k['n1']:.2f} |")
    for slots, used in SLOTS:
        key = f"s{slots}u{used}"
        print(f"| 1 new token, {used} cached, {slots} slots | {k[key]*1e3:.1f} | {x[key]*1e3:.1f} | "
              f"{x[key]/k[key]:.2f}x | {k[key]/k['n1']:.2f} |")


if __name__ == "__main__":
    main()
