"""FreeDave (Wu & Zhang, arXiv 2510.00294): static decoding's exact output in fewer forwards.

Static decoding commits the single most confident MASK of the current block per forward. From
the predictions for the current canvas, FreeDave drafts the next 1..D static steps as if the
predictions stayed put (draft k commits the k + 1 most confident), runs the D drafts in one
batched forward, and keeps the longest chain in which each draft equals its predecessor plus
that predecessor's own next static step. The kept draft's predictions seed the next round, so
every forward commits at least one token and the canvas follows the static trajectory exactly.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from specjax.diffusion.canvas import Canvas, key_mask
from specjax.diffusion.rules import predict, rank_of
from specjax.diffusion.sampler import DiffusionOutput, _fill_after_eos, _shift
from specjax.models import Model, forward


def freedave(model: Model, canvas: Canvas, *, gen_length: int, block_length: int = 32, drafts: int = 4,
             fill_after_eos: int | None = None) -> DiffusionOutput:
    """Greedy static decoding (`generate(..., rule=TopK(1), cache=None)`) with D = `drafts`
    drafts verified per forward; the same tokens, and `nfe` counting the batched forwards."""
    if not model.config.bidirectional:
        raise ValueError("freedave needs a masked-diffusion model (ModelConfig.mask_token_id set)")
    if drafts < 1 or block_length < 1:
        raise ValueError("freedave needs drafts >= 1 and block_length >= 1")
    if not 1 <= gen_length < canvas.tokens.shape[1]:
        raise ValueError(f"gen_length {gen_length} must be in [1, canvas length {canvas.tokens.shape[1]})")
    return _freedave(model, canvas, gen_length=gen_length, block_length=block_length, drafts=drafts,
                     fill_after_eos=fill_after_eos)


@functools.partial(jax.jit, static_argnames=("gen_length", "block_length", "drafts", "fill_after_eos"))
def _freedave(model, canvas, *, gen_length, block_length, drafts, fill_after_eos):
    config = model.config
    b, t = canvas.tokens.shape
    gen_start, mask_id, valid = t - gen_length, config.mask_token_id, canvas.valid
    pos = jnp.arange(t)[None, :]
    fill = (lambda x: x) if fill_after_eos is None else (
        lambda x: _fill_after_eos(x, gen_start, t, mask_id, fill_after_eos))

    def predictions(tokens, valid):
        logits = _shift(forward(config, model.params, tokens, tree_mask=key_mask(valid, t)).logits,
                        int(config.shift_logits))
        return predict(logits.at[..., mask_id].set(-jnp.inf))

    def open_in_block(tokens):
        """MASK slots of the block holding each row's first MASK (blocks from gen_start)."""
        masked = (tokens == mask_id) & (pos >= gen_start)
        first = jnp.argmax(masked, axis=-1)
        start = gen_start + (first - gen_start) // block_length * block_length
        return masked & (pos >= start[:, None]) & (pos < start[:, None] + block_length)

    def round_(carry):
        tokens, pred, nfe, forwards = carry
        eligible = open_in_block(tokens)
        rank = rank_of(pred.conf, eligible)
        ks = jnp.arange(drafts)[None, :, None]
        candidates = jax.vmap(fill, in_axes=1, out_axes=1)(
            jnp.where(eligible[:, None] & (rank[:, None] <= ks), pred.x0[:, None], tokens[:, None]))  # [B, D, T]
        flat = candidates.reshape(b * drafts, t)
        draft_pred = jax.tree.map(lambda x: x.reshape(b, drafts, t),
                                  predictions(flat, jnp.repeat(valid, drafts, axis=0)))
        # each draft plus its own next static step
        own = jax.vmap(open_in_block, in_axes=1, out_axes=1)(candidates)
        step = own & (jax.vmap(rank_of, in_axes=1, out_axes=1)(draft_pred.conf, own) == 0)
        targets = jax.vmap(fill, in_axes=1, out_axes=1)(jnp.where(step, draft_pred.x0, candidates))
        chain = jnp.all(candidates[:, 1:] == targets[:, :-1], axis=-1)  # [B, D-1]
        best = jnp.sum(jnp.cumprod(chain, axis=-1), axis=-1)
        active = jnp.any(eligible, axis=-1)
        pick = lambda x: jnp.take_along_axis(x, best[:, None, None], axis=1)[:, 0]
        keep = lambda new, old: jnp.where(active[:, None], new, old)
        tokens = keep(pick(candidates), tokens)
        pred = jax.tree.map(lambda d, p: keep(pick(d), p), draft_pred, pred)
        return tokens, pred, nfe + active, forwards + 1

    def more(carry):
        return jnp.any(open_in_block(carry[0]))

    tokens = fill(canvas.tokens)
    carry = (tokens, predictions(tokens, valid), jnp.ones((b,), jnp.int32), jnp.int32(1))
    tokens, _, nfe, forwards = jax.lax.while_loop(more, round_, carry)
    return DiffusionOutput(tokens[:, gen_start:], nfe, forwards)
