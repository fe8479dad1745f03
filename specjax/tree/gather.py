"""The per-row gather every batched tree reader needs: row b's entries at row b's own indices."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def row_gather(x: jax.Array, idx: jax.Array) -> jax.Array:
    """x[b, idx[b]] for every row b: x [B, N, ...] and idx int[B] -> [B, ...], or idx int[B, K]
    -> [B, K, ...] (e.g. the nodes of an accepted path). Indices must be in [-N, N)."""
    rows = jnp.arange(x.shape[0]).reshape((-1,) + (1,) * (idx.ndim - 1))
    return x[rows, idx]
