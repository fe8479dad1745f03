"""`generate`: fill a canvas's MASK slots block by block, committing what a selection rule
picks after each forward, the whole decode one jitted function.

Each block starts with a forward over the whole canvas (the "refresh"), which also fixes the
block's end (`Blocks` or `AdaBlock`) and commits its first tokens; then forwards repeat until
the block has no MASK. `cache` chooses what those repeated forwards run on (Fast-dLLM):

- None: the whole canvas, every time (exact);
- "prefix": the block and everything after it, attending to the refresh's K/V of the positions
  before the block (which no longer change);
- "dual": the block alone, attending to the refresh's K/V of every other position (the MASK
  slots after the block included: an approximation, refreshed at each block).

Rows share block boundaries (a row whose block is done waits for the others); each row's
trajectory and forward count (`nfe`) are what it would get decoded alone.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from specjax.diffusion.blocks import AdaBlock, Blocks
from specjax.diffusion.canvas import Canvas, key_mask
from specjax.diffusion.rules import Context, Prediction, Rule, predict
from specjax.models import KVCache, Model, forward

CACHES = (None, "prefix", "dual")


class DiffusionOutput(NamedTuple):
    """tokens int32[B, G]: the generated slots; nfe int32[B]: forwards in which the row had
    something to commit (its forward count decoded alone); forwards: int32, the batch's."""

    tokens: jax.Array
    nfe: jax.Array
    forwards: jax.Array


class Frame(NamedTuple):
    """The canvas positions a forward's predictions cover: idx int32[B, F] (into the canvas
    extended by dummy slots), with their logits float32[B, F, V]."""

    idx: jax.Array
    logits: jax.Array


def generate(model: Model, canvas: Canvas, *, gen_length: int, blocks: Blocks | AdaBlock | int = 32,
             rule: Rule, cache: str | None = None, temperature: float = 0.0, key: jax.Array | None = None,
             fill_after_eos: int | None = None) -> DiffusionOutput:
    """Decode `canvas` (`make_canvas`; its last `gen_length` slots are generated) with `rule`.

    blocks: block length or policy (`gen_length`: one block, pure diffusion).
    temperature: 0 is greedy; else Gumbel-max sampling with `key`.
    fill_after_eos: an EOS id: once a row commits it, every MASK after it becomes EOS (the
      early exit of Fast-dLLM / FreeDave and Learn2PD's end-of-text truncation).
    """
    config = model.config
    if not config.bidirectional:
        raise ValueError("diffusion.generate needs a masked-diffusion model (ModelConfig.mask_token_id set)")
    if cache not in CACHES:
        raise ValueError(f"unknown cache {cache!r}; choose one of {CACHES}")
    if not 1 <= gen_length < canvas.tokens.shape[1]:
        raise ValueError(f"gen_length {gen_length} must be in [1, canvas length {canvas.tokens.shape[1]})")
    if temperature > 0 and key is None:
        raise ValueError("sampling with a temperature needs a key")
    blocks = Blocks(blocks) if isinstance(blocks, int) else blocks
    key = jax.random.PRNGKey(0) if key is None else key
    return _generate(model, canvas, rule, key, gen_length=gen_length, blocks=blocks, cache=cache,
                     temperature=float(temperature), fill_after_eos=fill_after_eos)


@functools.partial(jax.jit, static_argnames=("gen_length", "blocks", "cache", "temperature", "fill_after_eos"))
def _generate(model, canvas, rule, key, *, gen_length, blocks, cache, temperature, fill_after_eos):
    config = model.config
    b, t = canvas.tokens.shape
    gen_start, mask_id = t - gen_length, config.mask_token_id
    lead = int(config.shift_logits)
    width = {None: t, "prefix": gen_length, "dual": blocks.max_width(gen_length)}[cache]
    tokens = jnp.pad(canvas.tokens, ((0, 0), (0, width + lead)), constant_values=mask_id)
    valid = jnp.pad(canvas.valid, ((0, 0), (0, width + lead)))
    rows = jnp.arange(b)[:, None]

    def full_forward(tokens):
        out = forward(config, model.params, tokens[:, :t], tree_mask=key_mask(valid[:, :t], t))
        return _shift(out.logits, lead), out.new_kv

    def window_of(start):
        return start[:, None] + jnp.arange(width)[None, :] if cache else jnp.broadcast_to(jnp.arange(t), (b, t))

    def commit(tokens, frame, start, end, state, first, key, counts):
        """Apply the rule to a frame's logits; returns tokens, rule state, nfe increments."""
        idx = frame.idx
        here = tokens[rows, idx]
        masked = (here == mask_id) & valid[rows, idx] & (idx < t)
        eligible = masked & (idx >= start[:, None]) & (idx < end[:, None])
        ctx = Context(eligible, start - idx[:, 0], first, jax.random.fold_in(key, 1))  # predict keeps `key`
        logits, state = rule.fuse(frame.logits, state, ctx)
        pred = predict(logits.at[..., mask_id].set(-jnp.inf), temperature, key)
        chosen = rule.select(pred, ctx, state)
        tokens = tokens.at[rows, idx].set(jnp.where(chosen, pred.x0, here))
        if fill_after_eos is not None:
            tokens = _fill_after_eos(tokens, gen_start, t, mask_id, fill_after_eos)
        return tokens, state, counts + jnp.any(eligible, axis=-1)

    def block_body(carry):
        tokens, start, nfe, forwards, key = carry
        key, k_first = jax.random.split(key)
        logits, new_kv = full_forward(tokens)
        canvas_pred = predict(logits.at[..., mask_id].set(-jnp.inf))
        end = jnp.where(start < t, blocks.end(_pad_pred(canvas_pred, tokens.shape[1]), start, t, gen_length), t)
        idx = window_of(start)
        frame = Frame(idx, jnp.take_along_axis(logits, jnp.minimum(idx, t - 1)[..., None], axis=1))
        state = rule.init(b, idx.shape[1], logits.shape[-1])
        tokens, state, nfe = commit(tokens, frame, start, end, state, jnp.array(True), k_first, nfe)
        kv = window_cache(new_kv, valid[:, :t], start, width, lead) if cache else None

        def step_cond(c):
            tokens = c[0]
            return jnp.any(_open(tokens, valid, mask_id, start, end, t))

        def step_body(c):
            tokens, state, nfe, forwards, key = c
            key, k_step = jax.random.split(key)
            if cache:
                frame = Frame(idx, window_logits(model, tokens, valid, start, kv, width))
            else:
                frame = Frame(idx, full_forward(tokens)[0])
            tokens, state, nfe = commit(tokens, frame, start, end, state, jnp.array(False), k_step, nfe)
            return tokens, state, nfe, forwards + 1, key

        tokens, _, nfe, forwards, key = jax.lax.while_loop(step_cond, step_body,
                                                           (tokens, state, nfe, forwards + 1, key))
        return tokens, jnp.maximum(end, start), nfe, forwards, key

    def block_cond(carry):
        tokens, start = carry[:2]
        return jnp.any(_open(tokens, valid, mask_id, start, jnp.full_like(start, t), t))

    start = jnp.full((b,), gen_start, jnp.int32)
    carry = (tokens, start, jnp.zeros((b,), jnp.int32), jnp.int32(0), key)
    tokens, _, nfe, forwards, _ = jax.lax.while_loop(block_cond, block_body, carry)
    return DiffusionOutput(tokens[:, gen_start:t], nfe, forwards)


def window_cache(new_kv, valid, start, width: int, lead: int = 0) -> KVCache:
    """A KVCache of the K/V [L, B, T, KV, hd] of every valid canvas position outside each row's
    window [start - lead, start + width), packed to the left (attention ignores slot order:
    the keys carry their RoPE positions)."""
    pos = jnp.arange(valid.shape[1])[None, :]
    keep = valid & ((pos < start[:, None] - lead) | (pos >= start[:, None] + width))
    order = jnp.argsort(~keep, axis=-1, stable=True)
    pack = lambda x: jnp.take_along_axis(x, order[None, :, :, None, None], axis=2)
    return KVCache(pack(new_kv[0]), pack(new_kv[1]), jnp.sum(keep, axis=-1).astype(jnp.int32))


def window_logits(model: Model, tokens, valid, start, kv: KVCache, width: int) -> jax.Array:
    """Logits float32[B, width, V] for canvas positions [start, start + width) of each row, from
    a forward over that window (and, for shifted-logit models, the slot before it) attending to
    `kv` (`window_cache`). tokens and valid extend past the canvas by at least width + 1."""
    lead = int(model.config.shift_logits)
    rows = jnp.arange(tokens.shape[0])[:, None]
    idx = start[:, None] - lead + jnp.arange(width + lead)[None, :]
    out = forward(model.config, model.params, tokens[rows, idx], positions=idx, cache=kv,
                  tree_mask=key_mask(valid[rows, idx], width + lead), write_cache=False)
    return _shift(out.logits, lead)[:, lead:]


def _shift(logits, lead):
    """Shifted-logit models (Dream): the prediction for position i is the output at i - 1."""
    return logits if not lead else jnp.concatenate([logits[:, :1], logits[:, :-1]], axis=1)


def _pad_pred(pred: Prediction, length: int) -> Prediction:
    """A canvas prediction padded to the extended canvas (dummy slots: never delimiters)."""
    extra = length - pred.x0.shape[1]
    pad = lambda x, v: jnp.pad(x, ((0, 0), (0, extra)), constant_values=v)
    return Prediction(pad(pred.x0, -1), pad(pred.conf, 0.0), pad(pred.entropy, jnp.inf))


def _open(tokens, valid, mask_id, start, end, t):
    """bool[B, T_ext]: MASK slots of the canvas inside each row's [start, end)."""
    pos = jnp.arange(tokens.shape[1])[None, :]
    return (tokens == mask_id) & valid & (pos < t) & (pos >= start[:, None]) & (pos < end[:, None])


def _fill_after_eos(tokens, gen_start, t, mask_id, eos_id):
    """Every MASK after a row's first committed EOS (in the generated slots) becomes EOS."""
    pos = jnp.arange(tokens.shape[1])[None, :]
    is_eos = (tokens == eos_id) & (pos >= gen_start) & (pos < t)
    after = jnp.cumsum(is_eos, axis=-1) > 0
    return jnp.where(after & (tokens == mask_id) & (pos < t), eos_id, tokens)
