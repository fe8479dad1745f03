"""A head's own KV cache over the target's features (EAGLE's draft layer, Clover's Augmenting
Block): entry j reads the target's feature at position j and the token j+1, so the entry that
reads the root (token length-1) is `root_entry(length)` = length-2, and its features come only
once the target has verified them.

The drafter hands in its head's step as `run(feats [B,T,E], tokens int[B,T], positions int[B,T],
mask bool[B,T,T], cache) -> (out [B,T,E], cache with the T entries written at its lengths)`.
`start` commits the prompt's entries; each `catch_up` commits the entries verified since (the
accepted path's features, which the drafter's `update` gathers with `row_gather(x,
verdict.path)`) and returns the root's output, where the tree grows from.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from specjax.models import KVCache
from specjax.tree import row_gather

Run = Callable[[jax.Array, jax.Array, jax.Array, jax.Array, KVCache], tuple[jax.Array, KVCache]]


class FeatureCacheState(NamedTuple):
    """The state of a head drafter with a feature cache (EAGLE, Clover): the head's `cache`
    and the pending features [B, W, E] that the next `catch_up` commits, the root's first."""

    cache: KVCache
    feats: jax.Array


def root_entry(length: jax.Array) -> jax.Array:
    """The cache entry that reads the root: the feature at position length-2 and the root token."""
    return length - 2


def causal(batch: int, t: int) -> jax.Array:
    return jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (batch, t, t))


def last_feature(feats: jax.Array, lengths: jax.Array) -> jax.Array:
    """The prompt's feature at the root entry, [B, E] (0 for one-token prompts); feats
    [B, T-1, E] at positions 0..T-2."""
    e = root_entry(lengths)
    f = row_gather(feats, jnp.maximum(e, 0))
    return jnp.where((e >= 0)[:, None], f, 0.0)


def start(run: Run, cache: KVCache, pending: tuple[int, int], feats: jax.Array | None,
          prompts: jax.Array, lengths: jax.Array) -> FeatureCacheState:
    """A head drafter's state after the prompt: the cache with entries
    0..length-3, (f_j, x_{j+1}), of the prompt's features feats [B, T-1, E] committed (None:
    nothing to commit, one-token prompts), and the pending features [B, W, E] (`pending` = (W,
    E)), the root's first."""
    b = prompts.shape[0]
    pending = jnp.zeros((b, *pending), jnp.float32)
    if feats is None:
        return FeatureCacheState(cache, pending)
    t = feats.shape[1]
    if t > 1:
        pos = jnp.broadcast_to(jnp.arange(t - 1, dtype=jnp.int32), (b, t - 1))
        _, cache = run(feats[:, :-1], prompts[:, 1:t], pos, causal(b, t - 1), cache)
    cache = cache._replace(lengths=jnp.maximum(root_entry(lengths), 0))
    return FeatureCacheState(cache, pending.at[:, 0].set(last_feature(feats, lengths)))


def catch_up(run: Run, cache: KVCache, pending: jax.Array, tokens: jax.Array,
             length: jax.Array) -> tuple[KVCache, jax.Array]:
    """Commit entries [cache.lengths, length - 1) from the pending features [B, W, E] (the last
    step's accepted path) and the committed tokens int32[B, S]; returns the cache and the
    root's output [B, 1, E]."""
    b, width = pending.shape[:2]
    dc = cache.lengths
    pos = dc[:, None] + jnp.arange(width, dtype=jnp.int32)[None, :]
    tok = jnp.take_along_axis(tokens, jnp.minimum(pos + 1, tokens.shape[1] - 1), axis=1)
    h, cache = run(pending, tok, pos, causal(b, width), cache)
    r = jnp.clip(root_entry(length) - dc, 0, width - 1)
    h_root = row_gather(h, r[:, None])
    return cache._replace(lengths=jnp.maximum(length - 1, 0)), h_root

