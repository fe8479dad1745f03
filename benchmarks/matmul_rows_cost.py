"""What XLA makes of a weight-read-bound matmul as the rows grow: x [N, K] @ w for N = 1, 2, 4, 8,
16, with the shapes of a model's decoder layers (a scanned stack, as the forward runs them) and
of its LM head (x @ embed.T, tied). A batch-1 decode step is N = 1; a verify pass over N tree
nodes is N rows. Reading the weights costs the same for every N, so an ideal kernel would cost
about the same until the FMAs catch up with the memory; the table shows how far XLA:CPU's
dot is from that (ms, x the N = 1 cost, and the weight bytes read per second).

    python benchmarks/matmul_rows_cost.py                     # SmolLM2-135M's shapes
    python benchmarks/matmul_rows_cost.py --hidden 2048 --ffn 8192 --layers 4 --vocab 32000
"""
import argparse

import jax
import jax.numpy as jnp

from specjax.bench.forward_cost import loop_seconds

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--hidden", type=int, default=576)
ap.add_argument("--ffn", type=int, default=1536)
ap.add_argument("--layers", type=int, default=30)
ap.add_argument("--vocab", type=int, default=49152)
ap.add_argument("--n", type=int, nargs="+", default=[1, 2, 4, 8, 16])
ap.add_argument("--loop", type=int, default=10)
ap.add_argument("--reps", type=int, default=7)
args = ap.parse_args()

key = jax.random.key(0)
e, f = args.hidden, args.ffn
stack = 0.02 * jax.random.normal(key, (args.layers, e, f))  # one [K, N] matmul a layer: the FFN's up
embed = 0.02 * jax.random.normal(key, (args.vocab, e))


def layers(x, w):  # the output feeds the next layer, so no layer is skipped
    return jax.lax.scan(lambda x, w: (x + 1e-3 * (x @ w)[:, :e], None), x, w)[0]


def head(x, w):  # every logit is reduced, as verification reads them all
    return x + 1e-6 * jnp.einsum("nk,vk->nv", x, w).max()


print(f"x [N, {e}] @ w, float32, least of {args.reps} loops of {args.loop}: ms (x N = 1) and GB/s of weights read\n")
print(f"| N | {args.layers} x [{e}, {f}] ({stack.nbytes / 1e6:.0f} MB) | LM head [{e}, {args.vocab}] "
      f"({embed.nbytes / 1e6:.0f} MB) |")
print("|---|---|---|")
base = {}
for n in args.n:
    x = jax.random.normal(key, (n, e))
    cells = []
    for name, fn, w in (("layers", layers, stack), ("head", head, embed)):
        run = jax.jit(lambda x, w, fn=fn: jax.lax.fori_loop(0, args.loop, lambda i, x: fn(x, w), x))
        s = loop_seconds(run, x, w, loop=args.loop, reps=args.reps)
        base.setdefault(name, s)
        cells.append(f"{1e3 * s:.2f} ({s / base[name]:.2f}x, {w.nbytes / s / 1e9:.0f} GB/s)")
    print(f"| {n} | " + " | ".join(cells) + " |", flush=True)
