"""Tree attention as a Pallas Mosaic kernel (TPU).

Grid (B, KV // hp, prefix blocks + 1), the last axis sequential. A program holds all query rows
of hp kv heads (layout.py) and runs an online softmax over the row's prefix blocks, with running
max / sum / accumulator in VMEM scratch; the last step takes the tree block under the ancestor
mask and writes the output. lengths are scalar-prefetched: a block past the row's length maps
to the last live block, so it is neither fetched again nor computed.

The cache is read as [B, S, KV*hd] (a free reshape) in blocks of hp heads, hp the fewest heads
whose lanes make a multiple of 128 (or all of them), so every block is a legal TPU tile.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.tree_attention.layout import (from_rows, pad_nodes, round_up, row_mask,
                                                  to_rows)

_NEG = -1e30  # finite "minus infinity": exp(_NEG - m) == 0 without inf - inf NaNs
_LANES = 128  # m and l scratch are lane-replicated to keep them tile-aligned


def _kernel(len_ref, q_ref, k_ref, v_ref, kt_ref, vt_ref, mask_ref, o_ref, m_sc, l_sc, acc_sc,
            *, block_k: int, num_blocks: int, heads: int, scale: float):
    j = pl.program_id(2)
    length = len_ref[pl.program_id(0)]
    hd = q_ref.shape[-1]

    @pl.when(j == 0)
    def _init():
        m_sc[...] = jnp.full(m_sc.shape, _NEG, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

    def attend(i, k, v, valid):
        """Online-softmax step for head i over k / v [bk, hd]; valid bool [R|1, bk]."""
        s = lax.dot_general(q_ref[i], k, (((1,), (1,)), ((), ())),
                            preferred_element_type=jnp.float32) * scale
        s = jnp.where(valid, s, _NEG)
        m_prev, l_prev = m_sc[i][:, :1], l_sc[i][:, :1]
        m_new = jnp.maximum(m_prev, s.max(axis=1, keepdims=True))
        p = jnp.where(valid, jnp.exp(s - m_new), 0.0)
        alpha = jnp.exp(m_prev - m_new)
        pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                             preferred_element_type=jnp.float32)
        acc_sc[i] = acc_sc[i] * alpha + pv
        m_sc[i] = jnp.broadcast_to(m_new, m_sc.shape[1:])
        l_sc[i] = jnp.broadcast_to(l_prev * alpha + p.sum(axis=1, keepdims=True), l_sc.shape[1:])

    @pl.when((j < num_blocks) & (j * block_k < length))
    def _prefix():
        pos_row = j * block_k + lax.broadcasted_iota(jnp.int32, (1, block_k), 1)
        pos_col = j * block_k + lax.broadcasted_iota(jnp.int32, (block_k, 1), 0)
        for i in range(heads):
            lanes = slice(i * hd, (i + 1) * hd)
            v = jnp.where(pos_col < length, v_ref[:, lanes], 0)  # stale or padded slots
            attend(i, k_ref[:, lanes], v, pos_row < length)

    @pl.when(j == num_blocks)
    def _tree_and_output():
        valid = mask_ref[...] != 0
        for i in range(heads):
            lanes = slice(i * hd, (i + 1) * hd)
            attend(i, kt_ref[:, lanes], vt_ref[:, lanes], valid)
            l = l_sc[i][:, :1]
            o_ref[i] = (acc_sc[i] / jnp.where(l == 0, 1.0, l)).astype(o_ref.dtype)


def heads_per_block(kv_heads: int, head_dim: int) -> int:
    """The fewest kv heads whose lanes form a legal TPU block: a multiple of 128, or all."""
    for hp in range(1, kv_heads + 1):
        if kv_heads % hp == 0 and (hp * head_dim) % _LANES == 0:
            return hp
    return kv_heads


@functools.partial(jax.jit, static_argnames=("block_k", "interpret"))
def tree_attention(q, k_cache, v_cache, lengths, k_tree, v_tree, tree_mask, *,
                   block_k: int = 512, interpret=False):
    """Same contract as reference.tree_attention (no window). q [B,N,Hq,hd], k/v_cache
    [B,S,KV,hd], lengths int[B], k/v_tree [B,N,KV,hd], tree_mask bool[B,N,N] -> [B,N,Hq,hd].

    block_k: prefix slots per grid step (a multiple of 8; capped at S).
    """
    b, n, hq, hd = q.shape
    s, kv = k_cache.shape[1], k_cache.shape[2]
    if block_k % 8:
        raise ValueError(f"block_k must be a multiple of 8, got {block_k}")
    group = hq // kv
    hp = heads_per_block(kv, hd)
    block_k = min(block_k, s)
    num_blocks = pl.cdiv(s, block_k)
    rows = round_up(n * group, 8)
    nodes = round_up(n, 8)  # also keeps Mosaic off its matrix-vector path for N = 1

    def cache_block(b, h, j, len_ref):
        last = jnp.maximum(pl.cdiv(len_ref[b], block_k) - 1, 0)
        return b, jnp.minimum(j, last), h

    q_rows = to_rows(q, kv, rows)
    mask = row_mask(tree_mask, group, rows, nodes)
    flat = lambda x: x.reshape(*x.shape[:2], kv * hd)
    k_tree, v_tree = pad_nodes(k_tree, nodes), pad_nodes(v_tree, nodes)
    out = pl.pallas_call(
        functools.partial(_kernel, block_k=block_k, num_blocks=num_blocks, heads=hp,
                          scale=hd ** -0.5),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(b, kv // hp, num_blocks + 1),
            in_specs=[
                pl.BlockSpec((None, hp, rows, hd), lambda b, h, j, _: (b, h, 0, 0)),
                pl.BlockSpec((None, block_k, hp * hd), cache_block),
                pl.BlockSpec((None, block_k, hp * hd), cache_block),
                pl.BlockSpec((None, nodes, hp * hd), lambda b, h, j, _: (b, 0, h)),
                pl.BlockSpec((None, nodes, hp * hd), lambda b, h, j, _: (b, 0, h)),
                pl.BlockSpec((None, rows, nodes), lambda b, h, j, _: (b, 0, 0)),
            ],
            out_specs=pl.BlockSpec((None, hp, rows, hd), lambda b, h, j, _: (b, h, 0, 0)),
            scratch_shapes=[pltpu.VMEM((hp, rows, _LANES), jnp.float32),
                            pltpu.VMEM((hp, rows, _LANES), jnp.float32),
                            pltpu.VMEM((hp, rows, hd), jnp.float32)],
        ),
        out_shape=jax.ShapeDtypeStruct((b, kv, rows, hd), q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret,
        name="tree_attention_tpu",
    )(lengths.astype(jnp.int32), q_rows, flat(k_cache), flat(v_cache), flat(k_tree),
      flat(v_tree), mask)
    return from_rows(out, n, hq)
