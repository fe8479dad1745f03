"""The CPU kernels built for AVX2 against this host's own (AVX-512) build, on SmolLM2's decode
step: forwards over 1, 4 and 8 new tokens at batch 1 and a batch-8 step, in float32, int8 and
int4, each build in its own process (`SPECJAX_CPU_KERNEL_FLAGS=-mno-avx512f` for AVX2),
interleaved, least of the repeats. On an AVX-512 host this times the code an AVX2-only host
runs, on the same cores and memory.

    python benchmarks/cpu_kernel_isa.py --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from cpu_quantized_step import DTYPES, NAMES, measure  # the same forwards, timed the same way
from specjax.bench.report import cpu

BUILDS = {"AVX-512 (native)": "", "AVX2": "-mno-avx512f"}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps({f"{dtype} {shape}": sec for dtype in DTYPES for shape, sec in measure(dtype).items()}))
        return
    best = {}
    for _ in range(args.repeats):
        for build, flags in BUILDS.items():
            env = {**os.environ, "SPECJAX_CPU_KERNEL_FLAGS": flags}
            done = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True)
            if done.returncode:
                sys.exit(done.stderr[-3000:])
            for key, sec in json.loads(done.stdout.strip().splitlines()[-1]).items():
                best[build, key] = min(sec, best.get((build, key), float("inf")))
    print(f"SmolLM2 forward, 200 cached, CPU kernels; host: {cpu()}, {os.cpu_count()} cores; "
          f"least of {args.repeats} interleaved runs; ms (x the same build's float32 step)\n")
    print("| weights | build | " + " | ".join(NAMES.values()) + " |")
    print("|---|---|" + "---|" * len(NAMES))
    for dtype in DTYPES:
        for build in BUILDS:
            step = best[build, "float32 1x1"]
            cells = [f"{1e3 * best[build, f'{dtype} {s}']:.1f} ({best[build, f'{dtype} {s}'] / step:.2f}x)"
                     for s in NAMES]
            print(f"| {dtype} | {build} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
