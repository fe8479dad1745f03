"""Quantized matmul as a Pallas Triton kernel (GPU), for skinny activations (decode).

Grid (M blocks, N blocks, K splits). A program loops over its share of the scale groups: it
loads one group of packed rows [g, bn] once, unpacks the P planes with shifts (int4) and, for
each plane, multiplies the matching [bm, g] slice of x with it — bf16/f32 for weight-only,
int8 x int8 -> int32 for W8A8 — and adds the product times the group's scales [1, bn] to a
float32 accumulator. K splits give skinny problems enough programs; their partial sums are
added outside the kernel.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.quant_matmul.reference import check_inputs, quantize_rows
from pallas_kernels.quant_matmul.weight import QuantizedWeight, unpack

_DOT = (((1,), (0,)), ((), ()))
_EXACT = lax.Precision.HIGHEST  # float32 operands: IEEE products (Triton's default is TF32); no-op for bf16


def _kernel(x_ref, data_ref, scales_ref, *rest, bits: int, group_size: int, plane_rows: int,
            groups_per_split: int, w8a8: bool):
    sx_ref, o_ref = rest if w8a8 else (None, *rest)
    g0 = pl.program_id(2) * groups_per_split

    def group(i, acc):
        g = g0 + i
        rows = pl.ds(pl.multiple_of(g * group_size, group_size), group_size)
        for p, plane in enumerate(unpack(data_ref[rows, :], bits)):
            cols = pl.ds(pl.multiple_of(p * plane_rows + g * group_size, group_size), group_size)
            x = x_ref[:, cols]  # [bm, g]
            w = plane.astype(x.dtype)  # exact: |q| <= 127
            prod = lax.dot_general(x, w, _DOT, precision=_EXACT, preferred_element_type=jnp.int32 if w8a8
                                   else jnp.float32)
            acc += prod.astype(jnp.float32) * scales_ref[p, pl.ds(g, 1), :]
        return acc

    acc = lax.fori_loop(0, groups_per_split, group, jnp.zeros(o_ref.shape, jnp.float32))
    if w8a8:
        acc *= sx_ref[...][:, None]
    o_ref[...] = acc


def _pick_block_n(n: int, block_n: int) -> int | None:
    for bn in (256, 128, 64, 32, 16):
        if bn <= block_n and n % bn == 0:
            return bn
    return None


def supports(qw: QuantizedWeight, block_n: int = 128) -> bool:
    """Shapes this kernel lowers for: N a multiple of 16 (power-of-two tiles)."""
    return _pick_block_n(qw.out_features, block_n) is not None


def _pick_splits(programs: int, groups: int, target: int = 256) -> int:
    """The most K splits (dividing the group count) that keep programs * splits <= target."""
    return max(d for d in range(1, groups + 1) if groups % d == 0 and programs * d <= target
               or d == 1)


@functools.partial(jax.jit, static_argnames=("act_bits", "out_dtype", "block_n", "k_splits",
                                             "num_warps", "num_stages", "interpret"))
def quantized_matmul(x, qw: QuantizedWeight, *, act_bits: int | None = None, out_dtype=None,
                     block_n: int = 128,
                     k_splits: int | None = None, num_warps: int = 4, num_stages: int = 3,
                     interpret=False):
    """x [M, K] @ qw [K, N] -> [M, N] in out_dtype (see reference.quantized_matmul).

    block_n: widest column tile (a power of two dividing N is picked). k_splits: K splits
    (default: enough for about 256 programs; must divide the groups per plane).
    """
    check_inputs(x, qw, act_bits)
    bn = _pick_block_n(qw.out_features, block_n)
    if bn is None:
        raise ValueError(f"N = {qw.out_features} must be a multiple of 16 for the GPU kernel")
    m, k = x.shape
    out_dtype = x.dtype if out_dtype is None else out_dtype
    n, g, pack = qw.out_features, qw.group_size, qw.pack
    bm = 16 if m <= 16 else min(1 << (m - 1).bit_length(), 64)
    mp = -(-m // bm) * bm
    groups = k // (pack * g)
    splits = k_splits or _pick_splits((mp // bm) * (n // bn), groups)
    if groups % splits:
        raise ValueError(f"k_splits = {splits} must divide the {groups} groups per plane")

    w8a8 = act_bits == 8
    if w8a8:
        x, sx = quantize_rows(x)
        operands = [jnp.pad(sx[:, 0], (0, mp - m))]
        extra_specs = [pl.BlockSpec((bm,), lambda i, j, s: (i,))]
    else:
        operands, extra_specs = [], []
    partial = pl.pallas_call(
        functools.partial(_kernel, bits=qw.bits, group_size=g, plane_rows=k // pack,
                          groups_per_split=groups // splits, w8a8=w8a8),
        grid=(mp // bm, n // bn, splits),
        in_specs=[
            pl.BlockSpec((bm, k), lambda i, j, s: (i, 0)),
            pl.BlockSpec((k // pack, bn), lambda i, j, s: (0, j)),
            pl.BlockSpec((pack, groups, bn), lambda i, j, s: (0, 0, j)),
            *extra_specs,
        ],
        out_specs=pl.BlockSpec((None, bm, bn), lambda i, j, s: (s, i, j)),
        out_shape=jax.ShapeDtypeStruct((splits, mp, n), jnp.float32),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name=f"quantized_matmul_int{qw.bits}_gpu",
    )(jnp.pad(x, ((0, mp - m), (0, 0))), qw.data, qw.scales, *operands)
    return partial.sum(axis=0)[:m].astype(out_dtype)
