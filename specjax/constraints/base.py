"""The constraint protocol the decode loop runs, and the no-op constraint (every token allowed).

A constraint is a pytree carried in the loop's state: the compiled language and each row's
place in it. The engine calls, each step (all pure, shapes static):

    constraint = constraint.start(batch, max_tokens)     # in prefill: every row at the start
    nodes = constraint.nodes(tree)                       # each draft node's place (after its path)
    tree = constraint.prune(tree, nodes)                 # drop drafts that cannot be accepted
    logits = constraint.mask_logits(logits, nodes)       # the constrained target
    constraint = constraint.advance(nodes, end, token, active)   # past the accepted path

Drafters see it in `Context.constraint` (`Context.constrain` masks their own logits; `Forced`
drafts `forced_tokens`). The base class is the no-op, so the engine never branches on whether
a decode is constrained."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.pytrees import register_dataclass
from specjax.tree import DraftTree


class Constraint:
    """The protocol; every method here is the no-op (nothing is forbidden)."""

    eos_token_ids: tuple[int, ...] = ()  # ids that end a row: added to the decode's EOS list

    def check(self, vocab_size: int) -> None:
        """Raise if this constraint cannot serve a model of `vocab_size` tokens (host-side)."""

    def start(self, batch: int, max_tokens: int = 0) -> Constraint:
        """This constraint with each of `batch` rows at its start (traced, in prefill); a row
        consumes at most `max_tokens` tokens."""
        return self

    def nodes(self, tree: DraftTree | None = None, select=slice(None)):
        """Each row's place after each node's path, at the nodes `select` (tree None: the
        root's, one node): what `mask` and `advance` read."""
        return None

    def prune(self, tree: DraftTree, nodes) -> DraftTree:
        """The tree without the nodes the constraint rules out (only where that changes no law)."""
        return tree

    def mask_logits(self, logits: jax.Array, nodes) -> jax.Array:
        """logits float[B, n, V] with the tokens forbidden after each node set to -inf."""
        return logits

    def advance(self, nodes, end: jax.Array, token: jax.Array, active: jax.Array) -> Constraint:
        """Each active row moved to the place after the node `end` int32[B] and then `token`
        int32[B] (the accepted path's end and the step's next token)."""
        return self

    def forced_tokens(self, n: int, batch: int) -> tuple[jax.Array, jax.Array, Constraint]:
        """Up to n tokens the constraint fixes from each row's place (int32[B, n]), their count
        int32[B], and the constraint past them (`sj.drafters.Forced` drafts them)."""
        return jnp.zeros((batch, n), jnp.int32), jnp.zeros((batch,), jnp.int32), self


@register_dataclass
@dataclasses.dataclass(frozen=True)
class Unconstrained(Constraint):
    """No constraint: the default of every decode."""
