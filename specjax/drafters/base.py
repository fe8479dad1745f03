"""The drafter protocol, the context the engine hands a drafter, and the empty drafter (AR).

A drafter is a frozen dataclass registered as a pytree: its settings are static metadata and
its arrays (a draft model's params, head weights) are pytree leaves, so it is passed to `jit`
as an ordinary argument. Its three pure functions, optax-style:

    state = drafter.init(target, prompts, lengths, cache_len, prefill)  # after the target's prefill
    tree, state = drafter.propose(state, ctx, key)                   # tree.tokens[:, 0] = root
    inject = drafter.injection(state, tree, positions)               # extra verify-pass inputs
    state = drafter.update(state, ctx, tree, verdict, target_out)   # after verify and commit

A drafter's state is a NamedTuple of its own (`EmptyState` when it keeps none), optax-style.
`propose` returns the state too, because proposing may write a draft model's KV cache. The
target itself comes in `ctx.model` (and to `init` as `target`), so a head drafter reads the
target's embedding and LM head from there instead of carrying copies in its state.
`injection` (None for most drafters) appends positions to the target's verify forward, for
drafters that draft inside it (PPD, Hidden Transfer); `update` then sees their outputs after
the tree's in `target_out`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import numpy as np

from specjax import verify
from specjax.constraints.base import Constraint, Unconstrained
from specjax.models import ForwardOutput, Injection, KVCache, Model
from specjax.pytrees import register_dataclass
from specjax.sampling import SamplingParams
from specjax.tree import DraftTree, Verdict, row_gather


class EmptyState(NamedTuple):
    """The state of a drafter that keeps none."""


class Context(NamedTuple):
    """What the engine knows when a step starts (`DecodeState.context` derives it).

    tokens: int32[B, S], each row's committed tokens (prompt, then generated), padded with 0;
    length: int32[B], committed tokens per row; the root (not yet in the target's cache) is
      tokens[b, length[b] - 1];
    sampling: the static SamplingParams, which drafters apply to their own logits too;
    model: the target Model being decoded (its params are the loop's, not a copy);
    cache: the target's KVCache, slots [0, length - 1) committed (self-drafters read it);
    constraint: the decode's `sj.constraints.Constraint`, each row at the root's place
      (`Unconstrained` when there is none). Drafters that sample mask their logits with
      `constrain`, so their drafts follow the constraint too.
    """

    tokens: jax.Array
    length: jax.Array
    sampling: SamplingParams
    model: Model | None = None
    cache: KVCache | None = None
    constraint: Constraint = Unconstrained()

    @property
    def root(self) -> jax.Array:
        return row_gather(self.tokens, self.length - 1)

    def constrain(self, logits: jax.Array, tree: DraftTree | None = None, nodes=slice(0, 1)) -> jax.Array:
        """logits float[B, n, V] of the tree nodes `nodes` (a slice of n nodes; tree None: the
        root) with the tokens the constraint forbids after each node's path masked."""
        return self.constraint.mask_logits(logits, self.constraint.nodes(tree, nodes))


@dataclasses.dataclass(frozen=True)
class Drafter:
    """Base class. Subclasses set `num_nodes` and `max_depth` (static) and the three functions."""

    name = "drafter"

    @property
    def num_nodes(self) -> int:
        raise NotImplementedError

    @property
    def max_depth(self) -> int:
        raise NotImplementedError

    @property
    def tree_sizes(self) -> tuple[int, ...]:
        """The node counts the engine may verify a tree at, ascending, the last `num_nodes`:
        each step runs the smallest that holds the valid nodes (one compiled forward each)."""
        return (self.num_nodes,)

    @property
    def target_layers(self) -> tuple[int, ...]:
        """Decoder layers whose outputs `update` reads from the target (heads use them)."""
        return ()

    def default_verifier(self, sampling: SamplingParams) -> verify.Verifier:
        """The exact rule that fits this drafter's trees at these sampling settings."""
        return verify.Greedy() if sampling.greedy else verify.TopK()

    def check(self, target: Model) -> None:
        """Raise a clear error if this drafter cannot serve `target` (host-side, before jit)."""

    @property
    def supports_forced(self) -> bool:
        """Whether `Forced` can wrap this drafter: its state must keep without `update` and it
        must add no `injection`, since the verify pass sees the combined tree, not its own."""
        return type(self).update is Drafter.update and type(self).injection is Drafter.injection

    @property
    def supports_chain(self) -> bool:
        """Whether `chain(k)` gives this drafter's chain of k tokens (`sj.Adaptive` needs one)."""
        return False

    def chain(self, k: int) -> "Drafter":
        """This drafter drafting a chain of k >= 1 tokens, for drivers that choose the length
        each step (`specjax.adaptive`); its state must survive the steps it does not draft.
        Drafters whose `supports_chain` is true override this."""
        raise ValueError(f"{self.name} has no chain form (supports_chain is false)")

    def init(self, target: Model, prompts: jax.Array, lengths: jax.Array, cache_len: int,
             prefill: ForwardOutput | None = None) -> Any:
        """The state after the target's prefill. `prefill`: the target's output over
        prompts[:, :-1] (None for one-token prompts): its `hidden` [B,T-1,E] and `layer_hidden`
        (the `target_layers`); head drafters start from it, the rest ignore it."""
        return EmptyState()

    def propose(self, state, ctx: Context, key: jax.Array) -> tuple[DraftTree, Any]:
        raise NotImplementedError

    def injection(self, state, tree: DraftTree, positions: jax.Array) -> Injection | None:
        """Extra positions for the verify forward, given the tree's `positions` int32[B, N]."""
        return None

    def update(self, state, ctx: Context, tree: DraftTree, verdict: Verdict,
               target_out: ForwardOutput) -> Any:
        return state


@register_dataclass
@dataclasses.dataclass(frozen=True)
class NoDrafter(Drafter):
    """Plain autoregressive decoding: the tree is the root alone."""

    name = "ar"
    num_nodes = 1
    max_depth = 0

    def propose(self, state, ctx, key):
        return DraftTree.build(ctx.root[:, None], np.array([-1], np.int32), max_depth=0), state

