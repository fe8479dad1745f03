"""The pure forward of the Llama family (Llama 2/3.x, Mistral, Qwen2/2.5, Qwen3) and of the
Gemma family (Gemma 1/2/3 text), whose differences are ModelConfig fields: GeGLU, (1 + w) norms,
scaled embeddings, norms after attention and MLP, soft-capping, and per-layer sliding windows and
RoPE bases (which ride in the layer scan as arrays).

One function, `forward`, serves every use:
- a plain causal forward (no cache);
- prefill into a KVCache (new entries written at each row's own length);
- decoding N new tokens per row at arbitrary positions under an [N, N] tree mask; the tokens
  see the row's whole committed prefix and the tree nodes the mask allows (their ancestors).

Parameters are a nested dict, declared in `specjax.models.params`; the layers are stacked on a
leading axis and scanned, or (`sj.load` on a GPU) held as LayerLists, one buffer per layer,
and run by a loop unrolled at trace time. Matmul weights are [in, out]: arrays,
QuantizedWeight, or on CPU PanelWeight (the same values in the column panels the matmul kernel
reads fastest).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from pallas_kernels import QuantizedWeight, dequantize, quant_matmul, quantized_matmul
from pallas_kernels.matmul import PanelWeight, matmul, runs_cpu_kernel
from pallas_kernels.rms_norm import rms_norm as _rms_norm
from pallas_kernels.tree_attention import tree_attention
from specjax.models.cache import KVCache
from specjax.models.config import ModelConfig
from specjax.models.layer_list import LayerList, is_split


class ForwardOutput(NamedTuple):
    logits: jax.Array | None  # float32 [B, T, V], None when not asked for
    hidden: jax.Array  # [B, T, E]: the final normed hidden state (what the LM head reads)
    layer_hidden: jax.Array | None  # [len(return_layers), B, T, E]: outputs of chosen layers
    cache: KVCache | None
    new_kv: tuple[jax.Array, jax.Array] | None = None  # the T new K, V [L, B, T, KV, hd], when not written


class Injection(NamedTuple):
    """M extra positions appended to a forward (PPD prompt tokens, Hidden Transfer pseudo
    states). They enter the residual stream before decoder layer `layer` (0: with the
    embeddings) as `make(x)`, x [B, T, E] being the T tokens' stream there; they see the
    committed cache and, by `mask` bool[B, M, T + M], some of the tokens and each other. The
    tokens never see them, and their K/V are not written to the cache."""

    layer: int
    make: Callable[[jax.Array], jax.Array]
    positions: jax.Array  # int[B, M]
    mask: jax.Array


# ---- building blocks ----------------------------------------------------------------------------

class InPlace(NamedTuple):
    """Layer `index` of a stack [L, ...] of matmul weights, for a kernel that reads it in place
    (XLA would copy a slice out of the stack before handing it to a kernel)."""

    stack: jax.Array | QuantizedWeight | PanelWeight
    index: jax.Array


def _matmul_stack(w) -> bool:
    """Whether a layer stack holds matmul weights (what the CPU kernels read in place)."""
    return isinstance(w, (QuantizedWeight, PanelWeight)) or w.ndim >= 3


def layer_params(layers: dict, index, in_place: bool) -> dict:
    """One layer's parameters from `layers` (stacks, or LayerLists with a Python int index):
    the matmul weights as InPlace views when `in_place` (the CPU kernels run), everything
    sliced otherwise."""
    def one(w):
        if in_place and _matmul_stack(w):
            return InPlace(w, index)
        return w.layer(index) if isinstance(w, (QuantizedWeight, PanelWeight, LayerList)) else w[index]
    return {name: one(w) for name, w in layers.items()}


def reads_in_place(layers: dict, rows: int) -> bool:
    """Whether the CPU kernels take every matmul of a forward over `rows` rows, and so read each
    layer's weights and KV cache from their stacks (`layer_params(..., in_place=True)`): the few
    rows of a decode or verify step, or a prefill's when every matmul weight is quantized with
    int8 activations. Not for LayerLists (a loop at trace time reads their own buffers)."""
    if is_split(layers):
        return False
    if runs_cpu_kernel(rows):
        return True
    return all(isinstance(w, QuantizedWeight) and quant_matmul.runs_cpu_kernel(rows, w.act_bits)
               for w in layers.values() if _matmul_stack(w))


def layer_loop(body, x, xs, unrolled: bool):
    """`jax.lax.scan(body, x, xs)` over the layers, xs[0] being their indices; `unrolled`
    runs it as a loop at trace time, each layer's index a Python int (for LayerList weights)."""
    if not unrolled:
        return jax.lax.scan(body, x, xs)
    outs = []
    for i in range(xs[0].shape[0]):
        x, out = body(x, (i, *jax.tree.map(lambda a: a[i], xs[1:])))
        outs.append(out)
    return x, jax.tree.map(lambda *ys: jnp.stack(ys), *outs)


def rms_norm(x, w, eps, offset=0.0):
    """RMSNorm in float32, scaled by (offset + w) (Gemma: offset 1), in x's dtype; on CPU the
    few rows of a decode or verify step run the kernel, whose rows do not depend on each other."""
    return _rms_norm(x, w, eps=eps, offset=offset)


def norm(config: ModelConfig, x, w):
    return rms_norm(x, w, config.rms_norm_eps, config.norm_offset)


def soft_cap(x, cap):
    """cap * tanh(x / cap) (Gemma 2's soft-capping); x itself when cap is None."""
    return x if cap is None else cap * jnp.tanh(x / cap)


def dense(x, w, out_dtype=None):
    """x [..., K] @ w [K, N], accumulated in float32, returned in `out_dtype` (default x's
    dtype). w may be an array, a QuantizedWeight (the quantized-matmul kernel, with the weight's
    `act_bits`), a PanelWeight or an InPlace layer of a stack; on CPU the few rows of a decode or
    verify step run the matmul kernels."""
    out_dtype = x.dtype if out_dtype is None else out_dtype
    rows = x.reshape(-1, x.shape[-1])
    stack, index = (w.stack, w.index) if isinstance(w, InPlace) else (w, None)
    if isinstance(stack, QuantizedWeight):
        y = quantized_matmul(rows, stack, index=index, act_bits=stack.act_bits, out_dtype=out_dtype)
    elif index is not None or isinstance(stack, PanelWeight) or runs_cpu_kernel(rows.shape[0]):
        y = matmul(rows, stack, index=index).astype(out_dtype)
    else:
        return jnp.einsum("...k,kn->...n", x, w, preferred_element_type=jnp.float32).astype(out_dtype)
    return y.reshape(*x.shape[:-1], y.shape[-1])


def rope_inv_freq(config: ModelConfig, local: bool = False) -> jax.Array:
    """Inverse frequencies [hd/2], with the configured scaling; `local`: those of the sliding
    layers when they have their own base (Gemma 3), unscaled."""
    hd = config.head_dim
    local = local and config.rope_local_theta is not None
    theta = config.rope_local_theta if local else config.rope_theta
    inv = 1.0 / (theta ** (jnp.arange(0, hd, 2, dtype=jnp.float32) / hd))
    s = config.rope_scaling
    if s is None or local:
        return inv
    if s.rope_type == "linear":
        return inv / s.factor
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * inv / s.factor + smooth * inv
    inv = jnp.where(wavelen > low_wavelen, inv / s.factor, inv)
    return jnp.where((wavelen <= low_wavelen) & (wavelen >= high_wavelen), smoothed, inv)


def rope_tables(positions, inv_freq) -> tuple[jax.Array, jax.Array]:
    """cos and sin of positions int[B,T] times inv_freq [..., hd/2] -> [..., B, T, hd/2] each.
    The forward takes them once for all its layers (inv_freq [L, hd/2]) before the layer loop:
    fused into each rotation, XLA:CPU evaluated them for every element of q and k (a long
    prompt's prefill spent ~15% of its time there)."""
    angles = positions[..., None].astype(jnp.float32) * inv_freq[..., None, None, :]
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x, rope):
    """Half-split (rotate-half) RoPE, HF layout. x [B,T,H,hd]; rope: rope_tables' (cos, sin) [B,T,hd/2]."""
    cos, sin = (table[:, :, None, :] for table in rope)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def layer_rope_and_windows(config: ModelConfig):
    """Per-layer RoPE inverse frequencies [L, hd/2] and sliding windows int32[L] (None when no
    layer is windowed; an unwindowed layer's window is larger than any position)."""
    sliding = config.sliding_layers
    inv = jnp.stack([rope_inv_freq(config, local) for local in sliding])
    if not any(sliding):
        return inv, None
    return inv, jnp.array([config.sliding_window if w else jnp.iinfo(jnp.int32).max for w in sliding],
                          jnp.int32)


def attention_qkv(config, lp, x, rope):
    """One layer's roped queries [B,T,H,hd], keys and values [B,T,KV,hd] from the normed x [B,T,E]
    (rope: its rope_tables)."""
    c = config
    b, t, _ = x.shape
    q = dense(x, lp["wq"])
    k = dense(x, lp["wk"])
    v = dense(x, lp["wv"])
    if c.attention_bias:
        q, k, v = q + lp["bq"], k + lp["bk"], v + lp["bv"]
    q = q.reshape(b, t, c.num_heads, c.head_dim)
    k = k.reshape(b, t, c.num_kv_heads, c.head_dim)
    v = v.reshape(b, t, c.num_kv_heads, c.head_dim)
    if c.qk_norm:
        q = norm(c, q, lp["q_norm"])
        k = norm(c, k, lp["k_norm"])
    return apply_rope(q, rope), apply_rope(k, rope), v


def attention_output(config, lp, q, positions, k_cache, v_cache, lengths, k_block, v_block, mask,
                     window=None, layer=None, causal=False):
    """The queries q [B,T,H,hd] attend to the cache slots [0, lengths) and to the block of new
    keys/values [B,M,KV,hd] that `mask` bool[B,T,M] allows; returns the output projection
    [B,T,E] (post-attention-normed where configured). `window` (scalar, may be traced) limits
    the cache slots seen; the mask must already hold it. With `layer`, k/v_cache are the
    stacks [L,B,S,KV,hd] of every layer, read in place at that index. `causal`: no query sees
    a later key of the block (see tree_attention)."""
    c = config
    b, t = q.shape[:2]
    scale = None if c.query_pre_attn_scalar is None else c.query_pre_attn_scalar ** -0.5
    out = tree_attention(q, k_cache, v_cache, lengths, k_block, v_block, mask, index=layer,
                         q_positions=positions, window=window, scale=scale,
                         softcap=c.attn_logit_softcapping, causal=causal)
    h = dense(out.reshape(b, t, -1), lp["wo"])
    return norm(c, h, lp["post_attn_norm"]) if c.sandwich_norms else h


def attention_block(config, lp, x, positions, tree_mask, k_cache, v_cache, lengths, rope,
                     window=None, layer=None, causal=False):
    """Self-attention of one layer over the normed x, the new tokens seeing each other by
    `tree_mask` (rope: rope_tables of the positions); returns (output, k_new, v_new) (heads call
    it with sandwich_norms off)."""
    q, k, v = attention_qkv(config, lp, x, rope)
    return attention_output(config, lp, q, positions, k_cache, v_cache, lengths, k, v, tree_mask,
                            window, layer, causal), k, v


def mlp_residual(config, lp, x):
    """x + the layer's MLP over the normed x (post-MLP-normed where configured)."""
    h = mlp_block(lp, norm(config, x, lp["mlp_norm"]), config.hidden_act)
    return x + (norm(config, h, lp["post_mlp_norm"]) if config.sandwich_norms else h)


_ACTIVATIONS = {"silu": jax.nn.silu, "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True)}


def mlp_block(lp, x, hidden_act="silu"):
    gate = _ACTIVATIONS[hidden_act](dense(x, lp["w_gate"]))
    return dense(gate * dense(x, lp["w_up"]), lp["w_down"])


# ---- the forward --------------------------------------------------------------------------------

def forward(config: ModelConfig, params: dict, tokens: jax.Array, *,
            positions: jax.Array | None = None, cache: KVCache | None = None,
            tree_mask: jax.Array | None = None, return_layers: tuple[int, ...] = (),
            compute_logits: bool = True, inject: Injection | None = None,
            write_cache: bool = True) -> ForwardOutput:
    """Run the model on `tokens` int[B, T], assumed valid and unchecked (a check inside jit
    costs): ids in [0, vocab_size) (the embedding gather clamps others and wraps negatives),
    positions < max_position_embeddings. `sj.forward` and `sj.generate` check concrete inputs.

    positions: int[B, T]; default `cache.lengths + arange(T)` (or `arange(T)` without a cache).
    cache: when given, the T new K/V entries are written at slots [lengths, lengths + T) of
      each row and attention also covers the committed slots [0, lengths).
    tree_mask: bool[B, T, T], which new tokens each new token sees; default causal (all of
      them for a bidirectional, masked-diffusion config).
    return_layers: indices of decoder layers whose outputs (pre final norm) to return.
    inject: extra positions (see Injection); the outputs then cover T + M positions.
    write_cache: False returns the new K/V in `new_kv` and the cache untouched (for callers that
      write them later, outside a `lax.switch`, where XLA would copy a cache updated inside).
    """
    c = config
    b, t = tokens.shape
    if positions is None:
        start = cache.lengths[:, None] if cache is not None else jnp.zeros((b, 1), jnp.int32)
        positions = start + jnp.arange(t, dtype=jnp.int32)[None, :]
    causal = tree_mask is None and not c.bidirectional and inject is None
    if tree_mask is None:
        square = jnp.ones((t, t), bool)
        tree_mask = jnp.broadcast_to(square if c.bidirectional else jnp.tril(square), (b, t, t))
    x = params["embed"][tokens].astype(c.jnp_dtype)
    if c.scale_embeddings:
        x = x * jnp.asarray(c.hidden_size ** 0.5, x.dtype)
    if inject is not None:
        m = inject.positions.shape[1]
        positions = jnp.concatenate([positions, inject.positions.astype(positions.dtype)], axis=1)
        tree_mask = jnp.concatenate([jnp.pad(tree_mask, ((0, 0), (0, 0), (0, m))), inject.mask], axis=1)
        extra = inject.make(x) if inject.layer == 0 else jnp.zeros((b, m, x.shape[-1]))
        x = jnp.concatenate([x, extra.astype(x.dtype)], axis=1)
    inv_freqs, windows = layer_rope_and_windows(c)
    if windows is not None:  # a window applies inside the new block as well
        distance = positions[:, :, None] - positions[:, None, :]

    if cache is None:
        empty = jnp.zeros((c.num_layers, b, 0, c.num_kv_heads, c.head_dim), c.jnp_dtype)
        k_cache, v_cache, lengths = empty, empty, jnp.zeros((b,), jnp.int32)
    else:
        k_cache, v_cache, lengths = cache

    # On CPU a decode or verify forward (and a prefill with int8 activations) runs kernels that
    # read each layer's weights and cache from their stacks in place; LayerList weights (sj.load's
    # layout on a GPU) are read from their own buffers by a loop unrolled at trace time, the cache
    # from its stack at the layer's (static) index; otherwise the scan slices the stacks (as its
    # xs, which training's gradient needs).
    split = is_split(params["layers"])
    in_place = reads_in_place(params["layers"], b * x.shape[1])
    by_index = in_place or split  # the cache (and stacked weights) read at the layer's index

    def layer(x, xs):
        index, rope, window = xs[:3]
        if by_index:
            lp, k_layer, v_layer = layer_params(params["layers"], index, in_place), k_cache, v_cache
        else:
            lp, k_layer, v_layer = xs[3:]
        if inject is not None and inject.layer > 0:
            x = jax.lax.cond(index == inject.layer,
                             lambda x: x.at[:, t:].set(inject.make(x[:, :t]).astype(x.dtype)), lambda x: x, x)
        mask = tree_mask if window is None else tree_mask & (distance < window)
        with jax.named_scope("attention"):
            h, k_new, v_new = attention_block(c, lp, norm(c, x, lp["attn_norm"]), positions, mask,
                                               k_layer, v_layer, lengths, rope, window,
                                               index if by_index else None, causal)
        with jax.named_scope("mlp"):
            x = mlp_residual(c, lp, x + h)
        return x, (k_new, v_new, x if return_layers else None)

    xs = (jnp.arange(c.num_layers), rope_tables(positions, inv_freqs), windows,
          *(() if by_index else (params["layers"], k_cache, v_cache)))
    x, (k_new, v_new, per_layer) = layer_loop(layer, x, xs, unrolled=split)
    layer_hidden = per_layer[jnp.array(return_layers)] if return_layers else None
    hidden = norm(c, x, params["norm"])
    logits = lm_head(config, params, hidden) if compute_logits else None
    # one scatter of every layer's new entries (not the injected ones) at slots [lengths, lengths + T)
    k_new, v_new = k_new[:, :, :t], v_new[:, :, :t]
    if cache is None or not write_cache:
        return ForwardOutput(logits, hidden, layer_hidden, cache, (k_new, v_new))
    return ForwardOutput(logits, hidden, layer_hidden, cache.write(k_new, v_new))


def lm_head_weight(config: ModelConfig, params: dict):
    """The LM head matrix [E, V]: the transposed embedding when tied, unless the params carry a
    quantized copy of it (`sj.quantize`, a Q8_0 / Q4_0 GGUF): the embedding stays float for the
    gather, the head's matmul reads the quantized copy."""
    return params["lm_head"] if "lm_head" in params else params["embed"].T


def float_lm_head(config: ModelConfig, params: dict) -> jax.Array:
    """The LM head as a float matrix [E, V], for draft heads that slice or gather its columns:
    the embedding's transpose when tied (even where a quantized copy serves the target's own
    matmul), else lm_head, dequantized if it is quantized."""
    if config.tie_word_embeddings:
        return params["embed"].T
    w = params["lm_head"]
    return dequantize(w) if isinstance(w, QuantizedWeight) else w


def lm_head(config: ModelConfig, params: dict, hidden: jax.Array) -> jax.Array:
    """Final-normed hidden [..., E] -> float32 logits [..., V] (soft-capped when configured)."""
    w = lm_head_weight(config, params)
    if "lm_head" not in params and runs_cpu_kernel(hidden.size // hidden.shape[-1]):
        # the kernel reads the embedding's rows as the head's columns: no transpose
        rows = hidden.reshape(-1, hidden.shape[-1])
        logits = matmul(rows, params["embed"], transposed=True).reshape(*hidden.shape[:-1], -1)
        return soft_cap(logits, config.final_logit_softcapping)
    if not isinstance(w, QuantizedWeight):
        w = w.astype(hidden.dtype)
    return soft_cap(dense(hidden, w, out_dtype=jnp.float32), config.final_logit_softcapping)
