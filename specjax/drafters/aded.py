"""ADED: draft trees searched over a tri-gram model that learns from the target's outputs.

Liu et al., "Adaptive Draft-Verification for Efficient Large Language Model Decoding" (2024).
The drafter is a tri-gram model P(c | a, b) of the target's text, built from the prompt (and
an optional corpus, `ADED.with_corpus`) and updated with every token the target commits, so it
adapts to the answer being written; drafts are a tree found by a lookahead search over it.

The tri-gram matrix. With a 49k vocabulary a dense [V, V, V] (or [V, V] of top-k) is out, so
it is a hashed table per row of `table_size` buckets, one per context: a bucket holds its
context (a, b), and the `top` most counted next tokens with their counts (space-saving: a new
token replaces the least counted). A context that hashes to a taken bucket evicts it (direct
mapping; the newest text wins). Each observation also counts under the bigram context (-1, b),
the back-off used when (a, b) was never seen, its probabilities scaled by `backoff`.

The search. A beam of `beam` paths grows `depth` levels; each path's last two tokens index the
table and its `top` successors are scored path probability x P(c | a, b); the best `beam` of a
level's candidates expand the next. Of all candidates, those scoring >= `min_score` and the
best `num_nodes - 1` of them form the tree (`specjax.tree.budget.best_subtree`), so an unsure step
verifies few nodes and a step with nothing seen verifies the root alone (`tree_sizes`).
Adapted from the paper: its MCTS-style search becomes this beam search under a node budget.
Drafts are deterministic (q = None): Greedy at T = 0, TopK when sampling.
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
from specjax.tree.budget import best_subtree


class TrigramTable(NamedTuple):
    """Hashed tri-gram counts, leading axis B in a drafter's state (see the module docstring)."""

    ctx_a: jax.Array  # int32[H] (-2 = empty bucket, -1 = the bigram context)
    ctx_b: jax.Array  # int32[H]
    next: jax.Array  # int32[H, top] (-1 = empty)
    count: jax.Array  # int32[H, top]


class ADEDState(NamedTuple):
    table: TrigramTable
    seen: jax.Array  # int32[B]: committed tokens counted


def _bucket(a, b, size: int):
    h = (a.astype(jnp.uint32) * jnp.uint32(0x9E3779B1)) ^ (b.astype(jnp.uint32) * jnp.uint32(0x85EBCA6B))
    return ((h ^ (h >> 16)) & jnp.uint32(size - 1)).astype(jnp.int32)


def _observe(t: TrigramTable, a, b, c) -> TrigramTable:
    """Count c after context (a, b) (one row)."""
    h = _bucket(a, b, t.ctx_a.shape[0])
    same = (t.ctx_a[h] == a) & (t.ctx_b[h] == b)
    nxt = jnp.where(same, t.next[h], -1)
    cnt = jnp.where(same, t.count[h], 0)
    hit = nxt == c
    slot = jnp.where(hit.any(), jnp.argmax(hit), jnp.argmin(cnt))
    cnt = cnt.at[slot].set(jnp.where(hit.any(), cnt[slot] + 1, 1))
    return TrigramTable(t.ctx_a.at[h].set(a), t.ctx_b.at[h].set(b), t.next.at[h].set(nxt.at[slot].set(c)),
                        t.count.at[h].set(cnt))


def _count_text(t: TrigramTable, tokens, start, stop) -> TrigramTable:
    """Count tokens[i] after its tri-gram and bigram contexts for i in [start, stop) (one row)."""
    def body(i, t):
        a, b, c = tokens[jnp.maximum(i - 2, 0)], tokens[jnp.maximum(i - 1, 0)], tokens[i]
        t = jax.lax.cond(i >= 2, lambda t: _observe(t, a, b, c), lambda t: t, t)
        return jax.lax.cond(i >= 1, lambda t: _observe(t, jnp.int32(-1), b, c), lambda t: t, t)
    return jax.lax.fori_loop(start, stop, body, t)


def empty_table(size: int, top: int) -> TrigramTable:
    return TrigramTable(jnp.full((size,), -2, jnp.int32), jnp.full((size,), -2, jnp.int32),
                        jnp.full((size, top), -1, jnp.int32), jnp.zeros((size, top), jnp.int32))


@register_dataclass
@dataclasses.dataclass(frozen=True)
class ADED(Drafter):
    """A tree of up to `num_nodes` nodes searched over a hashed tri-gram table (`table_size`
    buckets of `top` successors); `corpus`: an optional starting table (see `with_corpus`)."""

    tree_nodes: int = dataclasses.field(default=8, metadata=dict(static=True))
    depth: int = dataclasses.field(default=5, metadata=dict(static=True))
    beam: int = dataclasses.field(default=4, metadata=dict(static=True))
    top: int = dataclasses.field(default=4, metadata=dict(static=True))
    table_size: int = dataclasses.field(default=16384, metadata=dict(static=True))
    min_score: float = dataclasses.field(default=0.2, metadata=dict(static=True))
    backoff: float = dataclasses.field(default=0.5, metadata=dict(static=True))
    corpus: TrigramTable | None = None

    name = "aded"

    def __post_init__(self):
        for field in ("tree_nodes", "depth", "beam", "top", "table_size"):
            v = getattr(self, field)
            if not isinstance(v, int) or v < (2 if field == "tree_nodes" else 1):
                raise ValueError(f"{field} must be an integer >= {2 if field == 'tree_nodes' else 1}, got {v!r}")
        if self.table_size & (self.table_size - 1):
            raise ValueError(f"table_size must be a power of two, got {self.table_size}")
        if not 0.0 <= self.min_score < 1.0 or not 0.0 < self.backoff <= 1.0:
            raise ValueError(f"need 0 <= min_score < 1 and 0 < backoff <= 1, got {self.min_score}, {self.backoff}")

    @classmethod
    def with_corpus(cls, tokens, **settings) -> "ADED":
        """An ADED whose every row starts from the counts of a corpus of token ids."""
        probe = cls(**settings)
        tokens = jnp.asarray(np.asarray(tokens, np.int32).reshape(-1))
        table = jax.jit(lambda x: _count_text(empty_table(probe.table_size, probe.top), x, 0, x.shape[0]))(tokens)
        return cls(corpus=table, **settings)

    @property
    def num_nodes(self) -> int:
        return self.tree_nodes

    @property
    def max_depth(self) -> int:
        return min(self.depth, self.tree_nodes - 1)

    @property
    def tree_sizes(self) -> tuple[int, ...]:
        return tuple(sorted({1, (self.tree_nodes + 1) // 2, self.tree_nodes}))

    def check(self, target) -> None:
        if self.corpus is not None and tuple(self.corpus.next.shape) != (self.table_size, self.top):
            raise ValueError(f"the corpus table is {list(self.corpus.next.shape)}, the settings ask for "
                             f"[{self.table_size}, {self.top}]")

    def init(self, target, prompts, lengths, cache_len, prefill=None):
        """The corpus table (or an empty one) per row; the prompt is counted at the first propose."""
        b = prompts.shape[0]
        base = self.corpus if self.corpus is not None else empty_table(self.table_size, self.top)
        table = jax.tree.map(lambda x: jnp.broadcast_to(x, (b, *x.shape)), base)
        return ADEDState(table, jnp.zeros((b,), jnp.int32))

    def propose(self, state: ADEDState, ctx: Context, key):
        table = jax.vmap(_count_text)(state.table, ctx.tokens, state.seen, ctx.length)
        state = ADEDState(table, ctx.length)
        return self.search(table, ctx), state

    def successors(self, table: TrigramTable, a, b):
        """(tokens, probabilities) [B, P, top] of the contexts (a, b) [B, P]; the bigram back-off
        where (a, b) was never seen."""
        size = table.ctx_a.shape[1]

        def look(a, b):
            h = _bucket(a, b, size)
            ok = (jnp.take_along_axis(table.ctx_a, h, 1) == a) & (jnp.take_along_axis(table.ctx_b, h, 1) == b)
            nxt = jnp.take_along_axis(table.next, h[..., None], 1)
            cnt = jnp.where(ok[..., None], jnp.take_along_axis(table.count, h[..., None], 1), 0)
            return nxt, cnt / jnp.maximum(cnt.sum(-1, keepdims=True), 1)

        tri_tok, tri_p = look(a, b)
        bi_tok, bi_p = look(jnp.full_like(b, -1), b)
        use_tri = (tri_p.sum(-1, keepdims=True) > 0) & (a >= 0)[..., None]
        return jnp.where(use_tri, tri_tok, bi_tok), jnp.where(use_tri, tri_p, self.backoff * bi_p)

    def search(self, table: TrigramTable, ctx: Context) -> DraftTree:
        """The beam search of the module docstring, pruned to `num_nodes`."""
        b, w, k = ctx.tokens.shape[0], self.beam, self.top
        prev = jnp.take_along_axis(ctx.tokens, jnp.maximum(ctx.length - 2, 0)[:, None], 1)[:, 0]
        prev = jnp.where(ctx.length >= 2, prev, -1)
        # the beam: per path its candidate index, last two tokens and score
        node = jnp.zeros((b, w), jnp.int32)
        a = jnp.broadcast_to(prev[:, None], (b, w))
        last = jnp.broadcast_to(ctx.root[:, None], (b, w))
        score = jnp.concatenate([jnp.ones((b, 1)), jnp.zeros((b, w - 1))], axis=1)
        toks, parents, scores = [ctx.root[:, None]], [jnp.full((b, 1), -1, jnp.int32)], [jnp.ones((b, 1))]
        offset = 1
        for _ in range(self.depth):
            nxt, p = self.successors(table, a, last)  # [B, W, K]
            cand = (score[..., None] * p).reshape(b, w * k)
            cand = jnp.where(nxt.reshape(b, w * k) >= 0, cand, 0.0)
            toks.append(jnp.maximum(nxt, 0).reshape(b, w * k))
            parents.append(jnp.repeat(node, k, axis=1))
            scores.append(cand)
            score, pick = jax.lax.top_k(cand, w)
            node = offset + pick.astype(jnp.int32)
            a = jnp.take_along_axis(last, pick // k, 1)
            last = jnp.take_along_axis(toks[-1], pick, 1)
            offset += w * k
        score = jnp.concatenate(scores, 1)
        return best_subtree(jnp.concatenate(toks, 1), jnp.concatenate(parents, 1), score,
                            score >= max(self.min_score, 1e-9), self.num_nodes, self.depth)
