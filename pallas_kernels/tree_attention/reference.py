"""Tree attention in pure JAX: the definition every kernel is tested against.

Row b's N tree queries attend to the row's cache slots [0, lengths[b]) and to tree node j where
tree_mask[b, i, j] (M tree entries, usually the N queries' own). Grouped-query attention: query head h reads kv head h // (Hq // KV).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def tree_attention(q, k_cache, v_cache, lengths, k_tree, v_tree, tree_mask, *,
                   q_positions=None, window=None, scale=None, softcap=None):
    """q [B,N,Hq,hd], k/v_cache [B,S,KV,hd], lengths int[B], k/v_tree [B,M,KV,hd],
    tree_mask bool[B,N,M] -> [B,N,Hq,hd] in q's dtype. Scores are q.k * scale (default
    1/sqrt(hd)), soft-capped to softcap * tanh(scores / softcap) when `softcap` is given.

    With `window` (sliding-window attention; a scalar, which may be traced) a query at position
    q_positions[b, i] also needs q_positions[b, i] - slot < window for a cache slot to be
    visible (slot index == position).
    """
    b, n, hq, hd = q.shape
    s, kv = k_cache.shape[1], k_cache.shape[2]
    scale = hd ** -0.5 if scale is None else scale
    qg = q.reshape(b, n, kv, hq // kv, hd).astype(jnp.float32) * scale
    s_cache = jnp.einsum("bnkgd,bskd->bkgns", qg, k_cache.astype(jnp.float32))
    s_tree = jnp.einsum("bnkgd,bmkd->bkgnm", qg, k_tree.astype(jnp.float32))
    if softcap is not None:
        s_cache, s_tree = softcap * jnp.tanh(s_cache / softcap), softcap * jnp.tanh(s_tree / softcap)
    slot = jnp.arange(s)
    visible = slot[None, None, :] < lengths[:, None, None]  # [B,1,S]
    if window is not None:
        visible = visible & (q_positions[:, :, None] - slot[None, None, :] < window)
    neg = jnp.finfo(jnp.float32).min
    s_cache = jnp.where(visible[:, None, None], s_cache, neg)
    s_tree = jnp.where(tree_mask[:, None, None], s_tree, neg)
    scores = jnp.concatenate([s_cache, s_tree], axis=-1)
    p = jax.nn.softmax(scores, axis=-1)
    out = (jnp.einsum("bkgns,bskd->bnkgd", p[..., :s], v_cache.astype(jnp.float32))
           + jnp.einsum("bkgnm,bmkd->bnkgd", p[..., s:], v_tree.astype(jnp.float32)))
    return out.reshape(b, n, hq, hd).astype(q.dtype)
