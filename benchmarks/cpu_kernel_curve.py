"""The forward-cost curve of SmolLM2 on this CPU, the kernels against XLA, side by side.

One forward over N new tokens (N = 1..32: an AR step and verify passes) with 200 tokens cached,
and an AR step against the allocated cache (64..2048 slots). Each implementation runs in its
own process: the kernels with the weights as `sj.load` lays them out (column panels), the
kernels with the same weights row-major (`specjax.layout.portable_layout`), and XLA's code
(`SPECJAX_CPU_KERNELS=0`), interleaved `--repeats` times; each figure is the least over repeats
(interference on a shared machine only adds time). Prints a markdown table headed by the host's
CPU model and vector flags.

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


RUNS = {"kernels": ("1", False), "row-major": ("1", True), "xla": ("0", False)}


def measure(model_name: str, dtype: str, row_major: bool) -> dict:
    import specjax as sj
    from specjax.bench.forward_cost import forward_seconds
    from specjax.layout import portable_layout

    model = sj.load(model_name)
    if dtype != "float32":
        model = sj.quantize(model, dtype)
    if row_major:
        model = sj.Model(portable_layout(model.params), model.config)
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
    p.add_argument("--child", choices=RUNS, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(args.model, args.dtype, RUNS[args.child][1])))
        return
    best: dict[str, dict[str, float]] = {run: {} for run in RUNS}
    for _ in range(args.repeats):
        for run, (kernels, _) in RUNS.items():
            env = {**os.environ, "SPECJAX_CPU_KERNELS": kernels}
            done = subprocess.run([sys.executable, __file__, "--child", run, "--model", args.model,
                                   "--dtype", args.dtype], env=env, capture_output=True, text=True)
            if done.returncode:
                sys.exit(done.stderr[-3000:])
            for key, sec in json.loads(done.stdout.strip().splitlines()[-1]).items():
                best[run][key] = min(sec, best[run].get(key, float("inf")))
    k, r, x = best["kernels"], best["row-major"], best["xla"]
    print(f"{args.model} {args.dtype}, batch 1; host: {cpu()}, {os.cpu_count()} cores; least of {args.repeats} interleaved runs\n")
    print("| forward | kernels ms | kernels, row-major weights ms | XLA ms | row-major / kernels | "
          "XLA / kernels | kernels vs their 1-token step |")
    print("|---|---|---|---|---|---|---|")
    rows = [(f"n{n}", f"{n} new tokens, 200 cached, 256 slots") for n in NODES]
    rows += [(f"s{slots}u{used}", f"1 new token, {used} cached, {slots} slots") for slots, used in SLOTS]
    for key, label in rows:
        print(f"| {label} | {k[key]*1e3:.1f} | {r[key]*1e3:.1f} | {x[key]*1e3:.1f} | {r[key]/k[key]:.2f}x | "
              f"{x[key]/k[key]:.2f}x | {k[key]/k['n1']:.2f} |")


if __name__ == "__main__":
    main()
