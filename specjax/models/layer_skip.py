"""The target's forward with some of its sublayers skipped: the draft of the self-speculative
drafters (SWIFT, DEL), sharing the target's weights and KV cache.

Which sublayers run is data, `keep_attn, keep_mlp: bool[B, L]`, so one compiled program serves
every skip set and exit layer. Each sublayer is a `lax.cond` that runs when some row keeps it
and reads that layer's weights inside the branch; a skipped sublayer reads nothing and costs a
branch on a scalar. A row that skips a sublayer others keep passes its stream through unchanged
(`where`), so a batch pays for the union of its rows' sublayers.

KV: the T tokens attend to the target's committed cache slots [0, cache.lengths) of each kept
layer (read-only: the target wrote them with every layer, as the paper's shared cache) and to
a small `block` of M scratch slots holding the K/V of the tokens the draft fed since, slot j at
position cache.lengths + j. The target's cache is never written, so nothing needs undoing when
drafts are rejected and the verify forward never sees a draft's partial-layer K/V.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.models.cache import KVCache
from specjax.models.config import ModelConfig
from specjax.models.layer_list import is_split
from specjax.models.llama import (attention_output, attention_qkv, layer_loop, layer_params, reads_in_place,
                                  layer_rope_and_windows, lm_head, mlp_residual, norm, rope_tables)


def empty_block(config: ModelConfig, batch: int, slots: int) -> tuple[jax.Array, jax.Array]:
    """Scratch K, V [L, B, slots, KV, hd] for the tokens a draft feeds."""
    shape = (config.num_layers, batch, slots, config.num_kv_heads, config.head_dim)
    return jnp.zeros(shape, config.jnp_dtype), jnp.zeros(shape, config.jnp_dtype)


def skip_forward(config: ModelConfig, params: dict, tokens: jax.Array, cache: KVCache,
                 block: tuple[jax.Array, jax.Array], slot, keep_attn: jax.Array,
                 keep_mlp: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """Run `tokens` int[B, T] through the kept sublayers. They sit at block slots
    [slot, slot + T) (positions cache.lengths + slot + t) and see, causally, the block slots
    before theirs; their K/V are written there. Returns the final-normed hidden [B, T, E] (what
    the LM head reads) and the block."""
    c = config
    b, t = tokens.shape
    m = block[0].shape[2]
    query_slot = slot + jnp.arange(t)
    positions = cache.lengths[:, None] + query_slot[None, :]
    mask = jnp.broadcast_to(jnp.arange(m)[None, :] <= query_slot[:, None], (b, t, m))
    x = params["embed"][tokens].astype(c.jnp_dtype)
    if c.scale_embeddings:
        x = x * jnp.asarray(c.hidden_size ** 0.5, x.dtype)
    inv_freqs, windows = layer_rope_and_windows(c)
    layers = params["layers"]
    split = is_split(layers)  # LayerLists: a loop unrolled at trace time reads each layer's buffers
    in_place = reads_in_place(layers, b * t)  # the CPU kernels read weights and cache from their stacks

    def layer(x, xs):
        i, k_blk, v_blk, attn_on, mlp_on, rope, window = xs
        lp = lambda: layer_params(layers, i, in_place)  # read inside the branch that runs

        def attention(x, k_blk, v_blk):
            p = lp()
            q, k, v = attention_qkv(c, p, norm(c, x, p["attn_norm"]), rope)
            k_blk = jax.lax.dynamic_update_slice_in_dim(k_blk, k.astype(k_blk.dtype), slot, axis=1)
            v_blk = jax.lax.dynamic_update_slice_in_dim(v_blk, v.astype(v_blk.dtype), slot, axis=1)
            seen = mask if window is None else mask & (query_slot[:, None] - jnp.arange(m)[None, :] < window)
            by_index = in_place or split  # the cache read from its stack at layer i
            k_cache, v_cache = (cache.k, cache.v) if by_index else (cache.k[i], cache.v[i])
            h = attention_output(c, p, q, positions, k_cache, v_cache, cache.lengths, k_blk, v_blk,
                                 seen, window, i if by_index else None)
            return jnp.where(attn_on[:, None, None], x + h, x), k_blk, v_blk

        x, k_blk, v_blk = jax.lax.cond(attn_on.any(), attention, lambda *a: a, x, k_blk, v_blk)
        x = jax.lax.cond(mlp_on.any(), lambda x: jnp.where(mlp_on[:, None, None], mlp_residual(c, lp(), x), x),
                         lambda x: x, x)
        return x, (k_blk, v_blk)

    x, block = layer_loop(layer, x, (jnp.arange(c.num_layers), *block, keep_attn.T, keep_mlp.T,
                                     rope_tables(positions, inv_freqs), windows), unrolled=split)
    return norm(c, x, params["norm"]), block


def exit_logits(config: ModelConfig, params: dict, x: jax.Array) -> jax.Array:
    """Float32 logits [..., V] of a decoder layer's output x [..., E] read through the final norm
    and the LM head (an early exit)."""
    return lm_head(config, params, norm(config, x, params["norm"]))
