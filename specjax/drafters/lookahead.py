"""Lookahead: multi-branch drafts retrieved from a trie of the prompt and the generated text.

The trie-based retrieval of Zhao et al., "Lookahead: An Inference Acceleration Framework for
Large Language Model with Lossless Generation Accuracy" (KDD 2024; alipay/
PainlessInferenceAcceleration), as a fixed-memory, jit-able drafter.

The trie. Every committed position i contributes the path tokens[i : i + L] (L = branch_length
+ max_query_length levels, cut at the committed length), so a node is an n-gram (n <= L) of the
text and its frequency counts the n-gram's occurrences. An occurrence counts as input when it
ends inside the prompt and as output otherwise (`freq_in`, `freq_out`). Each row owns its trie
for one generate call (the official cache is global across requests), a table of M slots:

    token int32[M] (-1 = free slot), parent int32[M] (-1 at depth 0), depth int32[M],
    anc int32[M, Q] (the ancestor at depth j < Q, for subtree tests), freq_in / freq_out int32[M],
    stamp int32[M] (committed length when last touched: recency, for eviction ties).

Insertion is streamed: `propose` first inserts the committed tokens the trie has not seen (the
whole prompt at the first step, then the tokens committed by the last step), in chunks of
max(branch_length + 1, 32) tokens, so one pass per step. A pass walks the L levels of the trie
(a fori_loop); at each level all its windows move down at once: one [windows, M] comparison
finds existing children, equal new (parent, token) keys are merged, and new nodes take free
slots. Each occurrence is counted once, when its last token is committed, so the counts equal
those of inserting whole windows.

Pruning. When a level needs more slots than are free, the lowest-frequency leaves (fewest
occurrences, the least recently touched first) that this chunk does not use are evicted; a
leaf has no children, so eviction never orphans a node. If too few such leaves exist the
insertion of the remaining windows is refused (they stop at that level).

Retrieval ("hier"): for q = max_query_length .. 1, match the last q committed tokens (the root
last) down the trie; take the longest q whose subtree holds at least branch_length nodes (else
the largest subtree). From that subtree, the `decoding_length` nodes of highest score
freq_in + output_weight * freq_out (ties: shallower, then more recent) become the draft tree,
in breadth-first order, with the matched node as the root. Scores never grow down a path
(output_weight <= 1), so the selection is a connected subtree; a node whose parent is left out
is marked invalid anyway. Drafts are deterministic (q = None): Greedy at T = 0, TopK when
sampling.

Fixed memory: M = min(max_nodes, what the text can fill): a text of S tokens (the decode's
cache length) has at most S - d n-grams at depth d, and a vocabulary of V at most V^(d+1),
so a trie that size never fills: it evicts nothing and drafts as a larger one (`capacity`). The
state is (6 + Q) * 4 * M bytes per row (at most 256 KiB at the default 8192 nodes, Q = 2; 6
KiB for the named setting, a 16-token prompt and 2 new tokens on an 8-token vocabulary); a
step costs L levels of a [chunk + L - 1, M] comparison per row to insert (one pass) and one
sort of M entries to retrieve.
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


class LookaheadState(NamedTuple):
    """Per-row tries (leading axis B); see the module docstring for the fields."""

    token: jax.Array  # int32[B, M], -1 = free
    parent: jax.Array  # int32[B, M], -1 at depth 0 and for free slots
    depth: jax.Array  # int32[B, M], -1 = free
    anc: jax.Array  # int32[B, M, Q]: ancestor at depth j (the node itself at its depth), -1 below
    freq_in: jax.Array  # int32[B, M]: occurrences ending in the prompt
    freq_out: jax.Array  # int32[B, M]: occurrences ending in the generated text
    stamp: jax.Array  # int32[B, M]: committed length when last touched
    inserted: jax.Array  # int32[B]: committed tokens already in the trie
    prompt_len: jax.Array  # int32[B]


@register_dataclass
@dataclasses.dataclass(frozen=True)
class Lookahead(Drafter):
    """Trie retrieval drafter: up to `decoding_length` draft nodes, at most `branch_length` deep,
    queried with the last `max_query_length` tokens, from a trie of at most `max_nodes` nodes
    per row (`capacity`)."""

    decoding_length: int = dataclasses.field(default=64, metadata={"static": True})
    branch_length: int = dataclasses.field(default=12, metadata={"static": True})
    max_query_length: int = dataclasses.field(default=2, metadata={"static": True})
    max_nodes: int = dataclasses.field(default=8192, metadata={"static": True})
    output_weight: float = dataclasses.field(default=1e-4, metadata={"static": True})

    name = "lookahead"

    def __post_init__(self):
        for field in ("decoding_length", "branch_length", "max_query_length", "max_nodes"):
            v = getattr(self, field)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{field} must be an integer >= 1, got {v!r}")
        if self.max_nodes < self.levels:
            raise ValueError(f"max_nodes={self.max_nodes} cannot hold one path of "
                             f"branch_length + max_query_length = {self.levels} nodes")
        if not 0.0 <= self.output_weight <= 1.0:
            raise ValueError(f"output_weight must be in [0, 1], got {self.output_weight!r}")

    @property
    def num_nodes(self) -> int:
        return self.decoding_length + 1

    @property
    def max_depth(self) -> int:
        return self.branch_length

    @property
    def tree_sizes(self) -> tuple[int, ...]:
        """The retrieved nodes come first: a step verifies the root alone when the trie has no
        match, half the tree when it found at most that many nodes."""
        return tuple(sorted({1, (self.num_nodes + 1) // 2, self.num_nodes}))

    @property
    def levels(self) -> int:
        """L: trie depth, so a full-length query still leaves branch_length levels below it."""
        return self.branch_length + self.max_query_length

    @property
    def chunk(self) -> int:
        """Committed tokens inserted per pass: at least what one step can commit (D + 1), and at
        least 32 so that a long prompt goes in with few sequential passes."""
        return max(self.branch_length + 1, 32)

    def capacity(self, cache_len: int, vocab_size: int | None = None) -> int:
        """Trie slots a row needs for a text of `cache_len` tokens over `vocab_size` (None:
        any): the distinct n-grams it can hold, min(V^(d+1), cache_len - d) at depth d, at
        most `max_nodes`. A trie this large never fills, so it never evicts."""
        grams = sum(max(min(vocab_size ** (d + 1) if vocab_size else cache_len, cache_len - d), 0)
                    for d in range(self.levels))
        return max(min(self.max_nodes, grams), 1)

    # ---- the protocol ---------------------------------------------------------------------------

    def init(self, target, prompts, lengths, cache_len, prefill=None):
        """An empty trie per row (`capacity` slots); the prompt goes in at the first `propose`."""
        vocab = None if target is None else target.config.vocab_size
        b, m, q = jnp.shape(prompts)[0], self.capacity(cache_len, vocab), self.max_query_length
        neg = jnp.full((b, m), -1, jnp.int32)
        zero = jnp.zeros((b, m), jnp.int32)
        return LookaheadState(neg, neg, neg, jnp.full((b, m, q), -1, jnp.int32), zero, zero, zero,
                              jnp.zeros((b,), jnp.int32), jnp.asarray(lengths, jnp.int32))

    def propose(self, state: LookaheadState, ctx: Context, key):
        state = self.insert(state, ctx.tokens, ctx.length)
        return self.retrieve(state, ctx.tokens, ctx.length), state

    # update: the base no-op; the tokens a step commits are inserted from ctx at the next propose.

    # ---- the trie -------------------------------------------------------------------------------

    def insert(self, state: LookaheadState, tokens: jax.Array, length: jax.Array) -> LookaheadState:
        """Insert tokens[b, state.inserted[b] : length[b]] of int32[B, S] into each row's trie."""
        return jax.vmap(self._insert_row)(state, tokens, length)

    def retrieve(self, state: LookaheadState, tokens: jax.Array, length: jax.Array) -> DraftTree:
        """The draft tree for committed tokens int32[B, S] (root = tokens[b, length[b] - 1])."""
        toks, parents, valid = jax.vmap(self._retrieve_row)(state, tokens, length)
        return DraftTree.build(toks, parents, valid=valid, max_depth=self.branch_length)

    def _insert_row(self, t: LookaheadState, tokens, length):
        def body(t):
            return self._insert_chunk(t, tokens, jnp.minimum(length, t.inserted + self.chunk))
        return jax.lax.while_loop(lambda t: t.inserted < length, body, t)

    def _insert_chunk(self, t: LookaheadState, tokens, hi):
        """Insert the occurrences ending at positions [t.inserted, hi) (one row)."""
        L, M, Q = self.levels, t.token.shape[0], self.max_query_length
        W = L - 1 + self.chunk  # window starts that can reach a new position
        lo = t.inserted
        starts = lo - (L - 1) + jnp.arange(W, dtype=jnp.int32)
        alive = starts >= 0
        wi = jnp.arange(W)

        def level(d, carry):
            t, alive, cur, touched = carry
            pos = starts + d
            alive &= pos < hi
            tok = tokens[jnp.clip(pos, 0, tokens.shape[0] - 1)]
            eq = (t.token[None] == tok[:, None]) & (t.parent[None] == cur[:, None]) & (t.depth[None] == d)
            found = alive & eq.any(1)
            node = jnp.where(found, jnp.argmax(eq, 1), -1).astype(jnp.int32)
            touched = touched.at[jnp.where(found, node, M)].set(True, mode="drop")
            need = alive & ~found
            same = need[:, None] & need[None] & (cur[:, None] == cur[None]) & (tok[:, None] == tok[None])
            leader = jnp.argmax(same, 1)  # the first window that needs the same new node
            is_leader = need & (leader == wi)
            n_new = is_leader.sum()
            t = self._evict(t, n_new - (t.depth < 0).sum(), touched, hi)
            # the first W free slots, in slot order, go to the leaders in window order
            free = t.depth < 0
            rank = jnp.cumsum(free) - 1
            free_slots = jnp.full((W,), -1, jnp.int32).at[jnp.where(free, rank, W)].set(
                jnp.arange(M, dtype=jnp.int32), mode="drop")
            lrank = jnp.cumsum(is_leader) - 1
            slot = jnp.where(is_leader, free_slots[jnp.clip(lrank, 0, W - 1)], -1)
            made = slot >= 0
            at = jnp.where(made, slot, M)
            parent_anc = jnp.where(cur[:, None] >= 0, t.anc[jnp.maximum(cur, 0)], -1)
            new_anc = jnp.where(jnp.arange(Q) == d, slot[:, None], parent_anc)
            t = t._replace(token=t.token.at[at].set(tok, mode="drop"),
                           parent=t.parent.at[at].set(cur, mode="drop"),
                           depth=t.depth.at[at].set(d, mode="drop"),
                           anc=t.anc.at[at].set(new_anc, mode="drop"))
            node = jnp.where(found, node, jnp.where(need, slot[leader], -1))
            alive &= node >= 0  # refused windows stop here
            # an occurrence counts when its last token is new, or when its node was (re)created now
            count = alive & ((pos >= lo) | need)
            into = pos < t.prompt_len
            t = t._replace(
                freq_in=t.freq_in.at[jnp.where(count & into, node, M)].add(1, mode="drop"),
                freq_out=t.freq_out.at[jnp.where(count & ~into, node, M)].add(1, mode="drop"),
                stamp=t.stamp.at[jnp.where(alive, node, M)].set(hi, mode="drop"))
            touched = touched.at[jnp.where(alive, node, M)].set(True, mode="drop")
            return t, alive, node, touched  # node: the next level's parent per window

        t, *_ = jax.lax.fori_loop(0, L, level, (t, alive, jnp.full((W,), -1, jnp.int32),
                                                jnp.zeros((M,), bool)))
        return t._replace(inserted=hi)

    def _evict(self, t: LookaheadState, count, protected, now):
        """Free up to `count` slots: the least frequent, then least recent, unprotected leaves."""
        M = t.token.shape[0]
        k = min(self.levels - 1 + self.chunk, M)
        used = t.depth >= 0
        has_child = jnp.zeros((M,), bool).at[jnp.where(used & (t.parent >= 0), t.parent, M)].set(
            True, mode="drop")
        cand = used & ~has_child & ~protected
        # integer frequency first; the recency fraction (< 0.5) only breaks ties
        keep = (t.freq_in + t.freq_out).astype(jnp.float32) + 0.5 * t.stamp / (now + 1.0)
        _, victims = jax.lax.top_k(jnp.where(cand, -keep, -jnp.inf), k)
        ok = (jnp.arange(k) < count) & cand[victims]
        at = jnp.where(ok, victims, M)
        return t._replace(token=t.token.at[at].set(-1, mode="drop"),
                          parent=t.parent.at[at].set(-1, mode="drop"),
                          depth=t.depth.at[at].set(-1, mode="drop"),
                          anc=t.anc.at[at].set(-1, mode="drop"),
                          freq_in=t.freq_in.at[at].set(0, mode="drop"),
                          freq_out=t.freq_out.at[at].set(0, mode="drop"),
                          stamp=t.stamp.at[at].set(0, mode="drop"))

    def _retrieve_row(self, t: LookaheadState, tokens, length):
        """(tokens int32[N], parents int32[N], valid bool[N]) of one row's draft tree."""
        M, N, D, Q = t.token.shape[0], self.num_nodes, self.branch_length, self.max_query_length
        root = tokens[length - 1]
        best_r, best_q, best_n = jnp.int32(-1), jnp.int32(1), jnp.int32(-1)
        for q in range(1, Q + 1):  # the longest q with >= D nodes, else the most nodes (ties: longer)
            node, ok = jnp.int32(-1), length >= q
            for j in range(q):
                eq = (t.token == tokens[jnp.maximum(length - q + j, 0)]) & (t.parent == node) & (t.depth == j)
                ok &= eq.any()
                node = jnp.argmax(eq).astype(jnp.int32)
            r = jnp.where(ok, node, -1)
            n = jnp.sum((t.anc[:, q - 1] == r) & ok & (t.depth > q - 1) & (t.depth <= q - 1 + D))
            better = ok & ((n >= D) | ((best_n < D) & (n >= best_n)))
            best_r, best_q, best_n = (jnp.where(better, r, best_r), jnp.where(better, q, best_q),
                                      jnp.where(better, n, best_n))
        rel = t.depth - (best_q - 1)
        member = (best_r >= 0) & (t.anc[jnp.arange(M), best_q - 1] == best_r) & (rel >= 1) & (rel <= D)
        score = t.freq_in.astype(jnp.float32) + self.output_weight * t.freq_out.astype(jnp.float32)
        big = jnp.int32(D + 1)
        _, _, _, order = jax.lax.sort(
            (jnp.where(member, -score, jnp.inf), jnp.where(member, rel, big), -t.stamp,
             jnp.arange(M, dtype=jnp.int32)), num_keys=3)
        take = min(M, N - 1)
        sel = order[:take]
        ok = member[sel]
        # breadth-first: by depth, then by rank (score) within a depth
        _, sel, ok = jax.lax.sort((jnp.where(ok, rel[sel], big), sel, ok), num_keys=1, is_stable=True)
        if take < N - 1:
            sel = jnp.pad(sel, (0, N - 1 - take))
            ok = jnp.pad(ok, (0, N - 1 - take))
        pslot = t.parent[sel]
        match = (sel[None, :] == pslot[:, None]) & ok[None, :]
        under_root = pslot == best_r
        valid = ok & (under_root | match.any(1))
        parents = jnp.where(under_root | ~valid, 0, jnp.argmax(match, 1) + 1)
        toks = jnp.where(valid, t.token[sel], 0)
        return (jnp.concatenate([root[None], toks]).astype(jnp.int32),
                jnp.concatenate([jnp.array([-1], jnp.int32), parents.astype(jnp.int32)]),
                jnp.concatenate([jnp.array([True]), valid]))


def trie_paths(state: LookaheadState, row: int = 0) -> dict[tuple[int, ...], tuple[int, int]]:
    """Host-side view of one row's trie: {token path from depth 0: (freq_in, freq_out)}."""
    token, parent, depth, fin, fout = (np.asarray(x[row]) for x in (
        state.token, state.parent, state.depth, state.freq_in, state.freq_out))
    out = {}
    for m in np.flatnonzero(depth >= 0):
        path, n = [], m
        while n >= 0:
            path.append(int(token[n]))
            n = parent[n]
        out[tuple(path[::-1])] = (int(fin[m]), int(fout[m]))
    return out
