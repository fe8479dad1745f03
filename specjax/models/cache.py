"""KVCache: per-layer keys and values with one committed length per row."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from specjax.models.config import ModelConfig


class KVCache(NamedTuple):
    """k, v: [L, B, S, KV, hd]; lengths: int32[B], the committed slots [0, lengths[b]) of row b.

    A forward with the cache writes its T new entries at slots [lengths, lengths + T) and leaves
    `lengths` alone: `advance` or `commit` decide what of them becomes part of the prefix.
    """

    k: jax.Array
    v: jax.Array
    lengths: jax.Array

    @classmethod
    def init(cls, config: ModelConfig, batch: int, max_len: int, dtype=None) -> "KVCache":
        shape = (config.num_layers, batch, max_len, config.num_kv_heads, config.head_dim)
        dtype = dtype or config.jnp_dtype
        # lengths behind a barrier: known zeros would let XLA constant-fold the attention over the
        # empty prefix of a prefill, which takes seconds of compile at batch 64
        lengths = jax.lax.optimization_barrier(jnp.zeros((batch,), jnp.int32))
        return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), lengths)

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def write(self, k_new: jax.Array, v_new: jax.Array) -> KVCache:
        """Write T new entries k_new, v_new [L, B, T, KV, hd] at slots [lengths, lengths + T) of
        each row (slots past the end are dropped; lengths unchanged)."""
        rows = jnp.arange(k_new.shape[1])[:, None]
        slots = self.lengths[:, None] + jnp.arange(k_new.shape[2])[None, :]
        put = lambda buf, new: buf.at[:, rows, slots].set(new.astype(buf.dtype), mode="drop")
        return self._replace(k=put(self.k, k_new), v=put(self.v, v_new))

    def advance(self, n: jax.Array) -> "KVCache":
        """Commit the first n[b] freshly written entries of each row, in place."""
        return self._replace(lengths=self.lengths + n.astype(jnp.int32))

    def commit(self, path: jax.Array, num_accepted: jax.Array) -> "KVCache":
        """Keep the accepted tree path: slots lengths + path[b, j] move to lengths + j for
        j <= num_accepted[b] (path[:, 0] is the root, node 0), then lengths += num_accepted + 1.

        path: int32[B, D+1] node indices (increasing along a path, so no slot is overwritten
        before it is read); num_accepted: int32[B].
        """
        steps = jnp.arange(path.shape[1])
        src = self.lengths[:, None] + path  # [B, D+1]
        keep = steps[None, :] <= num_accepted[:, None]
        dst = jnp.where(keep, self.lengths[:, None] + steps[None, :], self.max_len)  # drop others
        rows = jnp.arange(path.shape[0])[:, None]

        def move(x):  # x [L, B, S, KV, hd]
            gathered = x[:, rows, src]  # [L, B, D+1, KV, hd]
            return x.at[:, rows, dst].set(gathered, mode="drop")

        return KVCache(move(self.k), move(self.v), self.lengths + num_accepted + 1)
