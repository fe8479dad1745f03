"""The row layout shared by the tree-attention kernels.

The G = Hq // KV query heads of one kv head are processed together: for kv head h, row
r = n * G + g holds query head h * G + g of tree node n. Rows are zero-padded to `rows`.
"""

from __future__ import annotations

import jax.numpy as jnp


def to_rows(q_BNHD, kv_heads: int, rows: int):
    """q [B,N,Hq,hd] -> [B,KV,rows,hd]."""
    b, n, hq, hd = q_BNHD.shape
    g = hq // kv_heads
    x = q_BNHD.reshape(b, n, kv_heads, g, hd).transpose(0, 2, 1, 3, 4)
    x = x.reshape(b, kv_heads, n * g, hd)
    return jnp.pad(x, ((0, 0), (0, 0), (0, rows - n * g), (0, 0)))


def from_rows(o_BKRD, n: int, num_heads: int):
    """[B,KV,rows,hd] -> [B,N,Hq,hd] (drops the padded rows)."""
    b, kv, _, hd = o_BKRD.shape
    g = num_heads // kv
    o = o_BKRD[:, :, :n * g].reshape(b, kv, n, g, hd)
    return o.transpose(0, 2, 1, 3, 4).reshape(b, n, num_heads, hd)


def row_mask(tree_mask_BNN, group: int, rows: int, cols: int):
    """bool[B,N,N] -> int32[B,rows,cols]: row r sees tree node j where tree_mask[b, r // G, j];
    padded rows and columns see nothing."""
    n = tree_mask_BNN.shape[-1]
    m = jnp.repeat(tree_mask_BNN, group, axis=1)
    return jnp.pad(m, ((0, 0), (0, rows - m.shape[1]), (0, cols - n))).astype(jnp.int32)


def pad_nodes(x_BNKD, nodes: int):
    """Zero-pad the node axis of k_tree / v_tree [B,N,KV,hd] to `nodes`."""
    return jnp.pad(x_BNKD, ((0, 0), (0, nodes - x_BNKD.shape[1]), (0, 0), (0, 0)))


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def next_pow2(x: int) -> int:
    return 1 << max(x - 1, 0).bit_length()
