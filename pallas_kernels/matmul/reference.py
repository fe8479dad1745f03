"""Dense matmul in pure JAX: the definition the CPU kernel is tested against."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def layer(w, index):
    """w[index] along the leading (layer) axis, or w itself when index is None."""
    return w if index is None else jax.lax.dynamic_index_in_dim(w, index, keepdims=False)


def matmul(x, w, *, index=None, transposed=False):
    """x [M, K] @ W -> float32 [M, N], accumulated in float32. W = w[index] when `index` is
    given (w a stack [L, ...] of layers), else w; W is [K, N], or [N, K] when `transposed`."""
    w = layer(w, index)
    return jnp.einsum("mk,nk->mn" if transposed else "mk,kn->mn", x, w,
                      preferred_element_type=jnp.float32)
