"""Dense matmul in pure JAX: the definition the CPU kernel is tested against."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.matmul.panels import PanelWeight


def layer(w, index):
    """w[index] along the leading (layer) axis, or w itself when index is None."""
    if index is None:
        return w
    return w.layer(index) if isinstance(w, PanelWeight) else jax.lax.dynamic_index_in_dim(w, index, keepdims=False)


def matmul(x, w, *, index=None, transposed=False):
    """x [M, K] @ W -> float32 [M, N], accumulated in float32. W = w[index] when `index` is
    given (w a stack [L, ...] of layers), else w; W is [K, N] (an array or a PanelWeight), or
    [N, K] when `transposed`."""
    w = layer(w, index)
    if isinstance(w, PanelWeight):
        y = jnp.einsum("mk,pkt->mpt", x, w.data, preferred_element_type=jnp.float32)
        return y.reshape(x.shape[0], -1)
    return jnp.einsum("mk,nk->mn" if transposed else "mk,kn->mn", x, w,
                      preferred_element_type=jnp.float32)
