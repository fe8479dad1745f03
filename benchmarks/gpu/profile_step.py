"""Where one target forward's time goes: a profiler trace of the compiled forward loop of
step_cost.py (a 1B- or 8B-shaped model with random weights, N new tokens after 512 cached),
summed per op name, largest first. On a GPU the device's kernels are in the trace, so a weight
copied out of its layer stack before a matmul shows up as a copy or dynamic-slice fusion next to
the GEMMs.

    python benchmarks/gpu/profile_step.py --shape 1b --tokens 1 4 --out DIR   # profile_step.md
    python benchmarks/gpu/profile_step.py --shape smoke                       # any backend
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp

import specjax as sj
from specjax.layout import kernel_layout
from specjax.models import KVCache, ModelConfig, forward

from step_cost import CACHED, SHAPES


def op_times(trace_dir: Path) -> collections.Counter:
    """Microseconds per op name over every complete event of the newest trace in trace_dir: the
    device's own (its processes are named `/device:...`) when the trace has any, else every one
    but Python's frames (named `$file:line`)."""
    path = max(trace_dir.rglob("*.trace.json.gz"), key=lambda p: p.stat().st_mtime)
    events = json.load(gzip.open(path))["traceEvents"]
    devices = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
               and str(e.get("args", {}).get("name", "")).startswith("/device:")}
    totals = collections.Counter()
    for event in events:
        if event.get("ph") == "X" and not event["name"].startswith("$") and (not devices or event["pid"] in devices):
            totals[event["name"]] += event.get("dur", 0)
    return totals


def profile(model, n: int, loop: int, top: int) -> list[str]:
    cfg = model.config
    cache = KVCache.init(cfg, 1, CACHED + n)._replace(lengths=jnp.full((1,), CACHED, jnp.int32))

    @jax.jit
    def run(params, cache):
        def body(i, acc):
            out = forward(cfg, params, jnp.full((1, n), i, jnp.int32), cache=cache)
            return acc + out.logits.max()
        return jax.lax.fori_loop(0, loop, body, 0.0)

    run(model.params, cache).block_until_ready()  # compile outside the trace
    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder):
            run(model.params, cache).block_until_ready()
        totals = op_times(Path(folder))
    lines = [f"### N = {n}: the {top} largest ops, per forward", "", "| us | op |", "|---|---|"]
    lines += [f"| {us / loop:.1f} | `{name[:90]}` |" for name, us in totals.most_common(top)]
    return lines + [""]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="1b", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "int4"])
    ap.add_argument("--tokens", nargs="+", type=int, default=[1, 4])
    ap.add_argument("--loop", type=int, default=5, help="forwards per traced loop")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", default=None, help="folder for profile_step.md")
    args = ap.parse_args()
    config = ModelConfig(model_type="llama", max_position_embeddings=8192, dtype="bfloat16", **SHAPES[args.shape])
    model = sj.Model.init(config, jax.random.key(0))
    if args.dtype == "int4":
        model = sj.quantize(model, "int4")
    model = sj.Model(kernel_layout(model.params), config)  # as sj.load lays it out
    dev = jax.devices()[0]
    lines = [f"# {args.shape} {args.dtype} forward on {dev.device_kind} ({jax.default_backend()}), jax "
             f"{jax.__version__}, {CACHED} cached tokens", ""]
    for n in args.tokens:
        lines += profile(model, n, args.loop, args.top)
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "profile_step.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
