"""The CPU kernel (cpu.cc through the XLA FFI): int8 / int4 weights read once for all M rows,
converted and scaled in registers, never expanded to float in memory."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels import ffi
from pallas_kernels.ffi.batching import inference_only
from pallas_kernels.quant_matmul import reference
from pallas_kernels.quant_matmul.weight import QuantizedWeight

MAX_ROWS = 64
TILE = 64  # the column panel the kernel reads fastest (QuantizedWeight.tile): 64 int8 = a cache line


def preferred_layout(qw: QuantizedWeight) -> QuantizedWeight:
    """qw in column panels of TILE when N allows, else as it is."""
    return qw.tiled(TILE) if qw.out_features % TILE == 0 else qw


def supports(x, qw: QuantizedWeight, act_bits) -> bool:
    return act_bits is None and x.shape[0] <= MAX_ROWS and ffi.available()


def _ffi(x, qw: QuantizedWeight, index):
    data, scales = (qw.data, qw.scales) if qw.lead_shape else (qw.data[None], qw.scales[None])
    out = jax.ShapeDtypeStruct((x.shape[0], qw.out_features), jnp.float32)
    return jax.ffi.ffi_call("specjax_quant_matmul", out)(
        x.astype(jnp.float32), data, scales, jnp.asarray(index, jnp.int32).reshape(()),
        bits=qw.bits, group_size=qw.group_size, tile=qw.tile)


def _reference(x, qw, index):
    return reference.quantized_matmul(x, qw.layer(index) if qw.lead_shape else qw, out_dtype=jnp.float32)


def _fold(axis_size, x, qw, index):
    out = quantized_matmul(x.reshape(-1, x.shape[-1]), qw, index)
    return out.reshape(axis_size, x.shape[1], -1)


_kernel = inference_only(_ffi, _reference, _fold, name="quantized_matmul")


def quantized_matmul(x, qw: QuantizedWeight, index=None):
    """x [M, K] @ dequantize(qw[index]) -> float32 [M, N]; qw one weight or a stack of layers."""
    if x.shape[0] > MAX_ROWS:
        return _reference(x, qw, index)
    return _kernel(x, qw, jnp.int32(0) if index is None else index)
