"""Quantized matmul in pure JAX: the definition every kernel is tested against."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.quant_matmul.weight import QuantizedWeight, dequantize

ACT_BITS = (None, 8)


def check_inputs(x, qw: QuantizedWeight, act_bits):
    """Raise a clear error for inputs no quantized-matmul implementation accepts."""
    if not isinstance(qw, QuantizedWeight):
        raise TypeError(f"expected a QuantizedWeight, got {type(qw).__name__}")
    if qw.lead_shape:
        raise ValueError(f"quantized_matmul takes one [K, N] weight; this one has leading axes "
                         f"{qw.lead_shape} (slice the layer first)")
    if x.ndim != 2 or x.shape[1] != qw.in_features:
        raise ValueError(f"x must be [M, K={qw.in_features}], got {x.shape}")
    if act_bits not in ACT_BITS:
        raise ValueError(f"act_bits must be None (weight-only) or 8, got {act_bits}")


def quantize_rows(x):
    """Per-row dynamic symmetric int8: x [M, K] -> (int8 [M, K], float32 scales [M, 1])."""
    x32 = x.astype(jnp.float32)
    scale = jnp.max(jnp.abs(x32), axis=1, keepdims=True) / 127
    safe = jnp.where(scale == 0, 1.0, scale)
    return jnp.clip(jnp.round(x32 / safe), -127, 127).astype(jnp.int8), scale


def quantized_matmul(x, qw: QuantizedWeight, *, act_bits: int | None = None, out_dtype=None):
    """x [M, K] @ dequantize(qw) [K, N] in float32 -> [M, N] in `out_dtype` (default x's
    dtype). With act_bits=8 the activations are first rounded to per-row int8 (W8A8)."""
    check_inputs(x, qw, act_bits)
    if act_bits is None:
        x32 = x.astype(jnp.float32)
    else:
        xq, sx = quantize_rows(x)
        x32 = xq.astype(jnp.float32) * sx
    out = jnp.dot(x32, dequantize(qw), precision=jax.lax.Precision.HIGHEST)
    return out.astype(x.dtype if out_dtype is None else out_dtype)
