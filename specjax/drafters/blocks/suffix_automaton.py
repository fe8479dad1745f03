"""A suffix automaton in fixed-capacity device arrays, extended one token at a time under jit.

The classic online construction (Blumer et al. 1985): a text of n tokens has at most 2n states
and 3n transitions. One row's automaton is an `Automaton` of arrays (vmap it for a batch):

    states (capacity C = 2n + 1; state 0 is the root, the empty string):
      length int32[C]   the longest string of the state
      link int32[C]     the suffix link (-1 at the root and in free slots)
      first_end int32[C]  where the state's strings end first in the text (its least end position)
      head int32[C]     the state's first transition slot (-1: none), the rest chained by `next`
    transitions: an open-addressing hash table of H = 2^k >= 6n + 2 slots (load <= 1/2), keyed
      by (state, token) and probed linearly in windows of 8 slots (no deletions, so the first
      empty slot ends a search); a 49k vocabulary needs no dense [C, V] table:
      src, token, dst, next int32[H] (src -1 = empty; next: the source state's next transition)

Each `extend` is the textbook step; cloning a state copies its transitions by walking its list,
so a token costs O(1) amortised lookups, each O(1) expected probes. `match` advances a
longest-suffix match (state, matched length) by one token, following suffix links on a
mismatch (matching statistics); it is O(1) amortised too.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

_WINDOW = 8  # hash slots read per probe


class Automaton(NamedTuple):
    """One text's suffix automaton (see the module docstring); `size` states used, `last` the
    state of the whole text, `text_len` tokens added."""

    length: jax.Array
    link: jax.Array
    first_end: jax.Array
    head: jax.Array
    src: jax.Array
    token: jax.Array
    dst: jax.Array
    next: jax.Array
    size: jax.Array
    last: jax.Array
    text_len: jax.Array


def capacity(max_tokens: int) -> tuple[int, int]:
    """(states, hash slots) for a text of up to `max_tokens` tokens."""
    return 2 * max_tokens + 1, max(_WINDOW, 1 << int(6 * max_tokens + 2 - 1).bit_length())


def empty(max_tokens: int) -> Automaton:
    """The automaton of the empty text, with room for `max_tokens` tokens."""
    c, h = capacity(max_tokens)
    neg_c, neg_h = jnp.full((c,), -1, jnp.int32), jnp.full((h,), -1, jnp.int32)
    zero = jnp.int32(0)
    return Automaton(jnp.zeros((c,), jnp.int32), neg_c, neg_c, neg_c, neg_h, neg_h, neg_h, neg_h,
                     jnp.int32(1), zero, zero)


def _probe(a: Automaton, state, tok):
    """(slot, found): the slot holding transition (state, tok), else the empty slot it would take."""
    mask = a.src.shape[0] - 1
    h = (state.astype(jnp.uint32) * jnp.uint32(0x9E3779B1)) ^ (tok.astype(jnp.uint32) * jnp.uint32(0x85EBCA6B))
    h = ((h ^ (h >> 15)) & jnp.uint32(mask)).astype(jnp.int32)

    def stops(h):
        idx = (h + jnp.arange(_WINDOW)) & mask
        return idx, ((a.src[idx] == state) & (a.token[idx] == tok)) | (a.src[idx] < 0)

    h = jax.lax.while_loop(lambda h: ~stops(h)[1].any(), lambda h: h + _WINDOW, h)
    idx, stop = stops(h)
    slot = idx[jnp.argmax(stop)]
    return slot, a.src[slot] == state


def transition(a: Automaton, state, tok):
    """The state reached from `state` by `tok`, or -1."""
    slot, found = _probe(a, state, tok)
    return jnp.where(found, a.dst[slot], -1)


def _add(a: Automaton, state, tok, dst, do) -> Automaton:
    """Add transition (state, tok) -> dst where `do` (it must be absent)."""
    slot, _ = _probe(a, state, tok)
    at = jnp.where(do, slot, a.src.shape[0])
    owner = jnp.where(do, state, a.head.shape[0])
    return a._replace(src=a.src.at[at].set(state, mode="drop"), token=a.token.at[at].set(tok, mode="drop"),
                      dst=a.dst.at[at].set(dst, mode="drop"),
                      next=a.next.at[at].set(a.head[jnp.maximum(state, 0)], mode="drop"),
                      head=a.head.at[owner].set(slot, mode="drop"))


def extend(a: Automaton, tok) -> tuple[Automaton, jax.Array, jax.Array]:
    """Append `tok` to the text. Returns (automaton, q, clone): when the step split state q,
    its strings of length <= length[clone] now belong to `clone` (else q = clone = -1)."""
    pos = a.text_len
    cur = a.size
    a = a._replace(length=a.length.at[cur].set(a.length[a.last] + 1),
                   first_end=a.first_end.at[cur].set(pos), size=a.size + 1)

    def absent(carry):
        a, p = carry
        return (p >= 0) & (transition(a, jnp.maximum(p, 0), tok) < 0)

    def add_and_climb(carry):
        a, p = carry
        return _add(a, p, tok, cur, True), a.link[p]

    a, p = jax.lax.while_loop(absent, add_and_climb, (a, a.last))
    q = transition(a, jnp.maximum(p, 0), tok)
    solid = (p >= 0) & (a.length[jnp.maximum(p, 0)] + 1 == a.length[jnp.maximum(q, 0)])
    split = (p >= 0) & ~solid
    clone = jnp.where(split, a.size, -1)
    qs, cs = jnp.maximum(q, 0), jnp.maximum(clone, 0)
    a = a._replace(
        length=jnp.where(split, a.length.at[cs].set(a.length[jnp.maximum(p, 0)] + 1), a.length),
        first_end=jnp.where(split, a.first_end.at[cs].set(a.first_end[qs]), a.first_end),
        link=jnp.where(split, a.link.at[cs].set(a.link[qs]), a.link),
        size=a.size + split)

    def copy(carry):  # the clone gets q's transitions
        a, e = carry
        return _add(a, clone, a.token[e], a.dst[e], True), a.next[e]

    a, _ = jax.lax.while_loop(lambda c: c[1] >= 0, copy, (a, jnp.where(split, a.head[qs], -1)))

    def points_to_q(carry):
        a, p = carry
        return (p >= 0) & (transition(a, jnp.maximum(p, 0), tok) == q)

    def redirect(carry):
        a, p = carry
        slot, _ = _probe(a, p, tok)
        return a._replace(dst=a.dst.at[slot].set(clone)), a.link[p]

    a, _ = jax.lax.while_loop(points_to_q, redirect, (a, jnp.where(split, p, -1)))
    cur_link = jnp.where(p < 0, 0, jnp.where(solid, q, clone))
    link = a.link.at[cur].set(cur_link)
    link = jnp.where(split, link.at[qs].set(clone), link)
    a = a._replace(link=link, last=cur, text_len=pos + 1)
    return a, jnp.where(split, q, -1), clone


def match(a: Automaton, state, matched, tok):
    """Advance a match (state, matched length) of the text's suffix by `tok`: the longest suffix
    of (matched string + tok) that is a substring of the automaton's text, as (state, length)."""
    def missing(c):
        s, _ = c
        return (s > 0) & (transition(a, s, tok) < 0)

    state, matched = jax.lax.while_loop(missing, lambda c: (a.link[c[0]], a.length[a.link[c[0]]]),
                                        (state, matched))
    nxt = transition(a, state, tok)
    return jnp.where(nxt >= 0, nxt, 0), jnp.where(nxt >= 0, matched + 1, 0)


def build(tokens: np.ndarray) -> Automaton:
    """The automaton of a whole token sequence (a static corpus), built on the device."""
    tokens = jnp.asarray(np.asarray(tokens, np.int32).reshape(-1))

    @jax.jit
    def run(tokens):
        return jax.lax.fori_loop(0, tokens.shape[0], lambda i, a: extend(a, tokens[i])[0],
                                 empty(tokens.shape[0]))

    return run(tokens)
