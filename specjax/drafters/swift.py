"""Swift: on-the-fly self-speculative decoding (Xia et al., arXiv 2410.06916, ICLR 2025; code
hemingkx/SWIFT): the draft is the target itself with a set of attention and MLP sublayers
skipped, the set chosen during decoding from how well it predicts the target's own output.

As in the paper's code, the units are the attention and MLP sublayers of layers 1..L-2 (the
first and last layers always run), `skip_ratio` of them skipped, starting from the odd layers.
Optimisation phase: once a row has `window` generated tokens, each step first scores one
candidate set by its matchness (the fraction of the first `window` generated tokens of such
rows that its argmax predicts, teacher-forced, in one skipped forward over them from the
prompt's cache) and
keeps it when it beats the best so far; after `search_steps` candidates, or a matchness of
`target_score`, the set is fixed (the acceleration phase, which pays nothing for the search).
Drafting: a chain of up to `depth` tokens that stops after a token of confidence below
`threshold` (`specjax.drafters.blocks.self_draft`).

Adapted: candidates are the best set with `swaps` skipped and kept units exchanged (a local
random search; the paper draws fresh random sets, with a Bayesian-optimisation proposal every
25th, over a budget of up to 1000 candidates across a whole data stream, which one generate
call does not have); the set is shared by the batch (rows of one batch run one forward) and
lives for one generate call; drafts are a chain (the paper expands the top-k of confident
positions into a tree). A search step costs a skipped forward over `window` tokens and an LM
head over them, on top of the step.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import argmax
from specjax.drafters.blocks import self_draft
from specjax.drafters.base import Context
from specjax.models import Model, lm_head
from specjax.models.layer_skip import empty_block, skip_forward
from specjax.pytrees import register_dataclass


class SwiftState(NamedTuple):
    skip: jax.Array  # bool[2, L]: the attention (row 0) and MLP (row 1) sublayers the draft skips
    score: jax.Array  # float32: the matchness of `skip` (-1 before the first is measured)
    trials: jax.Array  # int32: candidates scored so far
    prompt_len: jax.Array  # int32[B]


@register_dataclass
@dataclasses.dataclass(frozen=True)
class Swift(self_draft.SelfDrafter):
    """SWIFT self-speculation; see the module docstring for the settings."""

    depth: int = dataclasses.field(default=6, metadata=dict(static=True))
    skip_ratio: float = dataclasses.field(default=0.45, metadata=dict(static=True))
    threshold: float = dataclasses.field(default=0.8, metadata=dict(static=True))
    window: int = dataclasses.field(default=8, metadata=dict(static=True))
    search_steps: int = dataclasses.field(default=16, metadata=dict(static=True))
    target_score: float = dataclasses.field(default=0.95, metadata=dict(static=True))
    swaps: int = dataclasses.field(default=2, metadata=dict(static=True))

    name = "swift"

    def __post_init__(self):
        self_draft.check_positive_ints(self, "depth", "window", "swaps")
        if not isinstance(self.search_steps, int) or self.search_steps < 0:
            raise ValueError(f"search_steps must be an integer >= 0, got {self.search_steps!r}")
        if not 0.0 <= self.skip_ratio < 1.0:
            raise ValueError(f"skip_ratio must be in [0, 1), got {self.skip_ratio}")

    def check(self, target: Model) -> None:
        if target.config.num_layers < 3:
            raise ValueError(f"Swift skips sublayers of layers 1..L-2, so it needs a target of 3 or more "
                             f"layers, got {target.config.num_layers}")

    def initial_skip(self, num_layers: int) -> np.ndarray:
        """The starting set, bool[2, L]: int(2 (L - 2) skip_ratio) units, the odd layers' first."""
        layers = [*range(1, num_layers - 1, 2), *range(2, num_layers - 1, 2)]
        units = [(kind, layer) for layer in layers for kind in (0, 1)]
        skip = np.zeros((2, num_layers), bool)
        for kind, layer in units[: int(2 * (num_layers - 2) * self.skip_ratio)]:
            skip[kind, layer] = True
        return skip

    def init(self, target, prompts, lengths, cache_len, prefill=None):
        return SwiftState(jnp.asarray(self.initial_skip(target.config.num_layers)), jnp.float32(-1.0),
                          jnp.int32(0), lengths)

    def propose(self, state: SwiftState, ctx: Context, key):
        search_key, draft_key = jax.random.split(key)
        ready = ctx.length - state.prompt_len >= self.window  # rows with `window` generated tokens
        searching = (state.trials < self.search_steps) & (state.score < self.target_score) & ready.any()
        state = jax.lax.cond(searching, lambda s: self._search(s, ctx, ready, search_key), lambda s: s, state)
        b, num_layers = ctx.tokens.shape[0], state.skip.shape[1]
        keep = jnp.broadcast_to(~state.skip[:, None, :], (2, b, num_layers))
        tree = self_draft.draft_chain(ctx, draft_key, keep[0], keep[1], self.depth, self.threshold,
                                      jnp.full((b,), self.depth, jnp.int32))
        return tree, state

    def _search(self, state: SwiftState, ctx: Context, ready, key) -> SwiftState:
        """Score one candidate (the starting set itself first) and keep the better."""
        candidate = jnp.where(state.trials == 0, state.skip, self._mutate(state.skip, key))
        score = self.matchness(candidate, ctx, state.prompt_len, ready)
        better = score > state.score
        return state._replace(skip=jnp.where(better, candidate, state.skip),
                              score=jnp.where(better, score, state.score), trials=state.trials + 1)

    def _mutate(self, skip: jax.Array, key) -> jax.Array:
        """`swaps` skipped units run again and as many running ones are skipped, at random
        (layers 0 and L-1 stay)."""
        inner = jnp.zeros(skip.shape, bool).at[:, 1:-1].set(True)
        flat = skip.reshape(-1)
        noise = jax.random.uniform(key, (2,) + flat.shape)
        unskip = jax.lax.top_k(jnp.where(flat, noise[0], -1.0), self.swaps)[1]
        reskip = jax.lax.top_k(jnp.where(~flat & inner.reshape(-1), noise[1], -1.0), self.swaps)[1]
        return flat.at[unskip].set(False).at[reskip].set(True).reshape(skip.shape)

    def matchness(self, skip: jax.Array, ctx: Context, prompt_len: jax.Array, ready: jax.Array) -> jax.Array:
        """The fraction of the first `window` generated tokens of the `ready` rows (bool[B])
        that the draft with `skip` predicts (argmax), fed the tokens before each from the
        prompt's cache."""
        cfg, params = ctx.model.config, ctx.model.params
        b = ctx.tokens.shape[0]
        idx = prompt_len[:, None] - 1 + jnp.arange(self.window + 1)[None, :]
        seq = jnp.take_along_axis(ctx.tokens, jnp.minimum(idx, ctx.tokens.shape[1] - 1), axis=1)
        keep = jnp.broadcast_to(~skip[:, None, :], (2, b, skip.shape[1]))
        hidden, _ = skip_forward(cfg, params, seq[:, :-1], ctx.cache._replace(lengths=prompt_len - 1),
                                 empty_block(cfg, b, self.window), 0, keep[0], keep[1])
        guess = argmax(lm_head(cfg, params, hidden))
        hits = jnp.sum((guess == seq[:, 1:]) & ready[:, None])
        return hits / jnp.maximum(ready.sum() * self.window, 1)
