"""TokenRecycling: draft from an adjacency matrix of the target's own recent top-k successors.

Token Recycling (Luo et al., arXiv 2408.08696). The state is `adj` int32[B, V, k]: row
adj[b, v] holds the k token ids the target ranked highest the last time it read token v in
row b; k is as many ranks as the template reads (3 for the named 8-node tree, 8 for "2.2.2"),
so a row keeps V * k * 4 bytes. After EVERY step, for every valid tree node i (the root, accepted and rejected nodes
alike: the rejected candidates are the "recycled" ones), adj[b, token(i)] = top-k ids of the
target logits at node i. Where one token sits on several nodes, the node on the accepted path
wins, then the later node (the paper writes them in one unordered scatter).

The draft tree is a static template: a node is a path of candidate ranks [r_1, ..., r_d] from
the root, and the token of a node with parent token a and rank r is adj[a, r], filled level by
level. The default is the paper's template "2.2.2" (80 nodes + root, depth 6, 8/21/25/15/8/3
nodes per level). Drafts are deterministic (q = point mass): Greedy at T = 0, TopK when
sampling.

Choices (documented deviations / additions):
- adj is per row (rows independent, so a batch gives the same tokens as each row alone).
- Empty entries are -1, not 0: a node whose adj entry is empty is invalid (never accepted),
  rather than a guess of token 0. A node whose token equals an earlier sibling's is invalid
  too (with its subtree), so siblings are distinct tokens, as TopK's point-mass rule assumes,
  and no forward slot is spent twice on the same candidate.
- `seed_from_prompt`: before the first step, each prompt bigram (a, b) (the newest occurrence
  of a wins) pushes b in front of adj[a] (the other entries shift right by one).
- Hot start: the paper keeps adj across queries. Pass `adj` int[V, k] (e.g. an adj built by
  an earlier run's `update`s) to start every row from it; default None = all empty.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax.drafters.base import Context, Drafter
from specjax.pytrees import register_dataclass
from specjax.tree import DraftTree
from specjax.tree.template import as_spec, parse, rank_paths_from_fanout

# Template "2.2.2", written as the number of children (ranks 0..f-1) under each rank path; the
# template is every such path, ordered by depth, then lexicographically (breadth-first).
_FANOUT_222 = {
    (): 8,
    (0,): 8, (1,): 4, (2,): 3, (3,): 2, (4,): 1, (5,): 1, (6,): 1, (7,): 1,
    (0, 0): 8, (0, 1): 3, (0, 2): 2, (0, 3): 1, (0, 4): 1, (0, 5): 1, (0, 6): 1, (0, 7): 1,
    (1, 0): 2, (1, 1): 1, (2, 0): 1, (3, 0): 1, (4, 0): 1, (5, 0): 1,
    (0, 0, 0): 5, (0, 0, 1): 2, (0, 0, 2): 1, (0, 0, 3): 1, (0, 0, 4): 1, (0, 1, 0): 1,
    (0, 2, 0): 1, (1, 0, 0): 1, (2, 0, 0): 1, (3, 0, 0): 1,
    (0, 0, 0, 0): 3, (0, 0, 0, 1): 1, (0, 0, 0, 2): 1, (0, 0, 1, 0): 1, (0, 1, 0, 0): 1,
    (1, 0, 0, 0): 1,
    (0, 0, 0, 0, 0): 2, (0, 0, 0, 1, 0): 1,
}
TEMPLATE_222 = rank_paths_from_fanout(_FANOUT_222)


class RecyclingState(NamedTuple):
    adj: jax.Array  # int32[B, V, topk]: each token's successors, as the target last ranked them


@register_dataclass
@dataclasses.dataclass(frozen=True)
class TokenRecycling(Drafter):
    """Token Recycling with the top-`topk` successors per token (default: the ranks the
    template reads) and a static `template`: rank paths (root excluded) or parent indices
    (root first, -1), default the paper's "2.2.2". `adj` int[V, topk] (optional, -1 = empty)
    is a hot start shared by all rows."""

    topk: int | None = dataclasses.field(default=None, metadata=dict(static=True))
    template: tuple = dataclasses.field(default=TEMPLATE_222, metadata=dict(static=True))
    seed_from_prompt: bool = dataclasses.field(default=True, metadata=dict(static=True))
    adj: jax.Array | None = None

    name = "recycling"

    def __post_init__(self):  # static fields only: pytree unflattening re-runs this
        object.__setattr__(self, "template", as_spec(self.template))
        rank = parse(self.template).rank
        if self.topk is None:  # a wider table holds ranks the tree never reads
            object.__setattr__(self, "topk", max(int(rank.max()) + 1, 1))
        if not isinstance(self.topk, int) or self.topk < 1:
            raise ValueError(f"topk must be an integer >= 1, got {self.topk!r}")
        if rank.max() >= self.topk:
            raise ValueError(f"the template uses candidate rank {rank.max()}, but topk={self.topk} "
                             f"keeps ranks 0..{self.topk - 1} only")

    @property
    def num_nodes(self) -> int:
        return parse(self.template).num_nodes

    @property
    def max_depth(self) -> int:
        return parse(self.template).max_depth

    def check(self, target) -> None:
        if self.adj is not None:
            v = target.config.vocab_size
            if tuple(self.adj.shape) != (v, self.topk) or not jnp.issubdtype(self.adj.dtype, jnp.integer):
                raise ValueError(f"adj must be an int array [V, topk] = [{v}, {self.topk}], "
                                 f"got {self.adj.dtype}{list(self.adj.shape)}")

    def init(self, target, prompts, lengths, cache_len, prefill=None):
        """adj: the hot start (or empty), then the prompt bigrams."""
        b, t = prompts.shape
        v = target.config.vocab_size
        base = (jnp.full((v, self.topk), -1, jnp.int32) if self.adj is None
                else jnp.asarray(self.adj, jnp.int32))
        adj = jnp.broadcast_to(base, (b, v, self.topk))
        if not self.seed_from_prompt or t < 2:
            return RecyclingState(adj)
        rows = jnp.arange(b)[:, None]
        pos = jnp.arange(t - 1)[None, :]
        first = jnp.where(pos < lengths[:, None] - 1, prompts[:, :-1], v)  # bigram starts
        last = jnp.full((b, v), -1, jnp.int32).at[rows, first].max(
            jnp.broadcast_to(pos, first.shape).astype(jnp.int32), mode="drop")
        succ = jnp.take_along_axis(prompts, jnp.maximum(last, 0) + 1, axis=1)  # [B, V]
        pushed = jnp.concatenate([succ[:, :, None], adj[:, :, :-1]], axis=2)
        return RecyclingState(jnp.where((last >= 0)[:, :, None], pushed, adj))

    def propose(self, state, ctx: Context, key):
        t = parse(self.template)
        parents = t.parents
        b, n = ctx.tokens.shape[0], t.num_nodes
        rows = jnp.arange(b)[:, None]
        tokens = jnp.full((b, n), -1, jnp.int32).at[:, 0].set(ctx.root)
        for d in range(1, self.max_depth + 1):
            idx = t.level(d)
            par_tok = tokens[:, parents[idx]]  # [B, m]
            new = state.adj[rows, jnp.maximum(par_tok, 0), t.rank[idx][None, :]]
            tokens = tokens.at[:, idx].set(jnp.where(par_tok >= 0, new, -1))
        node = np.arange(n)
        earlier_sibling = (parents[:, None] == parents[None, :]) & (node[None, :] < node[:, None])
        dup = jnp.any(earlier_sibling[None] & (tokens[:, :, None] == tokens[:, None, :]), axis=-1)
        valid = (tokens >= 0) & ~dup
        tree = DraftTree.build(jnp.maximum(tokens, 0), parents, valid=valid, max_depth=self.max_depth)
        return tree, state

    def update(self, state, ctx, tree, verdict, target_out):
        """adj[token(i)] = top-k ids of the target logits at node i, for every valid node."""
        adj = state.adj
        b, n = tree.tokens.shape
        v = adj.shape[1]
        top = jax.lax.top_k(target_out.logits, self.topk)[1].astype(jnp.int32)  # [B, N, k]
        node = jnp.arange(n)
        steps = jnp.arange(verdict.path.shape[1])
        on_path = jnp.any((verdict.path[:, :, None] == node)
                          & (steps <= verdict.num_accepted[:, None])[:, :, None], axis=1)
        prio = jnp.where(tree.valid, on_path * n + node, -1)
        same = tree.tokens[:, :, None] == tree.tokens[:, None, :]
        beaten = jnp.any(same & (prio[:, None, :] > prio[:, :, None]), axis=-1)
        idx = jnp.where(tree.valid & ~beaten, tree.tokens, v)  # one writer per token, or dropped
        return RecyclingState(adj.at[jnp.arange(b)[:, None], idx].set(top, mode="drop"))

