"""Verify-step cost against AR-step cost: one target forward over N new tokens (a verify pass
over N tree nodes; N = 1 is an AR step) after 512 cached ones, for 1B- and 8B-shaped Llama
models with random weights, in bf16 and int4 (weight-only, group 128, the Pallas kernel), at
batch 1, 4, 16 and 64. Each time is a compiled loop of forwards, as the decode loop runs them
(no dispatch in the figure), the least of `--reps`, with the weights as `sj.load` lays them out
(on a GPU: one buffer per layer) and, with `--layouts loaded stacked`, stacked and scanned.
Next to the AR step: the time to read the weights once at the device's HBM bandwidth, the floor
of a batch-1 step.

    python benchmarks/gpu/step_cost.py --out DIR     # on a GPU (run_all.sh runs it)
    python benchmarks/gpu/step_cost.py --smoke       # a tiny shape, any backend: does it run
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import jax

import specjax as sj
from specjax.bench.forward_cost import forward_seconds
from specjax.layout import kernel_layout
from specjax.models import ModelConfig

CACHED = 512
SHAPES = {  # Llama 3.2 1B and Llama 3.1 8B
    "1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32,
               num_kv_heads=8, head_dim=64, tie_word_embeddings=True),
    "8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
               num_kv_heads=8, head_dim=128),
    "smoke": dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=64),  # int4 needs K divisible by 256
}
HBM_BYTES_PER_S = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12}  # by device kind, SXM parts


def weight_bytes(model) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(model.params))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["1b", "8b"], choices=sorted(SHAPES))
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "int4"], choices=["bf16", "int4"])
    ap.add_argument("--batch", nargs="+", type=int, default=[1, 4, 16, 64])
    ap.add_argument("--tokens", nargs="+", type=int, default=[1, 4, 8, 16, 64], help="N new tokens per forward")
    ap.add_argument("--loop", type=int, default=10, help="forwards per timed loop")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=None, help="folder for step_cost.json / step_cost.md")
    ap.add_argument("--layouts", nargs="+", default=["loaded"], choices=["loaded", "stacked"],
                    help="the weights as sj.load lays them out (on a GPU: one buffer per layer) "
                         "and/or stacked [L, ...] and scanned")
    ap.add_argument("--smoke", action="store_true", help="the tiny shape at batch 1 and 4, N = 1 and 4")
    args = ap.parse_args()
    if args.smoke:
        args.shapes, args.batch, args.tokens, args.loop, args.reps = ["smoke"], [1, 4], [1, 4], 2, 1
    if 1 not in args.tokens:
        args.tokens = [1, *args.tokens]  # the AR step every ratio is taken against
    dev = jax.devices()[0]
    bandwidth = next((v for k, v in HBM_BYTES_PER_S.items() if k in dev.device_kind), None)
    rows, md = [], [f"Device: {dev.device_kind} ({jax.default_backend()}), jax {jax.__version__}; "
                    f"{CACHED} cached tokens; least of {args.reps} loops of {args.loop} forwards.", ""]
    for shape in args.shapes:
        config = ModelConfig(model_type="llama", max_position_embeddings=8192, dtype="bfloat16", **SHAPES[shape])
        model = sj.Model.init(config, jax.random.key(0))
        for dtype, layout in itertools.product(args.dtypes, args.layouts):
            m = sj.quantize(model, "int4") if dtype == "int4" else model
            if layout == "loaded":
                m = sj.Model(kernel_layout(m.params), m.config)
            size = weight_bytes(m)
            floor = f", weight-read floor {1e3 * size / bandwidth:.2f} ms" if bandwidth else ""
            md += [f"### {shape}, {dtype}, {layout} layout: {size / 2**30:.2f} GiB of weights{floor}", "",
                   "| batch | " + " | ".join(f"N={n}" for n in args.tokens) + " |",
                   "|---" * (len(args.tokens) + 1) + "|"]
            for b in args.batch:
                ms = {n: 1e3 * forward_seconds(m, b, n, cached=CACHED, cache_len=CACHED + n, loop=args.loop,
                                               reps=args.reps) for n in args.tokens}
                for n, t in ms.items():
                    rows.append(dict(shape=shape, dtype=dtype, layout=layout, batch=b, tokens=n, ms=round(t, 4),
                                     vs_ar=round(t / ms[1], 3), weight_bytes=size, device=dev.device_kind))
                md.append(f"| {b} | " + " | ".join(f"{t:.2f} ms ({t / ms[1]:.2f}x)" for t in ms.values()) + " |")
                print(md[-1], flush=True)
            md.append("")
            del m
        del model
    text = "\n".join(md)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "step_cost.json").write_text(json.dumps(rows, indent=1))
        (out / "step_cost.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
