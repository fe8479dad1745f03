"""Cost of verification against the cost of the target forward it follows.

Times each acceptance rule on a 64-node draft tree (B=8, V=32000) and one tree forward (64 tree
tokens per row, B=8, after a KV cache of 256 committed tokens) of two random-weight Llama-shaped
models: a ~7M-parameter one (vocab 4096) and a 1B-shaped one (vocab 32000). The 1B forward is
timed with 1 and 2 layers and extrapolated linearly to all 16 (`--full-1b` runs all of them).

    nice -n 10 python benchmarks/verify_cost.py
"""

from __future__ import annotations

import argparse
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

import specjax.verify as sv
from specjax.models import KVCache, Model, ModelConfig, forward
from specjax.tree import DraftTree, chain

B, N, V, PREFIX = 8, 64, 32000, 256
TREE_PARENTS = np.array([-1] + [(i - 1) // 2 for i in range(1, N)])  # binary tree, depth 6
RULES = [sv.Greedy(), sv.SpeculativeSampling(), sv.SpecInfer(), sv.RSD(), sv.SpecTr(), sv.TopK(),
         sv.Typical()]


def timeit(fn, *args, reps: int) -> float:
    """Fastest wall seconds of fn(*args) over `reps` calls after a warm-up (compile) call; the
    minimum is the most stable statistic on a shared machine."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return min(times)


def verify_times(reps: int) -> dict[str, float]:
    k1, k2, k3, k4 = jax.random.split(jax.random.PRNGKey(0), 4)
    tokens = jax.random.randint(k1, (B, N), 0, V)
    q = jax.nn.softmax(3.0 * jax.random.normal(k2, (B, N, V)), axis=-1)
    p = jax.nn.softmax(3.0 * jax.random.normal(k3, (B, N, V)), axis=-1)
    tree = DraftTree.build(tokens, TREE_PARENTS, q)
    out = {}
    for rule in RULES:
        t = chain(tokens, q) if isinstance(rule, sv.SpeculativeSampling) else tree
        out[type(rule).__name__] = timeit(jax.jit(rule), t, p, k4, reps=reps)
    return out


def forward_time(config: ModelConfig, reps: int) -> float:
    model = Model.init(config, jax.random.PRNGKey(1))
    cache = KVCache.init(config, B, PREFIX + N)
    cache = cache._replace(lengths=jnp.full((B,), PREFIX, jnp.int32))
    tree = DraftTree.build(jnp.zeros((B, N), jnp.int32), TREE_PARENTS)
    step = jax.jit(lambda params, tokens, cache: forward(
        config, params, tokens, positions=tree.positions(cache.lengths), cache=cache,
        tree_mask=tree.ancestors))
    return timeit(step, model.params, tree.tokens, cache, reps=reps)


def llama(vocab, hidden, layers, heads, kv_heads, ffn) -> ModelConfig:
    return ModelConfig(model_type="llama", vocab_size=vocab, hidden_size=hidden,
                       intermediate_size=ffn, num_layers=layers, num_heads=heads,
                       num_kv_heads=kv_heads, head_dim=hidden // heads,
                       max_position_embeddings=4096)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--full-1b", action="store_true", help="time all 16 layers of the 1B shape")
    args = ap.parse_args()

    small = llama(4096, 256, 6, 4, 2, 704)
    big = lambda layers: llama(32000, 2048, layers, 32, 8, 8192)
    t_small = forward_time(small, args.reps)
    if args.full_1b:
        t_big, big_note = forward_time(big(16), args.reps), "measured"
    else:
        t1, t2 = forward_time(big(1), args.reps), forward_time(big(2), args.reps)
        t_big, big_note = t1 + 15 * (t2 - t1), "1 and 2 layers timed, extrapolated to 16"
    verify = verify_times(args.reps)

    machine = platform.processor() or platform.machine()
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, {machine}")
    print(f"tree: B={B}, N={N} (binary, depth 6; SpeculativeSampling on a 64-node chain), V={V}")
    print(f"forward ~7M ({small.num_params / 1e6:.1f}M params, V=4096): {t_small * 1e3:.1f} ms")
    print(f"forward 1B-shaped ({big(16).num_params / 1e9:.2f}B params, {big_note}): "
          f"{t_big * 1e3:.0f} ms\n")
    print("| rule | verify (ms) | / ~7M forward | / 1B forward |")
    print("|---|---:|---:|---:|")
    for name, t in verify.items():
        print(f"| {name} | {t * 1e3:.2f} | {t / t_small:.3f} | {t / t_big:.4f} |")


if __name__ == "__main__":
    main()
