"""The CPU kernels (cpu.cc through the XLA FFI): int8 / int4 weights read once for all M rows,
converted and scaled in registers, never expanded to float in memory; with act_bits=8 the rows
rounded to int8 and multiplied in integers (AVX-512 VNNI where the host has it), the weights
read in quads (QuantizedWeight.quads)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels import ffi
from pallas_kernels.ffi.batching import inference_only
from pallas_kernels.quant_matmul import reference
from pallas_kernels.quant_matmul.weight import QuantizedWeight

MAX_ROWS = 64  # with float activations; XLA's float GEMM is faster past a verify step's rows
TILE = 64  # the column panel the kernel reads fastest (QuantizedWeight.tile): 64 int8 = a cache line


def preferred_layout(qw: QuantizedWeight) -> QuantizedWeight:
    """qw in column panels of TILE when N allows, else row-major; in quads if it takes int8
    activations (`act_bits`)."""
    laid = qw.tiled(TILE if qw.out_features % TILE == 0 else 0)
    return laid.in_quads() if qw.act_bits == 8 else laid


def supports(x, qw: QuantizedWeight, act_bits) -> bool:
    """Float activations: up to MAX_ROWS rows; int8 activations: any number (integer products
    beat XLA's float GEMM at prefill's rows too)."""
    return (act_bits == 8 or (act_bits is None and x.shape[0] <= MAX_ROWS)) and ffi.available()


def _ffi(x, qw: QuantizedWeight, index, act_bits=None):
    data, scales = (qw.data, qw.scales) if qw.lead_shape else (qw.data[None], qw.scales[None])
    out = jax.ShapeDtypeStruct((x.shape[0], qw.out_features), jnp.float32)
    target = "specjax_quant_matmul" if act_bits is None else "specjax_quant_matmul_a8"
    return jax.ffi.ffi_call(target, out)(
        x.astype(jnp.float32), data, scales, jnp.asarray(index, jnp.int32).reshape(()),
        bits=qw.bits, group_size=qw.group_size, tile=qw.tile, quads=qw.quads)


def _reference(x, qw, index, act_bits=None):
    return reference.quantized_matmul(x, qw.layer(index) if qw.lead_shape else qw, act_bits=act_bits,
                                      out_dtype=jnp.float32)


def _fold(axis_size, x, qw, index, act_bits=None):
    out = quantized_matmul(x.reshape(-1, x.shape[-1]), qw, index, act_bits)
    return out.reshape(axis_size, x.shape[1], -1)


_kernels = {a: inference_only(functools.partial(_ffi, act_bits=a), functools.partial(_reference, act_bits=a),
                              functools.partial(_fold, act_bits=a), name="quantized_matmul")
            for a in (None, 8)}


def quantized_matmul(x, qw: QuantizedWeight, index=None, act_bits=None):
    """x [M, K] @ dequantize(qw[index]) -> float32 [M, N] (x rounded to int8 per row first with
    act_bits=8); qw one weight or a stack of layers. The int8-activation kernel reads weights in
    quads and the other not: a weight in the other layout is laid out anew on each call (a copy;
    `preferred_layout` lays it out once)."""
    if act_bits is None and x.shape[0] > MAX_ROWS:
        return _reference(x, qw, index, act_bits)
    if qw.quads != (act_bits == 8):
        qw = qw.in_quads() if act_bits == 8 else qw.tiled(qw.tile)
    return _kernels[act_bits](x, qw, jnp.int32(0) if index is None else index)
