"""The cost of one target forward over N new tokens, timed the way the decode loop runs it: a
compiled loop of forwards, so no per-call dispatch is in the figure. N = 1 is an AR step; a
verify pass over N tree nodes costs about a forward over N tokens. `head_rows` times the same
forward with no LM head (0) or a head over the first k vocabulary rows (a reduced draft
vocabulary): with Gemma 3's 262,144 rows the LM head is the largest matmul."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

from specjax.models import KVCache, Model, forward, lm_head_weight
from specjax.models.llama import dense


def forward_seconds(model: Model, batch: int, n: int, *, cached: int, cache_len: int, loop: int,
                    reps: int, head_rows: int | None = None) -> float:
    """Seconds per forward over n new tokens (causal among themselves) at this batch, after
    `cached` tokens in a cache of `cache_len` slots: the least of `reps` timed loops of `loop`
    forwards, after a compiling one (interference on a shared machine only adds time)."""
    cfg = model.config
    head = lm_head_weight(cfg, model.params)
    if head_rows is not None and not isinstance(head, jax.Array):
        raise ValueError("head_rows needs a float LM head (this model's is quantized)")
    cache = KVCache.init(cfg, batch, cache_len)._replace(lengths=jnp.full((batch,), cached, jnp.int32))

    @jax.jit
    def run(params, cache):
        mask = jnp.tril(jnp.ones((batch, n, n), bool))
        pos = cache.lengths[:, None] + jnp.arange(n)[None]

        def body(i, acc):  # the tokens depend on i, so no forward is hoisted out of the loop
            out = forward(cfg, params, jnp.full((batch, n), i, jnp.int32), positions=pos, cache=cache,
                          tree_mask=mask, compute_logits=head_rows is None)
            # every output is reduced, as verification reads every logit: XLA would otherwise
            # compute only the elements used (a slice of a dot is a dot of slices)
            if head_rows is None:
                return acc + out.logits.max()
            w = lm_head_weight(cfg, params)[:, :head_rows].astype(out.hidden.dtype)
            return acc + (dense(out.hidden, w, out_dtype=jnp.float32).max() if head_rows else out.hidden.astype(jnp.float32).max())
        return jax.lax.fori_loop(0, loop, body, 0.0)

    return loop_seconds(run, model.params, cache, loop=loop, reps=reps)


def loop_seconds(run, *args, loop: int, reps: int) -> float:
    """Seconds per iteration of `run(*args)`, a compiled loop of `loop` iterations: the least of
    `reps` timed calls after a compiling one."""
    run(*args).block_until_ready()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        run(*args).block_until_ready()
        best = min(best, (time.perf_counter() - t0) / loop)
    return best
