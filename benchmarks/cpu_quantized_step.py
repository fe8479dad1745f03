"""The decode step of SmolLM2 in float32, int8 and int4 (quantized by specjax; the tied head an
int8 copy), with the CPU kernels and with XLA's code, each in its own process, interleaved:
forwards over 1, 4 and 8 new tokens at batch 1 (a step and verify passes), and a batch-8 step
(its tokens/s is batch-8 AR's decode throughput, prefill aside).

    python benchmarks/cpu_quantized_step.py --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from specjax.bench.report import cpu

DTYPES = ("float32", "int8", "int4")
SHAPES = ((1, 1), (1, 4), (1, 8), (8, 1))  # (batch, new tokens)
NAMES = {"1x1": "step", "1x4": "4 tokens", "1x8": "8 tokens", "8x1": "batch-8 step"}  # their table columns


def measure(dtype: str) -> dict:
    import specjax as sj
    from specjax.bench.forward_cost import forward_seconds

    model = sj.load("smollm2")
    if dtype != "float32":
        model = sj.quantize(model, dtype)
    return {f"{b}x{n}": forward_seconds(model, b, n, cached=200, cache_len=256, loop=8, reps=3)
            for b, n in SHAPES}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(args.child)))
        return
    best = {}
    for _ in range(args.repeats):
        for kernels in ("1", "0"):
            for dtype in DTYPES:
                env = {**os.environ, "SPECJAX_CPU_KERNELS": kernels}
                done = subprocess.run([sys.executable, __file__, "--child", dtype], env=env,
                                      capture_output=True, text=True)
                if done.returncode:
                    sys.exit(done.stderr[-3000:])
                for n, sec in json.loads(done.stdout.strip().splitlines()[-1]).items():
                    key = (kernels, dtype, n)
                    best[key] = min(sec, best.get(key, float("inf")))
    print(f"SmolLM2 forward, 200 cached; host: {cpu()}, {os.cpu_count()} cores; "
          f"least of {args.repeats} interleaved runs; ms\n")
    print("| weights | " + " | ".join(f"{NAMES[s]}, kernels | XLA" for s in NAMES)
          + " | step vs f32, kernels | batch-8 tokens/s, kernels / XLA f32 |")
    print("|---|" + "---|---|" * len(NAMES) + "---|---|")
    for dtype in DTYPES:
        cells = " | ".join(f"{best[('1', dtype, s)]*1e3:.1f} | {best[('0', dtype, s)]*1e3:.1f}" for s in NAMES)
        speed = best[("1", "float32", "1x1")] / best[("1", dtype, "1x1")]
        batch8 = best[("0", "float32", "8x1")] / best[("1", dtype, "8x1")]
        print(f"| {dtype} | {cells} | {speed:.2f}x | {batch8:.2f}x |")


if __name__ == "__main__":
    main()
