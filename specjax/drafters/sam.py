"""SAM: draft the continuation of the longest suffix match, found by suffix automata (SAM-Decoding).

Hu et al., "SAM Decoding: Speculative Decoding via Suffix Automaton" (ACL 2025). Each row keeps
a suffix automaton (`blocks.suffix_automaton`) of its own text, prompt then generated tokens, extended
inside the jitted loop as tokens are committed, and a match: the longest suffix of the text that
occurred earlier, with the state holding it. The draft is the chain of tokens that followed the
match's first occurrence. An optional static corpus (`SAM.with_corpus`) has its own automaton,
built once, and its own match; the longer of the two matches drafts.

The chain length follows the match length (`draft_lengths`, pairs (match >= m: draft t tokens)):
a long match is usually a copy (a summary quoting its source, code repeating a name), so it
gets a long chain, a short one a short chain, and a match shorter than every m drafts nothing,
verifying the root alone (`tree_sizes`), at the cost of an AR step.

Combined mode (the paper's SAM + auxiliary drafter): with a `fallback` drafter, a step whose
match drafts nothing uses the fallback's tree instead. The fallback must draft deterministic
trees (q None: Token Recycling, Lookahead, prompt lookup, heads) whose `update` accepts any tree
(it sees the tree that was verified); its state is updated every step.

Adapted: the automaton lags the text by one token, so a match always ends before the last
token and has a continuation; drafts come from the first occurrence (the state's least end
position, as the paper's); rows are independent. Drafts are deterministic: Greedy at T = 0,
TopK when sampling.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax.drafters.blocks import suffix_automaton as sa
from specjax.drafters.base import Context, Drafter
from specjax.pytrees import register_dataclass
from specjax.tree import DraftTree


class Corpus(NamedTuple):
    """A static corpus: its tokens int32[L] and their automaton."""

    tokens: jax.Array
    automaton: sa.Automaton


class SAMState(NamedTuple):
    """Per row (leading axis B): the text's automaton over tokens[:seen - 1], the match of
    tokens[:seen]'s suffix in it (state, length), the corpus match, the fallback's state."""

    automaton: sa.Automaton
    state: jax.Array
    matched: jax.Array
    corpus_state: jax.Array
    corpus_matched: jax.Array
    seen: jax.Array
    fallback: Any


@register_dataclass
@dataclasses.dataclass(frozen=True)
class SAM(Drafter):
    """SAM-Decoding: a chain of `t` tokens where the longest suffix match is >= `m`, for the
    pairs (m, t) of `draft_lengths` (the largest t that applies); else `fallback`'s tree, or none."""

    draft_lengths: tuple = dataclasses.field(default=((2, 3), (4, 7), (8, 15)), metadata=dict(static=True))
    corpus: Corpus | None = None
    fallback: Drafter | None = None

    name = "sam"

    def __post_init__(self):
        pairs = self.draft_lengths
        ok = (isinstance(pairs, tuple) and pairs and all(isinstance(p, tuple) and len(p) == 2 for p in pairs)
              and all(isinstance(x, int) and x >= 1 for p in pairs for x in p)
              and list(pairs) == sorted(pairs) and len({p[0] for p in pairs}) == len(pairs))
        if not ok:
            raise ValueError(f"draft_lengths must be ascending pairs (min match >= 1, tokens >= 1) "
                             f"with distinct matches, got {pairs!r}")
        if self.fallback is not None and not isinstance(self.fallback, Drafter):
            raise TypeError(f"fallback must be a specjax drafter, got {type(self.fallback).__name__}")

    @classmethod
    def with_corpus(cls, tokens, **settings) -> "SAM":
        """A SAM that also matches a static corpus of token ids (built once, here)."""
        tokens = np.asarray(tokens, np.int32).reshape(-1)
        if tokens.size < 2:
            raise ValueError(f"a corpus needs at least 2 tokens, got {tokens.size}")
        return cls(corpus=Corpus(jnp.asarray(tokens), sa.build(tokens)), **settings)

    @property
    def chain_nodes(self) -> int:
        return max(t for _, t in self.draft_lengths) + 1

    @property
    def num_nodes(self) -> int:
        return max(self.chain_nodes, 0 if self.fallback is None else self.fallback.num_nodes)

    @property
    def max_depth(self) -> int:
        return max(self.chain_nodes - 1, 0 if self.fallback is None else self.fallback.max_depth)

    @property
    def tree_sizes(self) -> tuple[int, ...]:
        """The root alone when nothing matched, else the chain's (or the fallback's) sizes."""
        sizes = {1, self.num_nodes, *(t + 1 for _, t in self.draft_lengths)}
        if self.fallback is not None:
            sizes |= set(self.fallback.tree_sizes)
        return tuple(sorted(sizes))

    @property
    def target_layers(self) -> tuple[int, ...]:
        return () if self.fallback is None else self.fallback.target_layers

    def check(self, target) -> None:
        if self.corpus is not None and int(jnp.max(self.corpus.tokens)) >= target.config.vocab_size:
            raise ValueError(f"the corpus has token ids outside the target's vocabulary "
                             f"[0, {target.config.vocab_size})")
        if self.fallback is not None:
            self.fallback.check(target)

    # ---- the protocol ---------------------------------------------------------------------------

    def init(self, target, prompts, lengths, cache_len, prefill=None):
        """Empty automata (the prompt goes in at the first `propose`); the corpus match of each
        prompt's first token."""
        b = prompts.shape[0]
        auto = jax.tree.map(lambda x: jnp.broadcast_to(x, (b, *x.shape)), sa.empty(cache_len))
        zero = jnp.zeros((b,), jnp.int32)
        cs, cm = zero, zero
        if self.corpus is not None:
            cs, cm = jax.vmap(sa.match, (None, 0, 0, 0))(self.corpus.automaton, zero, zero, prompts[:, 0])
        fb = None if self.fallback is None else self.fallback.init(target, prompts, lengths, cache_len, prefill)
        return SAMState(auto, zero, zero, cs, cm, jnp.ones((b,), jnp.int32), fb)

    def propose(self, state: SAMState, ctx: Context, key):
        state = self.advance(state, ctx.tokens, ctx.length)
        tree = self.retrieve(state, ctx)
        if self.fallback is None:
            return tree, state
        fb_key, _ = jax.random.split(key)
        other, fb_state = self.fallback.propose(state.fallback, ctx, fb_key)
        if other.q is not None:
            raise ValueError(f"SAM's fallback must draft deterministic trees; {self.fallback.name} samples its drafts")
        use = tree.valid[:, 1:].any(1)
        n = self.num_nodes
        a, b = _padded(tree, n), _padded(other, n)
        pick = lambda x, y: jnp.where(use[:, None], x, y)
        merged = DraftTree.build(pick(a[0], b[0]), pick(a[1], b[1]), valid=pick(a[2], b[2]),
                                 max_depth=self.max_depth)
        return merged, state._replace(fallback=fb_state)

    def update(self, state: SAMState, ctx, tree, verdict, target_out):
        if self.fallback is None:
            return state
        return state._replace(fallback=self.fallback.update(state.fallback, ctx, tree, verdict, target_out))

    # ---- matching -------------------------------------------------------------------------------

    def advance(self, state: SAMState, tokens: jax.Array, length: jax.Array) -> SAMState:
        """Take in the committed tokens int32[B, S] up to `length` int32[B]."""
        corpus = None if self.corpus is None else self.corpus.automaton
        fields = state._replace(fallback=None)
        return jax.vmap(lambda s, t, n: _advance_row(s, t, n, corpus))(fields, tokens, length)._replace(
            fallback=state.fallback)

    def retrieve(self, state: SAMState, ctx: Context) -> DraftTree:
        """The chain after the longer match (the text's, else the corpus's), sized by its length."""
        tokens, length = ctx.tokens, ctx.length
        b, s = tokens.shape
        k = jnp.zeros((b,), jnp.int32)
        own = jnp.maximum(state.matched, 0)
        longer = own
        if self.corpus is not None:
            longer = jnp.maximum(own, state.corpus_matched)
        for m, t in self.draft_lengths:
            k = jnp.where(longer >= m, t, k)
        steps = jnp.arange(1, self.chain_nodes)[None, :]
        first_end = jnp.take_along_axis(state.automaton.first_end, state.state[:, None], axis=1)[:, 0]
        pos = first_end[:, None] + steps
        draft = jnp.take_along_axis(tokens, jnp.clip(pos, 0, s - 1), axis=1)
        valid = (steps <= k[:, None]) & (pos < length[:, None])
        if self.corpus is not None:
            corpus_tokens = self.corpus.tokens
            c_end = self.corpus.automaton.first_end[state.corpus_state]
            c_pos = c_end[:, None] + steps
            c_draft = corpus_tokens[jnp.clip(c_pos, 0, corpus_tokens.shape[0] - 1)]
            use_corpus = (state.corpus_matched > own)[:, None]
            draft = jnp.where(use_corpus, c_draft, draft)
            valid = jnp.where(use_corpus, (steps <= k[:, None]) & (c_pos < corpus_tokens.shape[0]), valid)
        valid = jnp.cumprod(valid, axis=1).astype(bool)
        tree_tokens = jnp.concatenate([ctx.root[:, None], jnp.where(valid, draft, 0)], axis=1)
        valid = jnp.concatenate([jnp.ones((b, 1), bool), valid], axis=1)
        parents = np.arange(self.chain_nodes, dtype=np.int32) - 1
        return DraftTree.build(tree_tokens, parents, valid=valid, max_depth=self.chain_nodes - 1)


def _advance_row(st: SAMState, tokens, length, corpus: sa.Automaton | None) -> SAMState:
    """One row: for each new token t_i (i = seen .. length - 1), add t_{i-1} to the automaton
    (moving the match to the clone when its state was split below its length), then match t_i."""
    def body(st):
        i = st.seen
        auto, q, clone = sa.extend(st.automaton, tokens[i - 1])
        state = jnp.where((st.state == q) & (st.matched <= auto.length[jnp.maximum(clone, 0)]), clone, st.state)
        state, matched = sa.match(auto, state, st.matched, tokens[i])
        cs, cm = st.corpus_state, st.corpus_matched
        if corpus is not None:
            cs, cm = sa.match(corpus, cs, cm, tokens[i])
        return st._replace(automaton=auto, state=state, matched=matched, corpus_state=cs,
                           corpus_matched=cm, seen=i + 1)

    return jax.lax.while_loop(lambda st: st.seen < length, body, st)


def _padded(tree: DraftTree, n: int):
    """(tokens, parents, valid) of a tree padded with invalid nodes to n nodes."""
    pad = n - tree.num_nodes
    if pad == 0:
        return tree.tokens, tree.parents, tree.valid
    b = tree.tokens.shape[0]
    return (jnp.pad(tree.tokens, ((0, 0), (0, pad))),
            jnp.concatenate([tree.parents, jnp.zeros((b, pad), jnp.int32)], axis=1),
            jnp.pad(tree.valid, ((0, 0), (0, pad))))
