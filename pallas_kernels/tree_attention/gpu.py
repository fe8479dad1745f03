"""Tree attention as a Pallas Triton kernel (GPU): flash-decoding over the prefix.

Grid (B, KV, row blocks, splits). Program (b, h, r, j) takes a block of query rows of kv head h
(the G query heads of the group processed together, see layout.py) and runs an online softmax
over split j of the row's committed prefix [0, lengths[b]) — each row's prefix is cut into
`num_splits` equal runs of `block_k`-slot blocks, so only the live prefix is read. Split 0 also
takes the tree block (all N nodes, masked by the ancestor mask). The partial (acc, max, sum)
of every split are merged outside the kernel with the usual log-sum-exp correction.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.tree_attention.layout import (from_rows, next_pow2, pad_nodes, round_up,
                                                  row_mask, to_rows)

_NEG = -1e30  # finite "minus infinity": exp(_NEG - m) == 0 without inf - inf NaNs
_EXACT = lax.Precision.HIGHEST  # float32 operands: IEEE products (Triton's default is TF32); no-op for bf16


def _kernel(len_ref, q_ref, k_ref, v_ref, kt_ref, vt_ref, mask_ref, o_ref, m_ref, l_ref, *,
            block_k: int, num_splits: int, scale: float):
    split = pl.program_id(3)
    length = len_ref[()]
    cache_len = k_ref.shape[0]
    q = q_ref[...]  # [block_r, hd]

    def attend(carry, k, v, valid):
        """One online-softmax step over keys k / values v [bk, hd]; valid bool [block_r|1, bk]."""
        acc, m, l = carry
        s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=_EXACT,
                            preferred_element_type=jnp.float32) * scale
        s = jnp.where(valid, s, _NEG)
        m_new = jnp.maximum(m, s.max(axis=1))
        p = jnp.where(valid, jnp.exp(s - m_new[:, None]), 0.0)
        alpha = jnp.exp(m - m_new)
        pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), precision=_EXACT,
                             preferred_element_type=jnp.float32)
        return acc * alpha[:, None] + pv, m_new, l * alpha + p.sum(axis=1)

    def tree_block(carry):
        valid = mask_ref[...] != 0  # [block_r, Np]
        return attend(carry, kt_ref[...], vt_ref[...], valid)

    def prefix_block(i, carry):
        # The last block may run past the cache: shift it back and mask what was already seen.
        start = jnp.minimum(i * block_k, cache_len - block_k)
        pos = start + jnp.arange(block_k)
        valid = (pos >= i * block_k) & (pos < length)
        v = jnp.where(valid[:, None], v_ref[pl.ds(start, block_k), :], 0)  # stale slots may be NaN
        return attend(carry, k_ref[pl.ds(start, block_k), :], v, valid[None, :])

    block_r, hd = q.shape
    carry = (jnp.zeros((block_r, hd), jnp.float32), jnp.full((block_r,), _NEG, jnp.float32),
             jnp.zeros((block_r,), jnp.float32))
    carry = lax.cond(split == 0, tree_block, lambda c: c, carry)
    num_blocks = pl.cdiv(length, block_k)
    per_split = pl.cdiv(num_blocks, num_splits)
    lo = split * per_split
    hi = jnp.minimum(lo + per_split, num_blocks)
    acc, m, l = lax.fori_loop(lo, hi, prefix_block, carry)
    o_ref[...] = acc
    m_ref[...] = m
    l_ref[...] = l


def merge_splits(acc, m, l):
    """Combine per-split partials acc [..., J, R, hd], m / l [..., J, R] -> [..., R, hd] (f32).
    A row that sees nothing gets zeros."""
    m_all = m.max(axis=-2, keepdims=True)
    w = jnp.exp(m - m_all)
    l_all = (l * w).sum(axis=-2)
    acc_all = (acc * w[..., None]).sum(axis=-3)
    return acc_all / jnp.where(l_all == 0, 1.0, l_all)[..., None]


def supports(q, k_cache) -> bool:
    """Shapes this kernel lowers for: power-of-two head_dim >= 16 and a cache of >= 16 slots."""
    hd, s = q.shape[-1], k_cache.shape[-3]
    return hd >= 16 and hd == next_pow2(hd) and s >= 16


@functools.partial(jax.jit, static_argnames=("layer", "block_k", "block_r", "num_splits", "num_warps",
                                             "num_stages", "interpret"))
def tree_attention(q, k_cache, v_cache, lengths, k_tree, v_tree, tree_mask, *, layer: int | None = None,
                   block_k: int = 64, block_r: int = 64, num_splits: int | None = None, num_warps: int = 4,
                   num_stages: int = 2, interpret=False):
    """Same contract as reference.tree_attention (no window). q [B,N,Hq,hd], k/v_cache
    [B,S,KV,hd], lengths int[B], k/v_tree [B,N,KV,hd], tree_mask bool[B,N,N] -> [B,N,Hq,hd].
    With `layer`, k/v_cache are stacks [L,B,S,KV,hd] read at that layer where they lie (a
    slice would be copied out for the kernel).

    block_k: prefix slots per step (power of two, capped at the largest power of two <= S).
    block_r: query rows per program (power of two). num_splits: prefix splits (default from S).
    """
    b, n, hq, hd = q.shape
    s, kv = k_cache.shape[-3], k_cache.shape[-2]
    if not supports(q, k_cache):
        raise ValueError(f"unsupported shapes for the GPU kernel: head_dim {hd}, cache {s} slots")
    group = hq // kv
    block_k = min(next_pow2(block_k), next_pow2(s + 1) // 2)
    block_r = min(next_pow2(block_r), max(16, next_pow2(n * group)))
    rows = round_up(n * group, block_r)
    nodes = max(16, next_pow2(n))
    if num_splits is None:
        num_splits = max(1, min(16, s // (8 * block_k)))

    q_rows = to_rows(q, kv, rows)
    mask = row_mask(tree_mask, group, rows, nodes)
    k_tree, v_tree = pad_nodes(k_tree, nodes), pad_nodes(v_tree, nodes)
    grid = (b, kv, rows // block_r, num_splits)
    if layer is None:
        cache_spec = pl.BlockSpec((None, s, None, hd), lambda b, h, r, j: (b, 0, h, 0))
    else:
        cache_spec = pl.BlockSpec((None, None, s, None, hd), lambda b, h, r, j: (layer, b, 0, h, 0))
    partial_shape = (b, kv, num_splits, rows)
    acc, m, l = pl.pallas_call(
        functools.partial(_kernel, block_k=block_k, num_splits=num_splits, scale=hd ** -0.5),
        grid=grid,
        in_specs=[
            pl.BlockSpec((None,), lambda b, h, r, j: (b,)),
            pl.BlockSpec((None, None, block_r, hd), lambda b, h, r, j: (b, h, r, 0)),
            cache_spec,
            cache_spec,
            pl.BlockSpec((None, nodes, None, hd), lambda b, h, r, j: (b, 0, h, 0)),
            pl.BlockSpec((None, nodes, None, hd), lambda b, h, r, j: (b, 0, h, 0)),
            pl.BlockSpec((None, block_r, nodes), lambda b, h, r, j: (b, r, 0)),
        ],
        out_specs=[
            pl.BlockSpec((None, None, None, block_r, hd), lambda b, h, r, j: (b, h, j, r, 0)),
            pl.BlockSpec((None, None, None, block_r), lambda b, h, r, j: (b, h, j, r)),
            pl.BlockSpec((None, None, None, block_r), lambda b, h, r, j: (b, h, j, r)),
        ],
        out_shape=[jax.ShapeDtypeStruct((*partial_shape, hd), jnp.float32),
                   jax.ShapeDtypeStruct(partial_shape, jnp.float32),
                   jax.ShapeDtypeStruct(partial_shape, jnp.float32)],
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="tree_attention_gpu",
    )(lengths.astype(jnp.int32), q_rows, k_cache, v_cache, k_tree, v_tree, mask)
    return from_rows(merge_splits(acc, m, l), n, hq).astype(q.dtype)
