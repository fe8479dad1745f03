"""Drafting a chain with the target itself, some of its sublayers skipped (the draft of SWIFT and
DEL) or its weights quantized (the quantized self-draft): one `skip_forward` per drafted token
in a `lax.while_loop` that ends when every row has stopped, a row stopping at its length limit
or after a token drafted with confidence (the draft's plain softmax probability of it) below
the threshold, as SWIFT does.

KV: the draft reads the target's committed cache (every layer the draft keeps was written
there by the target's full forward) and keeps the K/V of the tokens it feeds (the root, then
its drafts) in a scratch block of `depth` slots, so the target's cache is never written; see
models/layer_skip.py. Sampling: drafts are drawn from the draft's processed distribution, kept
as the tree's q, and verified by speculative sampling (exact); greedy drafts take the argmax.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels import argmax
from specjax import sampling, verify
from specjax.drafters.base import Context, Drafter
from specjax.models import lm_head
from specjax.models.layer_skip import empty_block, skip_forward
from specjax.tree import DraftTree, chain


def chain_sizes(depth: int) -> tuple[int, ...]:
    """Verify sizes for a chain of up to `depth` drafts: 1, 2, 4, ... and depth + 1, so an
    early-stopped chain is verified by a small forward."""
    return tuple(sorted({1 << i for i in range(depth.bit_length()) if 1 << i <= depth} | {depth + 1}))


def check_positive_ints(drafter, *fields: str) -> None:
    """Raise the one-line error for a setting that is not an integer >= 1."""
    for field in fields:
        value = getattr(drafter, field)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{field} must be an integer >= 1, got {value!r}")


class SelfDrafter(Drafter):
    """The shape both self-drafters share: a chain of up to `depth` drafts (a `depth` field),
    verified at `chain_sizes`, by speculative sampling when sampling."""

    @property
    def num_nodes(self) -> int:
        return self.depth + 1

    @property
    def max_depth(self) -> int:
        return self.depth

    @property
    def tree_sizes(self) -> tuple[int, ...]:
        return chain_sizes(self.depth)

    def default_verifier(self, params: sampling.SamplingParams) -> verify.Verifier:
        return verify.Greedy() if params.greedy else verify.SpeculativeSampling()


def draft_chain(ctx: Context, key: jax.Array, keep_attn: jax.Array, keep_mlp: jax.Array, depth: int,
                threshold: float, limit: jax.Array, params: dict | None = None) -> DraftTree:
    """A chain of up to `depth` drafts per row from the target's kept sublayers (bool[B, L]);
    row b drafts at most limit[b] (int32[B]) tokens. `params`: the weights the draft runs
    (default the target's own; the quantized self-draft passes its quantized copy)."""
    if ctx.cache is None or ctx.model is None:
        raise ValueError("a self-drafter needs the target model and its KV cache in the Context")
    cfg, params = ctx.model.config, ctx.model.params if params is None else params
    b = ctx.tokens.shape[0]
    greedy = ctx.sampling.greedy
    tokens = jnp.zeros((b, depth + 1), jnp.int32).at[:, 0].set(ctx.root)
    valid = jnp.zeros((b, depth + 1), bool).at[:, 0].set(True)
    q = None if greedy else jnp.zeros((b, depth + 1, cfg.vocab_size), jnp.float32)

    def draft(carry):
        j, block, tokens, valid, q, alive = carry
        hidden, block = skip_forward(cfg, params, tokens[:, j][:, None], ctx.cache, block, j, keep_attn, keep_mlp)
        logits = lm_head(cfg, params, hidden[:, 0])
        if greedy:
            token = argmax(logits)
        else:
            dist = sampling.probs(logits, ctx.sampling)
            noise = sampling.gumbel(jax.random.fold_in(key, j), dist.shape)
            token = argmax(jnp.log(dist) + noise)
            q = q.at[:, j + 1].set(dist)
        confidence = jnp.take_along_axis(jax.nn.softmax(logits, -1), token[:, None], 1)[:, 0]
        tokens = tokens.at[:, j + 1].set(jnp.where(alive, token, 0))
        valid = valid.at[:, j + 1].set(alive)
        alive = alive & (confidence >= threshold) & (j + 1 < limit)
        return j + 1, block, tokens, valid, q, alive

    start = (jnp.int32(0), empty_block(cfg, b, depth), tokens, valid, q, limit > 0)
    _, _, tokens, valid, q, _ = jax.lax.while_loop(lambda c: (c[0] < depth) & c[-1].any(), draft, start)
    return chain(tokens, q, valid)
