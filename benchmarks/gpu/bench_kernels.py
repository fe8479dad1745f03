"""Time the Pallas kernels against the bytes they must read and against XLA.

Tree attention: prefix 4k-32k slots, N = 64 tree nodes, Llama-3-8B heads (32 query, 8 kv,
head_dim 128), bf16 — reported as achieved GB/s, % of the measured HBM bandwidth (a large
elementwise copy), and speedup over the XLA reference (pallas_kernels/tree_attention/reference.py).
Quantized matmul: int8 / int4 (group 128) weights, bf16 activations, M = 1-16, K, N in
4096-14336 — against the bf16 XLA matmul and the XLA dequantize-then-matmul reference.

Timing: compile, warm up, then the median over `repeats` of one compiled program of `inner`
chained calls (no Python dispatch in the figure).
`--cpu-smoke` runs tiny shapes with the kernels interpreted on CPU, to check the script.
Results go to OUT (or --out) as bench_kernels.json and bench_kernels.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import quantize
from pallas_kernels.quant_matmul import gpu as quant_gpu, reference as quant_reference
from pallas_kernels.tree_attention import gpu as tree_gpu, reference as tree_reference


def time_call(fn, *args, warmup: int, repeats: int, inner: int) -> float:
    """Median seconds per call of fn, timed as one compiled program of `inner` calls in a row, so
    that Python's dispatch (~40 us a call on an H200) is paid once per `inner` calls. Each call's
    first input depends on the previous call's whole output (its max, times zero), so XLA can
    neither merge nor hoist the calls, nor compute only the elements read."""
    def chained(*args):
        acc = jnp.float32(0)
        for _ in range(inner):
            out = fn(args[0] + (acc * 0).astype(args[0].dtype), *args[1:])
            acc = acc + jnp.max(jax.tree_util.tree_leaves(out)[0]).astype(jnp.float32)
        return acc

    return _median_seconds(jax.jit(chained), args, warmup, repeats) / inner


def _median_seconds(run, args, warmup: int, repeats: int) -> float:
    for _ in range(warmup + 1):
        jax.block_until_ready(run(*args))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(run(*args))
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def hbm_bandwidth(nbytes: int, timing: dict) -> float:
    """Measured bytes/s of an elementwise pass over `nbytes` (read + write), one call at a time
    (a pass over 1 GiB takes far longer than its dispatch)."""
    x = jnp.ones((nbytes // 4,), jnp.float32)
    seconds = _median_seconds(jax.jit(lambda a: a * 2.0), (x,), timing["warmup"], timing["repeats"])
    return 2 * nbytes / seconds


def nbytes(*arrays) -> int:
    return sum(a.size * a.dtype.itemsize for a in jax.tree_util.tree_leaves(arrays))


def best_config(make_fn, configs, args, timing):
    """(seconds, config) of the fastest kernel configuration; configs[0] is the default."""
    times = [time_call(make_fn(c), *args, **timing) for c in configs]
    i = int(np.argmin(times))
    return times[i], configs[i], times[0]


def bench_tree_attention(prefixes, cache_slots, shape, configs, interpret, timing, bandwidth,
                         rng):
    """One row per prefix length: the kernel (best of `configs`) vs the XLA reference, against
    the bytes it must read."""
    b, n, hq, kv, hd = shape
    rows = []
    for prefix, s in zip(prefixes, cache_slots):
        rand = lambda *sh: jnp.asarray(rng.standard_normal(sh, np.float32), jnp.bfloat16)
        q, k_tree, v_tree = rand(b, n, hq, hd), rand(b, n, kv, hd), rand(b, n, kv, hd)
        k_cache, v_cache = rand(b, s, kv, hd), rand(b, s, kv, hd)
        lengths = jnp.full((b,), prefix, jnp.int32)
        mask = jnp.broadcast_to(jnp.tril(jnp.ones((n, n), bool)), (b, n, n))
        args = (q, k_cache, v_cache, lengths, k_tree, v_tree, mask)
        make = lambda c: jax.jit(lambda *a: tree_gpu.tree_attention(*a, **c, interpret=interpret))
        reference = jax.jit(tree_reference.tree_attention)
        out, expected = make(configs[0])(*args), reference(*args)
        err = float(jnp.abs(out.astype(jnp.float32) - expected.astype(jnp.float32)).max())
        t_kernel, config, t_default = best_config(make, configs, args, timing)
        t_xla = time_call(reference, *args, **timing)
        must_read = 2 * b * prefix * kv * hd * 2 + nbytes(q, k_tree, v_tree, mask, out)
        rows.append(dict(prefix=prefix, cache_slots=s, batch=b, nodes=n, q_heads=hq, kv_heads=kv,
                         head_dim=hd, kernel_us=t_kernel * 1e6, config=config,
                         default_config_us=t_default * 1e6, xla_us=t_xla * 1e6,
                         speedup_vs_xla=t_xla / t_kernel, bytes=must_read,
                         kernel_gbps=must_read / t_kernel / 1e9,
                         pct_hbm=100 * must_read / t_kernel / bandwidth, max_abs_err=err))
        print(rows[-1], flush=True)
    return rows


def bench_quantized_matmul(ms, kns, formats, configs, interpret, timing, bandwidth, rng):
    """One row per (M, K, N, bits, act_bits): the kernel (best of `configs`) vs the bf16 XLA
    matmul and the XLA dequantize-then-matmul reference."""
    rows = []
    for k, n in kns:
        w = jnp.asarray(rng.standard_normal((k, n), np.float32) * 0.02)
        w_bf16 = w.astype(jnp.bfloat16)
        for bits, group_size, act_bits in formats:
            qw = quantize(w, bits, group_size)
            for m in ms:
                x = jnp.asarray(rng.standard_normal((m, k), np.float32), jnp.bfloat16)
                make = lambda c: jax.jit(lambda x, qw: quant_gpu.quantized_matmul(
                    x, qw, act_bits=act_bits, **c, interpret=interpret))
                reference = jax.jit(lambda x, qw: quant_reference.quantized_matmul(
                    x, qw, act_bits=act_bits))
                dense = jax.jit(lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.float32
                                                     ).astype(x.dtype))
                out, expected = make(configs[0])(x, qw), reference(x, qw)
                err = float(jnp.abs(out.astype(jnp.float32) - expected.astype(jnp.float32)).max())
                t_kernel, config, t_default = best_config(make, configs, (x, qw), timing)
                t_ref = time_call(reference, x, qw, **timing)
                t_bf16 = time_call(dense, x, w_bf16, **timing)
                must_read = nbytes(x, qw, out)
                rows.append(dict(m=m, k=k, n=n, bits=bits, group_size=group_size,
                                 act_bits=act_bits, kernel_us=t_kernel * 1e6, config=config,
                                 default_config_us=t_default * 1e6,
                                 xla_dequant_us=t_ref * 1e6, bf16_matmul_us=t_bf16 * 1e6,
                                 speedup_vs_bf16=t_bf16 / t_kernel,
                                 speedup_vs_xla_dequant=t_ref / t_kernel, bytes=must_read,
                                 kernel_gbps=must_read / t_kernel / 1e9,
                                 pct_hbm=100 * must_read / t_kernel / bandwidth,
                                 max_abs_err=err))
                print(rows[-1], flush=True)
    return rows


def markdown(results) -> str:
    lines = [f"# Kernel benchmarks — {results['device']} (jax {results['jax']}, "
             f"{results['date']})", "",
             f"Measured HBM bandwidth (elementwise copy): {results['hbm_gbps']:.0f} GB/s", ""]
    for title, key, cols in [
        ("Tree attention (bf16, N nodes vs a prefix)", "tree_attention",
         ["prefix", "cache_slots", "batch", "nodes", "q_heads", "kv_heads", "head_dim",
          "kernel_us", "default_config_us", "config", "xla_us", "speedup_vs_xla", "kernel_gbps",
          "pct_hbm", "max_abs_err"]),
        ("Quantized matmul (bf16 activations)", "quantized_matmul",
         ["m", "k", "n", "bits", "group_size", "act_bits", "kernel_us", "default_config_us",
          "config", "bf16_matmul_us",
          "xla_dequant_us", "speedup_vs_bf16", "speedup_vs_xla_dequant", "kernel_gbps",
          "pct_hbm", "max_abs_err"])]:
        lines += [f"## {title}", "", "| " + " | ".join(cols) + " |",
                  "|" + "---|" * len(cols)]
        for row in results[key]:
            cells = [f"{row[c]:.3g}" if isinstance(row[c], float) else str(row[c]) for c in cols]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="tiny shapes, kernels interpreted on CPU (checks the script)")
    parser.add_argument("--out", default=os.environ.get("OUT"), help="results folder ($OUT)")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    if args.cpu_smoke:
        timing = dict(warmup=1, repeats=args.repeats or 2, inner=2)
        interpret, hbm_bytes = True, 1 << 24
        tree = dict(prefixes=[40, 100], cache_slots=[64, 256], shape=(1, 4, 4, 2, 64),
                    configs=[{}, dict(block_k=32)])
        quant = dict(ms=[1, 16], kns=[(256, 128)], formats=[(8, 128, None), (4, 32, None),
                                                            (8, 128, 8)],
                     configs=[{}, dict(block_n=64)])
    else:
        if jax.default_backend() != "gpu":
            raise SystemExit(f"no GPU (backend {jax.default_backend()!r}); use --cpu-smoke")
        timing = dict(warmup=2, repeats=args.repeats or 10, inner=20)
        interpret, hbm_bytes = False, 1 << 30
        prefixes = [4096, 8192, 16384, 32768, 4096]
        tree = dict(prefixes=prefixes, cache_slots=[p + 128 for p in prefixes[:4]] + [32768],
                    shape=(1, 64, 32, 8, 128),
                    configs=[{}, dict(block_r=128, num_warps=8), dict(block_r=32),
                             dict(block_k=32), dict(block_k=128, num_warps=8)])
        quant = dict(ms=[1, 4, 8, 16], kns=[(4096, 4096), (4096, 14336), (14336, 4096)],
                     formats=[(8, 128, None), (4, 128, None), (8, 128, 8)],
                     configs=[{}, dict(block_n=64), dict(block_n=256, num_warps=8)])

    bandwidth = hbm_bandwidth(hbm_bytes, timing)
    results = dict(device=str(jax.devices()[0].device_kind), jax=jax.__version__,
                   date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   cpu_smoke=args.cpu_smoke, timing=timing, hbm_gbps=bandwidth / 1e9,
                   tree_attention=bench_tree_attention(**tree, interpret=interpret,
                                                       timing=timing, bandwidth=bandwidth,
                                                       rng=rng),
                   quantized_matmul=bench_quantized_matmul(**quant, interpret=interpret,
                                                           timing=timing, bandwidth=bandwidth,
                                                           rng=rng))
    report = markdown(results)
    print(report)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench_kernels.json"), "w") as f:
            json.dump(results, f, indent=1)
        with open(os.path.join(args.out, "bench_kernels.md"), "w") as f:
            f.write(report + "\n")


if __name__ == "__main__":
    main()
