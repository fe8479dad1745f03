"""RMSNorm in pure JAX: the definition the CPU kernel is tested against."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def rms_norm(x, w, *, eps: float, offset: float = 0.0):
    """x [..., D] / sqrt(mean(x^2) + eps) * (offset + w [D]), computed in float32, in x's dtype
    (Gemma: offset 1)."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return ((offset + w.astype(jnp.float32)) * x32).astype(x.dtype)
