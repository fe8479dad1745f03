"""Forced: forced-text drafting for constrained decoding, around any drafter.

Each automaton state names a draft token (`TokenAutomaton.forced`): the one allowed token where
there is one, which the constrained target gives probability 1, else the first token of the
text the constraint fixes from there (`constraints.forced_text`: after `{`, `"name": "` in
json.dumps spacing), a prediction. Up to `max_forced` of them in a row are drafted as a chain of
deterministic drafts (q = a point mass, as for any deterministic draft), so the exact rules
accept one with the constrained target's probability of it and, on rejection, sample the
residual without it: a wrong prediction costs acceptance, never exactness. The inner drafter's
tree continues from the chain's end: it proposes from a context where the chain is committed,
and its nodes are verified only where the chain was accepted. Node layout, per row with k forced
tokens: root, the k forced tokens, the inner tree's non-root nodes, then the unused forced slots
(invalid), so a chain drafter's tree stays a chain in index order.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.drafters.base import Context, Drafter, NoDrafter
from specjax.pytrees import register_dataclass
from specjax.tree import DraftTree


@register_dataclass
@dataclasses.dataclass(frozen=True)
class Forced(Drafter):
    """Drafts the constraint's forced text (certain or predicted tokens), then `inner`'s tree
    (default: none). `inner` must support it (`Drafter.supports_forced`: NoDrafter, PromptLookup,
    Lookahead, DraftModel)."""

    inner: Drafter = dataclasses.field(default_factory=NoDrafter)
    max_forced: int = dataclasses.field(default=8, metadata=dict(static=True))

    def __post_init__(self):
        if not isinstance(self.inner, Drafter):
            raise TypeError(f"inner must be a specjax drafter, got {type(self.inner).__name__}")
        if not self.inner.supports_forced:
            raise ValueError(f"Forced cannot wrap {self.inner.name}: its state is updated from the "
                             "verify pass, which sees the combined tree")
        if not isinstance(self.max_forced, int) or self.max_forced < 1:
            raise ValueError(f"max_forced must be an integer >= 1, got {self.max_forced!r}")

    @property
    def name(self) -> str:
        return f"forced+{self.inner.name}"

    @property
    def num_nodes(self) -> int:
        return self.max_forced + self.inner.num_nodes

    @property
    def max_depth(self) -> int:
        return self.max_forced + self.inner.max_depth

    @property
    def tree_sizes(self) -> tuple[int, ...]:
        """The inner sizes, each with room for 0, 2, 4 or max_forced forced tokens: most forced
        runs are short (`", "age": ` is 5 tokens), and a verify of 3 nodes costs less than
        one of 9 (one compiled forward per size)."""
        room = {j for j in (0, 2, 4) if j < self.max_forced} | {self.max_forced}
        return tuple(sorted({s + j for s in self.inner.tree_sizes for j in room}))

    def default_verifier(self, sampling):
        return self.inner.default_verifier(sampling)

    def check(self, target):
        self.inner.check(target)

    def init(self, target, prompts, lengths, cache_len, prefill=None):
        return self.inner.init(target, prompts, lengths, cache_len, prefill)

    def propose(self, state, ctx: Context, key):
        forced, k, inner_ctx = self._forced(ctx)
        inner, state = self.inner.propose(state, inner_ctx, key)
        b, n_in, f = ctx.tokens.shape[0], self.inner.num_nodes, self.max_forced
        rows = jnp.arange(b)[:, None]
        j = jnp.arange(1, f + 1)[None, :]
        used = j <= k[:, None]
        at_forced = jnp.where(used, j, j + n_in - 1)  # unused forced slots go last
        at_inner = k[:, None] + jnp.arange(1, n_in)[None, :]
        tokens = jnp.zeros((b, self.num_nodes), jnp.int32).at[:, 0].set(ctx.root)
        tokens = tokens.at[rows, at_forced].set(forced).at[rows, at_inner].set(inner.tokens[:, 1:])
        inner_parents = inner.parents[:, 1:]
        parents = jnp.full((b, self.num_nodes), -1, jnp.int32)
        parents = parents.at[rows, at_forced].set(jnp.where(used, j - 1, 0))
        parents = parents.at[rows, at_inner].set(jnp.where(inner_parents == 0, k[:, None], k[:, None] + inner_parents))
        valid = jnp.ones((b, self.num_nodes), bool).at[rows, at_forced].set(used)
        valid = valid.at[rows, at_inner].set(inner.valid[:, 1:])
        q = None
        if inner.q is not None:
            v = inner.q.shape[-1]
            q = jnp.zeros((b, self.num_nodes, v), jnp.float32).at[rows, at_forced].set(jax.nn.one_hot(forced, v))
            q = q.at[rows, at_inner].set(inner.q[:, 1:])
        return DraftTree.build(tokens, parents, q=q, valid=valid, max_depth=self.max_depth), state

    def _forced(self, ctx: Context):
        """The forced tokens int32[B, max_forced] from the root's place in the constraint, their
        count k int32[B] (EOS is not drafted), and the inner drafter's context with them committed."""
        b = ctx.tokens.shape[0]
        tokens, k, constraint = ctx.constraint.forced_tokens(self.max_forced, b)
        idx = ctx.length[:, None] + jnp.arange(self.max_forced)[None, :]
        idx = jnp.where(jnp.arange(self.max_forced)[None, :] < k[:, None], idx, ctx.tokens.shape[1])
        history = ctx.tokens.at[jnp.arange(b)[:, None], idx].set(tokens, mode="drop")
        return tokens, k, ctx._replace(tokens=history, length=ctx.length + k, constraint=constraint)
