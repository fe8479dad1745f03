"""TokenAutomaton: a token-level DFA laid out as compact device arrays, and its pure functions.

Layout (S states, padded to a bucket; V the model's vocabulary; E transitions):

  mask:       uint32[S, ceil(V/32)]  bit t of row s: token t is allowed in state s
  offsets:    int32[S + 1]           state s's transitions are entries offsets[s]:offsets[s+1]
  tokens:     int32[E]               their tokens, ascending within each state
  next_state: int32[E]               and the states they lead to
  forced:     int32[S]               the token a state's forced text starts with, else -1: certain
                                     where the state allows one token, a prediction elsewhere
                                     (`forced_text`)

A dense [S, V] next-state table would be S * 49152 * 4 bytes (200 MB at 1000 states); the
bitmask is 1/32 of that, and the transitions are stored once each (CSR), found by a binary
search of fixed depth (log2 V gathers, vectorised over every row and tree node). State `dead`
(the last row) is where a token the constraint forbids leads: it allows every token, so a
draft node below a forbidden token gets a finite distribution; it is never reached by an
accepted path, because forbidden tokens have probability zero under the constrained target.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np

from specjax.constraints.base import Constraint
from specjax.pytrees import register_dataclass
from specjax.tree import DraftTree, row_gather


@register_dataclass
@dataclasses.dataclass(frozen=True)
class TokenAutomaton(Constraint):
    """A compiled constraint (a pytree: arrays are leaves, sizes static). Build with
    `sj.constraints.json_schema` / `sj.constraints.regex` or `TokenAutomaton.from_transitions`.
    `state` int32[B] is each row's state once the decode loop has `start`ed it (None before)."""

    mask: jax.Array
    offsets: jax.Array
    tokens: jax.Array
    next_state: jax.Array
    forced: jax.Array
    initial: jax.Array  # int32[]: the start state
    vocab_size: int = dataclasses.field(metadata=dict(static=True))
    eos_token_ids: tuple[int, ...] = dataclasses.field(default=(), metadata=dict(static=True))
    state: jax.Array | None = None

    @property
    def num_states(self) -> int:
        """Rows, the dead state and bucket padding included."""
        return self.mask.shape[0]

    @property
    def dead(self) -> int:
        return self.num_states - 1

    @classmethod
    def from_transitions(cls, transitions: dict[int, dict[int, int]], initial: int, vocab_size: int,
                         eos_token_ids: tuple[int, ...] = (), forced: dict[int, int] | None = None
                         ) -> TokenAutomaton:
        """From {state: {token: next state}} (integer state ids). forced: {state: token}, the
        drafts of states that allow more than one token (`forced_text.forced_first_tokens`).
        Sizes are padded to powers of two, so constraints of similar size share one compiled
        program."""
        src = np.concatenate([np.full(len(t), s, np.int64) for s, t in transitions.items()] + [[]])
        tok = np.concatenate([np.fromiter(t, np.int64, len(t)) for t in transitions.values()] + [[]])
        dst = np.concatenate([np.fromiter(t.values(), np.int64, len(t)) for t in transitions.values()] + [[]])
        names = np.unique(np.concatenate([src, dst, [initial]]))  # state ids -> rows 0..
        src, dst = np.searchsorted(names, src), np.searchsorted(names, dst).astype(np.int32)
        rows = _bucket(len(names) + 1)
        dead = rows - 1
        if tok.size and (tok.min() < 0 or tok.max() >= vocab_size):
            raise ValueError(f"a transition's token is outside the vocabulary [0, {vocab_size})")
        order = np.lexsort((tok, src))
        src, tok, dst = src[order].astype(np.int32), tok[order].astype(np.int32), dst[order]
        counts = np.bincount(src, minlength=rows)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        forced_at = np.full(rows, -1, np.int32)
        if forced:
            forced_at[np.searchsorted(names, list(forced))] = list(forced.values())
        forced_at[counts == 1] = tok[offsets[:-1][counts == 1]]
        words = -(-vocab_size // 32)
        bits = np.zeros((rows, words * 32), bool)
        bits[src, tok] = True
        bits[len(names):] = True  # the dead state and the padding rows allow every token
        edges = _bucket(max(len(tok), 1))
        toks = np.concatenate([tok, np.full(edges - len(tok), vocab_size, np.int32)])  # sorts last
        nxt = np.concatenate([dst, np.full(edges - len(dst), dead, np.int32)])
        packed = np.packbits(bits.reshape(rows, words, 32)[..., ::-1], axis=-1).view(">u4")[..., 0]
        return cls(jnp.asarray(packed.astype(np.uint32)), jnp.asarray(offsets), jnp.asarray(toks),
                   jnp.asarray(nxt), jnp.asarray(forced_at), jnp.asarray(np.searchsorted(names, initial), jnp.int32),
                   vocab_size, tuple(eos_token_ids))

    # ---- the decode loop's protocol (`Constraint`) ---------------------------------------------

    def check(self, vocab_size: int) -> None:
        if self.vocab_size > vocab_size:
            raise ValueError(f"the constraint was built for a vocabulary of {self.vocab_size} "
                             f"tokens, the model has {vocab_size}")

    def start(self, batch: int, max_tokens: int = 0) -> TokenAutomaton:
        return dataclasses.replace(self, state=jnp.full((batch,), self.initial, jnp.int32))

    def nodes(self, tree: DraftTree | None = None, select=slice(None)) -> jax.Array:
        """int32[B, n]: the state after each selected node's path (tree None: the root's)."""
        return self.state[:, None] if tree is None else self.node_states(tree, self.state)[:, select]

    def advance(self, nodes: jax.Array, end: jax.Array, token: jax.Array, active: jax.Array) -> TokenAutomaton:
        at_end = row_gather(nodes, end)
        return dataclasses.replace(self, state=jnp.where(active, self.step(at_end, token), self.state))

    def forced_tokens(self, n: int, batch: int) -> tuple[jax.Array, jax.Array, TokenAutomaton]:
        """The `forced` chain from each row's state, stopped at the first state without one
        and before EOS (an end is not drafted)."""
        eos = jnp.array(self.eos_token_ids or (-1,))

        def follow(carry, _):
            state, alive = carry
            t = self.forced[state]
            alive &= (t >= 0) & ~jnp.isin(t, eos)
            return (jnp.where(alive, self.step(state, t), state), alive), (jnp.where(alive, t, 0), alive)

        (state, _), (tokens, alive) = jax.lax.scan(follow, (self.state, jnp.ones((batch,), bool)), length=n)
        return tokens.T, alive.sum(0, dtype=jnp.int32), dataclasses.replace(self, state=state)

    # ---- device functions (pure; any leading shape) -------------------------------------------

    def allowed(self, states: jax.Array) -> jax.Array:
        """bool[..., V]: the tokens each state allows."""
        words = self.mask[states]  # [..., W]
        bits = (words[..., None] >> jnp.arange(32, dtype=jnp.uint32)) & 1
        return bits.reshape(*states.shape, -1)[..., : self.vocab_size].astype(bool)

    def step(self, states: jax.Array, tokens: jax.Array) -> jax.Array:
        """int32[...]: the state after each token (`dead` where the state forbids it)."""
        def halve(_, bounds):  # lower-bound binary search within each state's transitions
            lo, hi = bounds
            mid = (lo + hi) // 2
            go_right = (lo < hi) & (self.tokens[jnp.minimum(mid, self.tokens.shape[0] - 1)] < tokens)
            return jnp.where(go_right, mid + 1, lo), jnp.where(go_right, hi, mid)

        rounds = int(np.ceil(np.log2(self.vocab_size + 1)))
        lo, _ = jax.lax.fori_loop(0, rounds, halve, (self.offsets[states], self.offsets[states + 1]))
        at = jnp.minimum(lo, self.tokens.shape[0] - 1)
        found = (lo < self.offsets[states + 1]) & (self.tokens[at] == tokens)
        return jnp.where(found, self.next_state[at], self.dead).astype(jnp.int32)

    def node_states(self, tree: DraftTree, root_states: jax.Array) -> jax.Array:
        """int32[B, N]: the state after each node's path, given the state after the root
        (root_states int32[B]): every node's state advanced along its own path."""
        parents = jnp.maximum(tree.parents, 0)

        def advance(_, states):  # after d rounds, nodes of depth <= d are right
            parent_states = jnp.take_along_axis(states, parents, axis=1)
            return jnp.where(tree.parents >= 0, self.step(parent_states, tree.tokens), states)

        start = jnp.broadcast_to(root_states[:, None], tree.tokens.shape).astype(jnp.int32)
        return jax.lax.fori_loop(0, tree.max_depth, advance, start)

    def mask_logits(self, logits: jax.Array, states: jax.Array) -> jax.Array:
        """logits float[..., V] with the tokens `states` int[...] forbid set to -inf; sampling
        then renormalises over the allowed tokens (top-k / top-p among them)."""
        v = logits.shape[-1]
        allowed = self.allowed(states)
        if v > self.vocab_size:
            allowed = jnp.pad(allowed, [(0, 0)] * states.ndim + [(0, v - self.vocab_size)])
        return jnp.where(allowed[..., :v], logits, -jnp.inf)

    def prune(self, tree: DraftTree, node_states: jax.Array) -> DraftTree:
        """The tree without the nodes whose token their parent's state forbids (their state is
        `dead`). Only for deterministic drafts (q None): there a forbidden node is rejected
        with certainty and leaves the residual as it was, so removing it changes no law; a
        tree with draft distributions is returned as it is."""
        if tree.q is not None:
            return tree
        return DraftTree.build(tree.tokens, tree.parents, valid=tree.valid & (node_states != self.dead),
                               max_depth=tree.max_depth)


def _bucket(n: int) -> int:
    return max(8, 1 << (int(n) - 1).bit_length())


MAX_REPEATS = 64  # a regex whose repetitions multiply to more runs on the host (llguidance)
MAX_PATTERN = 2048


def fits_on_device(pattern: str) -> bool:
    """Whether `pattern`'s token automaton is small enough to build and carry on the device:
    no unbounded repetition (a free string's state allows ~the whole vocabulary, and many of them
    grow outlines-core's index quadratically) and at most MAX_REPEATS repetitions in all (nested
    ones multiply). Decided from the regex's syntax, before anything is built."""
    import re._parser as parser

    if len(pattern) > MAX_PATTERN:
        return False
    try:
        return _repeats(parser.parse(pattern)) <= MAX_REPEATS
    except (re.error, RecursionError, OverflowError):
        return False


def _repeats(items) -> float:
    import re._constants as c

    total = 0.0
    for op, arg in items:
        if op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
            low, high, inner = arg
            if high == c.MAXREPEAT:
                return float("inf")
            total += high * max(1.0, _repeats(inner))
        elif op is c.SUBPATTERN:
            total += _repeats(arg[-1])
        elif op is c.BRANCH:
            total += sum(_repeats(branch) for branch in arg[1])
        elif op in (c.ATOMIC_GROUP, c.ASSERT, c.ASSERT_NOT):
            total += _repeats(arg[-1])
    return total
