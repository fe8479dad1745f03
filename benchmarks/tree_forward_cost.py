"""Median time of one tiny-target forward over N = 1, 8, 16 new tokens after 200 cached ones,
at batch 1 and 8 (the cost of a verify pass next to an AR step). python benchmarks/tree_forward_cost.py"""
import time, jax, jax.numpy as jnp, numpy as np, specjax as sj
from specjax.models import KVCache, forward
t = sj.load("tiny")
cfg = t.config
for b in (1, 8):
    cache = KVCache.init(cfg, b, 512)._replace(lengths=jnp.full((b,), 200, jnp.int32))
    res = {}
    for n in (1, 8, 16):
        f = jax.jit(lambda p, tok, c: forward(cfg, p, tok, cache=c).logits)
        tok = jnp.zeros((b, n), jnp.int32)
        f(t.params, tok, cache).block_until_ready()
        ts = []
        for _ in range(30):
            t0 = time.perf_counter(); f(t.params, tok, cache).block_until_ready(); ts.append(time.perf_counter() - t0)
        res[n] = np.median(ts)
    print("batch", b, {n: f"{1e3*v:.2f} ms ({v/res[1]:.2f}x)" for n, v in res.items()})
