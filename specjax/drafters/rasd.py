"""RASD: a retrieval chain fused into a model drafter's tree, pruned to a node budget.

Quan et al., "RASD: Retrieval-Augmented Speculative Decoding" (2025): the retrieval draft
(here SAM's or prompt lookup's chain) is merged into the draft model's tree by longest prefix
matching: the chain's tokens that the tree already holds along one path are fused with those
nodes, the rest hang under the last fused node; the fused tree is pruned to a node budget.

Scores, for the pruning (`specjax.tree.budget.best_subtree`): a model node at depth d scores
`model_score ** d`, a chain node at depth j `retrieval_score ** j`, and a fused node the larger
of the two (the paper prunes by the draft model's confidence; the model drafters here give no
probabilities, Token Recycling and heads draft top-k tokens). Siblings are distinct tokens by
construction if the model's are. Drafts are deterministic (q = None): Greedy at T = 0, TopK when
sampling. Both drafters' states are kept; each `update` sees the fused tree that was verified,
so the model drafter must accept any tree (Token Recycling, Lookahead, heads do).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from specjax.drafters.base import Context, Drafter
from specjax.drafters.prompt_lookup import PromptLookup
from specjax.drafters.sam import SAM
from specjax.pytrees import register_dataclass
from specjax.tree.budget import best_subtree


class RASDState(NamedTuple):
    model: Any  # the model drafter's state
    retrieval: Any  # the retrieval drafter's state


@register_dataclass
@dataclasses.dataclass(frozen=True)
class RASD(Drafter):
    """`retrieval`'s chain fused into `model`'s tree, `budget` nodes at most (the root included)."""

    model: Drafter
    retrieval: Drafter = SAM()
    budget: int = dataclasses.field(default=8, metadata=dict(static=True))
    model_score: float = dataclasses.field(default=0.4, metadata=dict(static=True))
    retrieval_score: float = dataclasses.field(default=0.8, metadata=dict(static=True))

    name = "rasd"

    def __post_init__(self):
        if not isinstance(self.model, Drafter) or not isinstance(self.retrieval, Drafter):
            raise TypeError("RASD's model and retrieval must be specjax drafters")
        if not isinstance(self.retrieval, (SAM, PromptLookup)) or getattr(self.retrieval, "fallback", None):
            raise ValueError(f"RASD's retrieval must draft a chain (SAM without fallback, PromptLookup), "
                             f"got {self.retrieval!r:.80}")
        if not isinstance(self.budget, int) or self.budget < 2:
            raise ValueError(f"budget must be an integer >= 2, got {self.budget!r}")
        for field in ("model_score", "retrieval_score"):
            if not 0.0 < getattr(self, field) < 1.0:
                raise ValueError(f"{field} must be in (0, 1), got {getattr(self, field)!r}")

    @property
    def num_nodes(self) -> int:
        return self.budget

    @property
    def max_depth(self) -> int:
        return min(max(self.model.max_depth, self.retrieval.max_depth), self.budget - 1)

    @property
    def tree_sizes(self) -> tuple[int, ...]:
        return tuple(sorted({1, (self.budget + 1) // 2, self.budget}))

    @property
    def target_layers(self) -> tuple[int, ...]:
        return tuple(sorted({*self.model.target_layers, *self.retrieval.target_layers}))

    def check(self, target) -> None:
        self.model.check(target)
        self.retrieval.check(target)

    def init(self, target, prompts, lengths, cache_len, prefill=None):
        return RASDState(self.model.init(target, prompts, lengths, cache_len, prefill),
                         self.retrieval.init(target, prompts, lengths, cache_len, prefill))

    def propose(self, state, ctx: Context, key):
        model_key, retrieval_key = jax.random.split(key)
        tree, model_state = self.model.propose(state.model, ctx, model_key)
        chain, retrieval_state = self.retrieval.propose(state.retrieval, ctx, retrieval_key)
        if tree.q is not None or chain.q is not None:
            raise ValueError("RASD fuses deterministic drafts; a drafter that samples its tree "
                             "(a draft model) would need its q kept")
        m, k = tree.num_nodes, chain.num_nodes - 1
        b = tree.tokens.shape[0]
        score = jnp.where(tree.valid, self.model_score ** tree.depth.astype(jnp.float32), 0.0)
        # walk the chain down the tree: at[j] = the tree node fused with chain node j + 1, or -1
        node = jnp.zeros((b,), jnp.int32)
        fused = []
        for j in range(1, k + 1):
            hit = ((tree.parents == node[:, None]) & (tree.tokens == chain.tokens[:, j:j + 1])
                   & tree.valid & chain.valid[:, j:j + 1] & (node[:, None] >= 0))
            node = jnp.where(hit.any(1), jnp.argmax(hit, 1), -1).astype(jnp.int32)
            fused.append(node)
            boost = jnp.where(node >= 0, self.retrieval_score ** j, 0.0)
            score = score.at[jnp.arange(b), jnp.maximum(node, 0)].max(boost)
        fused = jnp.stack(fused, 1)  # [B, k]
        # unfused chain nodes follow the tree's, under the last fused node or the previous chain node
        prev_fused = jnp.concatenate([jnp.zeros((b, 1), jnp.int32), fused[:, :-1]], axis=1)
        chain_parent = jnp.where(prev_fused >= 0, prev_fused, m + jnp.arange(k)[None, :] - 1)
        depth = jnp.arange(1, k + 1, dtype=jnp.float32)[None, :]
        tokens = jnp.concatenate([tree.tokens, chain.tokens[:, 1:]], axis=1)
        parents = jnp.concatenate([tree.parents, chain_parent], axis=1)
        valid = jnp.concatenate([tree.valid, chain.valid[:, 1:] & (fused < 0)], axis=1)
        score = jnp.concatenate([score, jnp.broadcast_to(self.retrieval_score ** depth, (b, k))], axis=1)
        depth_in = max(self.model.max_depth, self.retrieval.max_depth)
        out = best_subtree(tokens, parents, score, valid, self.budget, depth_in)
        return out, RASDState(model_state, retrieval_state)

    def update(self, state, ctx, tree, verdict, target_out):
        return RASDState(self.model.update(state.model, ctx, tree, verdict, target_out),
                         self.retrieval.update(state.retrieval, ctx, tree, verdict, target_out))
