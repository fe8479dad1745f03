"""Drafters that draft inside the verify pass: PPD (trained prompt tokens) and Hidden Transfer
(pseudo hidden states from an intermediate layer). Both hang guess positions from the tree's
nodes (`specjax.heads.guesses`); the guesses of the last accepted node give the next tree: a
static sparse tree (Medusa's construction from per-guess per-rank accuracies) whose depth-d
nodes are the best tokens of guess d, cut at the depth that node had guesses for.

Which nodes get how many guesses is PPD's hardware-aware dynamic sparse tree, decided once per
template: `guess_budget` positions go where they pay most (`guesses.allocate`); choose the
budget, like the tree size, from the hardware's verify cost per input length (see
benchmarks/). The first step after the prefill has no guesses yet and verifies the root alone.

Trees are deterministic (q = None): Greedy is exact at temperature 0 and TopK when sampling.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax.convert import heads as ckpt
from specjax.drafters.base import Context, Drafter
from specjax.heads import hidden_transfer as ht_head
from specjax.heads import ppd as ppd_head
from specjax.heads.guesses import GuessLayout, allocate
from specjax.models import Model
from specjax.pytrees import register_dataclass
from specjax.tree import DraftTree, Template
from specjax.tree.sparse import checked_accuracy, geometric_prior, sparse_tree


@functools.lru_cache(maxsize=64)
def _guess_layout(accuracy: tuple, tree_size: int, budget: int, members: int) -> GuessLayout:
    """The guess positions of the sparse tree built from `accuracy`."""
    t = sparse_tree(accuracy, tree_size)
    counts = allocate(t.parents, t.rank, accuracy, budget, len(accuracy), members)
    return GuessLayout.build(counts, len(accuracy), members)


@dataclasses.dataclass(frozen=True)
class Guesses:
    """What one kind of guess drafter hangs from the tree's nodes: `count` guesses of `members`
    positions each, entering before decoder layer `layer`; `make(layout)` maps the nodes'
    stream entering that layer to the guesses' (`GuessLayout.injection`)."""

    count: int
    members: int
    layer: int
    make: Callable[[GuessLayout], Callable]


class GuessState(NamedTuple):
    guesses: jax.Array  # int32[B, K, R]: the last accepted node's guesses, as their best tokens
    count: jax.Array  # int32[B]: how many guesses that node had


@dataclasses.dataclass(frozen=True)
class GuessDrafter(Drafter):
    """The drafter of PPD and HiddenTransfer, which differ only in `guesses()`, the one thing
    each gives. State: a GuessState."""

    params: dict
    tree_size: int = dataclasses.field(default=8, metadata=dict(static=True))
    guess_budget: int = dataclasses.field(default=8, metadata=dict(static=True))
    accuracy: tuple | None = dataclasses.field(default=None, metadata=dict(static=True))

    def guesses(self) -> Guesses:
        raise NotImplementedError

    def __post_init__(self):  # static fields only: pytree unflattening re-runs this
        object.__setattr__(self, "accuracy", checked_accuracy(self.tree_size, self.accuracy))
        if not isinstance(self.guess_budget, int) or self.guess_budget < 1:
            raise ValueError(f"guess_budget must be an integer >= 1, got {self.guess_budget!r}")

    @property
    def members(self) -> int:
        return self.guesses().members

    # ---- the tree ------------------------------------------------------------------------------

    @property
    def _accuracy(self):
        """The measured accuracy, or a prior: guess k's rank-r token right with probability
        0.4 * 0.6^k * 0.5^r (so about 1 time in 5 none of a depth's ranks is)."""
        return self.accuracy or geometric_prior(self.guesses().count, 0.4)

    @property
    def template(self) -> Template:
        return sparse_tree(self._accuracy, self.tree_size)

    num_nodes = property(lambda self: self.tree_size)
    max_depth = property(lambda self: self.template.max_depth)

    @property
    def layout(self) -> GuessLayout:
        return _guess_layout(self._accuracy, self.tree_size, self.guess_budget, self.members)

    def check(self, target: Model) -> None:
        """The settings against the weights (not in __post_init__, which pytree unflattening
        re-runs with other leaves than arrays) and the weights against the target."""
        g = self.guesses()
        if self.guess_budget < g.members:
            raise ValueError(f"guess_budget={self.guess_budget} cannot hold one guess of "
                             f"{g.members} ensemble members")
        if self.accuracy is not None and len(self.accuracy) != g.count:
            raise ValueError(f"accuracy has {len(self.accuracy)} rows for {g.count} guesses")
        e = self.params[next(iter(self.params))].shape[-1]
        if e != target.config.hidden_size:
            raise ValueError(f"{self.name} weights are for hidden size {e}, but the target has hidden "
                             f"size {target.config.hidden_size}")

    def init(self, target, prompts, lengths, cache_len, prefill=None):
        b, ranks = prompts.shape[0], self.template.num_ranks
        return GuessState(jnp.zeros((b, self.guesses().count, ranks), jnp.int32), jnp.zeros((b,), jnp.int32))

    def propose(self, state, ctx: Context, key):
        parents, rank, depth = self.template.parents, self.template.rank, self.template.depth
        d = np.maximum(depth[1:] - 1, 0)
        drafted = state.guesses[:, d, np.maximum(rank[1:], 0)]  # [B, N-1]
        tokens = jnp.concatenate([ctx.root[:, None], drafted], axis=1)
        valid = jnp.asarray(depth)[None, :] <= state.count[:, None]
        return DraftTree.build(tokens, parents, valid=valid, max_depth=self.max_depth), state

    def injection(self, state, tree, positions):
        g = self.guesses()
        return self.layout.injection(g.layer, g.make(self.layout), tree.ancestors, positions)

    def update(self, state, ctx, tree, verdict, target_out):
        logits, count = self.layout.logits_at(target_out.logits[:, tree.num_nodes:], verdict.last_node)
        top = jax.lax.top_k(logits, state.guesses.shape[2])[1].astype(jnp.int32)
        return GuessState(top, count)

    # ---- checkpoints ---------------------------------------------------------------------------

    def save(self, folder) -> None:
        """Write the specjax format: head.json (the settings) + head.safetensors."""
        meta = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "params"}
        ckpt.save_head(folder, self.name, self.params, meta)

    @classmethod
    def load(cls, path, **settings):
        """A specjax head folder or 'tiny' (the heads shipped for the tiny target)."""
        params, stored = ckpt.read_guesses(path, cls.name)
        return cls(params, **{**stored, **settings})


@register_dataclass
@dataclasses.dataclass(frozen=True)
class PPD(GuessDrafter):
    """Parallel Prompt Decoding: trained prompt tokens (see `specjax.heads.ppd`) appended to
    the tree's nodes in the verify pass."""

    name = "ppd"

    def guesses(self) -> Guesses:
        count, members, _ = ppd_head.shape(self.params)
        return Guesses(count, members, 0, functools.partial(ppd_head.make, self.params))


@register_dataclass
@dataclasses.dataclass(frozen=True)
class HiddenTransfer(GuessDrafter):
    """Hidden Transfer: pseudo hidden states made at `transfer_layer` from each node's state
    (see `specjax.heads.hidden_transfer`), finished by the target's later layers in the verify
    pass."""

    transfer_layer: int = dataclasses.field(default=1, metadata=dict(static=True))

    name = "hidden-transfer"

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.transfer_layer, int) or self.transfer_layer < 1:
            raise ValueError(f"transfer_layer must be an integer >= 1, got {self.transfer_layer!r}")

    def guesses(self) -> Guesses:
        return Guesses(ht_head.shape(self.params)[0], 1, self.transfer_layer,
                       functools.partial(ht_head.make, self.params))

    def check(self, target: Model) -> None:
        super().check(target)
        if self.transfer_layer >= target.config.num_layers:
            raise ValueError(f"transfer_layer={self.transfer_layer} must be below the target's "
                             f"{target.config.num_layers} layers")


__all__ = ["PPD", "HiddenTransfer", "GuessDrafter", "GuessState", "Guesses"]
