"""Quantized matmul as a Pallas Mosaic kernel (TPU).

Grid (M blocks, N blocks, K steps), the K axis sequential into a float32 VMEM accumulator. A K
step takes `gpb` groups of every plane: the packed tile [gpb*g, bn] is unpacked with shifts,
and per plane either dequantized whole (scales broadcast over their g rows) and multiplied by
the plane's x tile (weight-only), or multiplied group by group as int8 x int8 -> int32 and
scaled (W8A8, which needs 128-lane groups). Blocks are legal TPU tiles: gpb is a multiple of 8
or all the groups of a plane, so every scales block is too.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.quant_matmul.reference import check_inputs, quantize_rows
from pallas_kernels.quant_matmul.weight import QuantizedWeight, unpack

_DOT = (((1,), (0,)), ((), ()))


def _kernel(*refs, bits: int, group_size: int, pack: int, w8a8: bool):
    x_refs, (data_ref, scales_ref, *rest) = refs[:pack], refs[pack:]
    sx_ref, o_ref, acc_ref = rest if w8a8 else (None, *rest)
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    planes = unpack(data_ref[...], bits)  # each int32 [gpb*g, bn]
    gpb, bn = scales_ref.shape[1:]
    for p in range(pack):
        scales = scales_ref[p]  # [gpb, bn]
        if w8a8:
            for i in range(gpb):
                rows = slice(i * group_size, (i + 1) * group_size)
                prod = lax.dot_general(x_refs[p][:, rows], planes[p][rows].astype(jnp.int8), _DOT,
                                       preferred_element_type=jnp.int32)
                acc_ref[...] += prod.astype(jnp.float32) * scales[i:i + 1]
        else:
            x = x_refs[p][...]
            per_row = jnp.broadcast_to(scales[:, None, :], (gpb, group_size, bn))
            w = planes[p].astype(jnp.float32) * per_row.reshape(gpb * group_size, bn)
            acc_ref[...] += lax.dot_general(x, w.astype(x.dtype), _DOT,
                                            preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _out():
        acc = acc_ref[...]
        o_ref[...] = (acc * sx_ref[...] if w8a8 else acc).astype(o_ref.dtype)


def _groups_per_step(groups: int, group_size: int, target_k: int) -> int:
    """Groups per K step: the most, a multiple of 8 dividing `groups`, within target_k rows;
    else all of them."""
    fits = [d for d in range(8, groups + 1, 8) if groups % d == 0 and d * group_size <= target_k]
    return max(fits) if fits else groups


def _pick_block_n(n: int, block_n: int) -> int:
    for bn in (512, 256, 128):
        if bn <= block_n and n % bn == 0:
            return bn
    return n


def supports(qw: QuantizedWeight, act_bits: int | None = None, target_k: int = 1024) -> bool:
    """Shapes whose blocks are legal TPU tiles: x tiles a multiple of 128 lanes (or all of K),
    and 128-row groups for W8A8."""
    groups = qw.in_features // (qw.pack * qw.group_size)
    bk = _groups_per_step(groups, qw.group_size, target_k) * qw.group_size
    lanes_ok = bk % 128 == 0 or bk == qw.in_features
    return lanes_ok and (act_bits is None or qw.group_size % 128 == 0)


@functools.partial(jax.jit, static_argnames=("act_bits", "out_dtype", "block_n", "target_k",
                                             "interpret"))
def quantized_matmul(x, qw: QuantizedWeight, *, act_bits: int | None = None, out_dtype=None,
                     block_n: int = 512, target_k: int = 1024, interpret=False):
    """x [M, K] @ qw [K, N] -> [M, N] in out_dtype (see reference.quantized_matmul).

    block_n: widest column tile (512, 256 or 128 dividing N, else all of N). target_k: most
    weight rows per K step and plane.
    """
    check_inputs(x, qw, act_bits)
    if not supports(qw, act_bits, target_k):
        raise ValueError(f"unsupported shapes for the TPU kernel: K = {qw.in_features}, "
                         f"group_size = {qw.group_size}, int{qw.bits}, act_bits = {act_bits}")
    m, k = x.shape
    out_dtype = x.dtype if out_dtype is None else out_dtype
    n, g, pack = qw.out_features, qw.group_size, qw.pack
    bn = _pick_block_n(n, block_n)
    bm = 16 if m <= 16 else min(1 << (m - 1).bit_length(), 256)
    mp = -(-m // bm) * bm
    groups = k // (pack * g)
    gpb = _groups_per_step(groups, g, target_k)
    steps = groups // gpb
    bk = gpb * g

    w8a8 = act_bits == 8
    if w8a8:
        x, sx = quantize_rows(x)
        extra = [jnp.pad(sx, ((0, mp - m), (0, 0)))]
        extra_specs = [pl.BlockSpec((bm, 1), lambda i, j, s: (i, 0))]
    else:
        extra, extra_specs = [], []
    x = jnp.pad(x, ((0, mp - m), (0, 0)))
    x_specs = [pl.BlockSpec((bm, bk), lambda i, j, s, p=p: (i, p * steps + s)) for p in range(pack)]
    out = pl.pallas_call(
        functools.partial(_kernel, bits=qw.bits, group_size=g, pack=pack, w8a8=w8a8),
        grid=(mp // bm, n // bn, steps),
        in_specs=[
            *x_specs,
            pl.BlockSpec((bk, bn), lambda i, j, s: (s, j)),
            pl.BlockSpec((pack, gpb, bn), lambda i, j, s: (0, s, j)),
            *extra_specs,
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, s: (i, j)),
        out_shape=jax.ShapeDtypeStruct((mp, n), out_dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret,
        name=f"quantized_matmul_int{qw.bits}_tpu",
    )(*[x] * pack, qw.data, qw.scales, *extra)
    return out[:m]
