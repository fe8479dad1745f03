"""Speculative Jacobi Decoding (SJD; Teng et al., arXiv 2410.01699): Jacobi iteration made
exact for sampling.

The draft is the target's own previous iteration. Each step verifies a window of `window`
guessed tokens after the root, as a chain, in the target's one forward. The target's outputs
over the window are the next window's laws: after a step that accepted a tokens, next-window
node j (position root + j) takes the law the target gave at node a + j, computed from the old
guesses, and draws its guess from it. That law is the guess's q, so speculative sampling
(accept x iff u * q(x) < p(x), else draw from norm((p - q)+)) keeps the target's law exactly:
each guess is drawn from a q fixed before the step, with noise of its own. At temperature 0
the laws are point masses on the argmax: greedy Jacobi decoding.

The a nodes at the window's end that no law covers (and the whole first window) hold a filler:
the root token, as a point mass q. The paper fills them with random tokens (on images); on
text a random token is never accepted either, and any deterministic filler keeps the rule
exact. Its role is the context that gives the next window its laws.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import argmax
from specjax import sampling, verify
from specjax.drafters.base import Context, Drafter
from specjax.pytrees import register_dataclass
from specjax.tree import chain


class JacobiState(NamedTuple):
    laws: jax.Array  # float32[B, window, V]: the next window's laws
    known: jax.Array  # int32[B]: how many of them the target gave (the rest: filler)


@register_dataclass
@dataclasses.dataclass(frozen=True)
class SpeculativeJacobi(Drafter):
    """SJD with a Jacobi window of `window` guessed tokens. State: a JacobiState."""

    window: int = dataclasses.field(default=7, metadata=dict(static=True))

    name = "sjd"

    def __post_init__(self):
        if not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"window must be an integer >= 1, got {self.window!r}")

    @property
    def num_nodes(self) -> int:
        return self.window + 1

    @property
    def max_depth(self) -> int:
        return self.window

    def default_verifier(self, params: sampling.SamplingParams) -> verify.Verifier:
        return verify.Greedy() if params.greedy else verify.SpeculativeSampling()

    def init(self, target, prompts, lengths, cache_len, prefill=None):
        b = prompts.shape[0]
        return JacobiState(jnp.zeros((b, self.window, target.config.vocab_size), jnp.float32),
                           jnp.zeros((b,), jnp.int32))

    def propose(self, state, ctx: Context, key):
        laws = state.laws
        known = jnp.arange(self.window)[None, :] < state.known[:, None]  # [B, W]
        if ctx.sampling.greedy:
            guess = argmax(laws)
        else:
            guess = argmax(jnp.log(laws) + sampling.gumbel(key, laws.shape))
        guess = jnp.where(known, guess, ctx.root[:, None]).astype(jnp.int32)
        tokens = jnp.concatenate([ctx.root[:, None], guess], axis=1)
        if ctx.sampling.greedy:
            return chain(tokens), state
        v = laws.shape[-1]
        q = jnp.where(known[:, :, None], laws, jax.nn.one_hot(guess, v, dtype=jnp.float32))
        return chain(tokens, q=jnp.pad(q, ((0, 0), (1, 0), (0, 0)))), state

    def update(self, state, ctx, tree, verdict, target_out):
        a = verdict.num_accepted
        source = jnp.minimum(a[:, None] + 1 + np.arange(self.window)[None, :], self.window)  # [B, W]
        logits = jnp.take_along_axis(target_out.logits, source[:, :, None], axis=1)
        return JacobiState(sampling.probs(logits, ctx.sampling), self.window - a)


__all__ = ["SpeculativeJacobi", "JacobiState"]
