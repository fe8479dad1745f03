"""PromptLookup: draft the continuation of an earlier occurrence of the last n-gram (PLD).

As `find_candidate_pred_tokens` in apoorvumang/prompt-lookup-decoding: for n = max_ngram down
to min_ngram, match the last n committed tokens against every earlier window of the prompt
plus the generated text; the first (earliest) match wins and the next `num_tokens` tokens
become a chain, verified as the root alone when nothing matched. Deterministic drafts (q = point mass): TopK when sampling, Greedy at T = 0.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from specjax.drafters.base import Context, Drafter
from specjax.pytrees import register_dataclass
from specjax.tree import DraftTree


@register_dataclass
@dataclasses.dataclass(frozen=True)
class PromptLookup(Drafter):
    """Prompt lookup decoding with n-grams of `min_ngram..max_ngram` tokens."""

    max_ngram: int = dataclasses.field(default=3, metadata=dict(static=True))
    num_tokens: int = dataclasses.field(default=10, metadata=dict(static=True))
    min_ngram: int = dataclasses.field(default=1, metadata=dict(static=True))

    name = "prompt-lookup"
    supports_chain = True

    def __post_init__(self):
        if not (1 <= self.min_ngram <= self.max_ngram):
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}")
        if self.num_tokens < 1:
            raise ValueError(f"num_tokens must be >= 1, got {self.num_tokens}")

    def chain(self, k: int) -> "PromptLookup":
        return dataclasses.replace(self, num_tokens=k)

    @property
    def num_nodes(self) -> int:
        return self.num_tokens + 1

    @property
    def max_depth(self) -> int:
        return self.num_tokens

    @property
    def tree_sizes(self) -> tuple[int, ...]:
        """Root only when no n-gram matched: such a step costs what an AR step costs."""
        return (1, self.num_nodes)

    def propose(self, state, ctx: Context, key):
        tokens, length = ctx.tokens, ctx.length
        b, s = tokens.shape
        start = jnp.full((b,), -1, jnp.int32)  # where the drafted continuation starts
        for n in range(self.min_ngram, self.max_ngram + 1):  # longer n-grams overwrite shorter
            idx = length[:, None] - n + jnp.arange(n)[None, :]
            last = jnp.take_along_axis(tokens, jnp.maximum(idx, 0), axis=1)  # [B, n]
            window = jnp.arange(s)[None, :]  # window start i: tokens[i : i + n] == last
            match = jnp.ones((b, s), bool)
            for j in range(n):
                shifted = jnp.pad(tokens[:, j:], ((0, 0), (0, j)), constant_values=-1)
                match &= shifted == last[:, j: j + 1]
            match &= (window + n < length[:, None]) & (length[:, None] > n)
            first = jnp.argmax(match, axis=1).astype(jnp.int32)
            start = jnp.where(match.any(1), first + n, start)
        pos = start[:, None] + jnp.arange(self.num_tokens)[None, :]
        valid = (start[:, None] >= 0) & (pos < length[:, None])
        draft = jnp.take_along_axis(tokens, jnp.clip(pos, 0, s - 1), axis=1)
        tree_tokens = jnp.concatenate([ctx.root[:, None], jnp.where(valid, draft, 0)], axis=1)
        valid = jnp.concatenate([jnp.ones((b, 1), bool), valid], axis=1)
        parents = np.arange(self.num_nodes, dtype=np.int32) - 1
        return DraftTree.build(tree_tokens, parents, valid=valid, max_depth=self.num_tokens), state
