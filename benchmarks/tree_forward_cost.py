"""Cost of one tiny-target forward over N = 1, 4, 9, 16 new tokens after 200 cached ones, at
batch 1 and 8: the cost of a verify pass next to an AR step. Each timing is a compiled loop of
50 forwards (as the decode loop runs them, with no per-call dispatch in the figure); the least
of 15 timings, since interference on a shared machine only adds time.
python benchmarks/tree_forward_cost.py"""
import time

import jax
import jax.numpy as jnp

import specjax as sj
from specjax.models import KVCache, forward

LOOP = 50
target = sj.load("tiny")
cfg = target.config
for b in (1, 8):
    cache = KVCache.init(cfg, b, 512)._replace(lengths=jnp.full((b,), 200, jnp.int32))
    res = {}
    for n in (1, 4, 9, 16):
        @jax.jit
        def loop(params, cache, n=n):
            mask = jnp.tril(jnp.ones((b, n, n), bool))
            pos = cache.lengths[:, None] + jnp.arange(n)[None]

            def body(i, acc):  # the tokens depend on i, so no forward is hoisted out of the loop
                tokens = jnp.full((b, n), i, jnp.int32)
                out = forward(cfg, params, tokens, positions=pos, cache=cache, tree_mask=mask)
                return acc + out.logits[0, 0, 0]
            return jax.lax.fori_loop(0, LOOP, body, 0.0)
        loop(target.params, cache).block_until_ready()
        ts = []
        for _ in range(15):
            t0 = time.perf_counter()
            loop(target.params, cache).block_until_ready()
            ts.append((time.perf_counter() - t0) / LOOP)
        res[n] = min(ts)
    print("batch", b, {n: f"{1e3 * v:.2f} ms ({v / res[1]:.2f}x)" for n, v in res.items()}, flush=True)
