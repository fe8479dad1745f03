"""Guess positions: look-ahead positions hung from the nodes of a token tree inside the target's
own forward, shared by PPD (trained prompt tokens) and Hidden Transfer (pseudo hidden states).

Node v of a tree gets `counts[v]` guesses j = 1..counts[v], each made of `members` ensemble
positions (PPD's ensemble prompt tokens; 1 otherwise). Guess (v, j, e) sits at position
pos(v) + j, sees v and its ancestors, and the guesses (v, j', e) with j' <= j of its own member
(PPD's "ensemble" mask, which is the plain causal mask when members = 1). Its output predicts
the token at pos(v) + j + 1: once v is the last accepted node, guess j drafts depth j of the next
step's tree (whose root, the bonus token, sits at pos(v) + 1). The members' logits are averaged.

The same layout serves training, with the training window as a chain of nodes.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specjax.models import Injection
from specjax.tree import row_gather
from specjax.tree.template import depths


@dataclasses.dataclass(frozen=True, eq=False)
class GuessLayout:
    """Static (numpy) indices of the guess positions of one tree template.

    node, offset, member: int[M], the node, look-ahead j (1-based) and ensemble member of each
      guess position; index: int[N, K, members], the position of (v, j, e), -1 when v has fewer
      than j guesses; counts: int[N]; mask: bool[M, M], which guess positions see which.
    """

    node: np.ndarray
    offset: np.ndarray
    member: np.ndarray
    index: np.ndarray
    counts: np.ndarray
    mask: np.ndarray

    @classmethod
    def build(cls, counts, num_guesses: int, members: int = 1) -> "GuessLayout":
        counts = np.asarray(counts, np.int32)
        if counts.ndim != 1 or counts.min(initial=0) < 0 or counts.max(initial=0) > num_guesses:
            raise ValueError(f"guess counts must be in [0, {num_guesses}] per node, got {counts}")
        cells = [(v, j, e) for v in range(len(counts)) for j in range(1, counts[v] + 1)
                 for e in range(members)]
        node, offset, member = (np.asarray(c, np.int32).reshape(-1) for c in zip(*cells)) if cells else \
            (np.zeros(0, np.int32),) * 3
        index = np.full((len(counts), num_guesses, members), -1, np.int32)
        index[node, offset - 1, member] = np.arange(len(node))
        mask = (node[:, None] == node[None, :]) & (member[:, None] == member[None, :]) & \
            (offset[None, :] <= offset[:, None])
        return cls(node, offset, member, index, counts, mask)

    @property
    def size(self) -> int:
        return len(self.node)

    def injection(self, layer: int, make, ancestors: jax.Array, positions: jax.Array) -> Injection:
        """The Injection for a tree with `ancestors` bool[B, N, N] and node `positions`
        int32[B, N]; `make(x)` maps the nodes' stream x [B, N, E] to the guesses' [B, M, E]."""
        b = positions.shape[0]
        sees_nodes = ancestors[:, self.node, :]  # [B, M, N]
        mask = jnp.concatenate([sees_nodes, jnp.broadcast_to(jnp.asarray(self.mask), (b, self.size, self.size))], 2)
        return Injection(layer, make, positions[:, self.node] + jnp.asarray(self.offset), mask)

    def logits_at(self, guess_logits: jax.Array, node: jax.Array) -> tuple[jax.Array, jax.Array]:
        """guess_logits [B, M, V] and a node per row int[B] -> (its guesses' member-averaged
        logits [B, K, V], its guess count int32[B]); guesses past the count are garbage."""
        idx = jnp.asarray(self.index)[node]  # [B, K, members]
        logits = row_gather(guess_logits, jnp.maximum(idx, 0)).mean(2)
        return logits, jnp.asarray(self.counts)[node]


def _node_values(parents: np.ndarray, rank: np.ndarray, accuracy) -> tuple[np.ndarray, np.ndarray]:
    """(value, depth) of each node of a template whose node i is the rank[i]-best guess for its
    depth. value: the estimated acceptance probability, prod of accuracy[depth - 1][rank] along
    the path (each depth's accuracies scaled to sum to at most 1, as probabilities of disjoint
    events do)."""
    accuracy = [np.asarray(row, np.float64) / max(1.0, float(np.sum(row))) for row in accuracy]
    value = np.ones(len(parents))
    depth = depths(parents)
    for i in range(1, len(parents)):
        value[i] = value[parents[i]] * accuracy[depth[i] - 1][rank[i]]
    return value, depth


def allocate(parents: np.ndarray, rank: np.ndarray, accuracy, budget: int, num_guesses: int,
             members: int = 1) -> np.ndarray:
    """PPD's hardware-aware pruning, statically: spend at most `budget` guess positions where
    they pay most. Giving node v its j-th guess is worth P(v is the last accepted node) times
    the expected tokens the next tree accepts at depth j (its depth-j node values); the worth
    drops with j, so a greedy pick gives every node a prefix 1..counts[v]."""
    value, depth = _node_values(parents, rank, accuracy)
    child_sum = np.zeros(len(parents))
    np.add.at(child_sum, parents[1:], value[1:])
    last = np.maximum(value - child_sum, 0.0)
    gain = [value[depth == j].sum() for j in range(1, num_guesses + 1)]
    offers = sorted(((-last[v] * gain[j - 1], v, j) for v in range(len(parents))
                     for j in range(1, num_guesses + 1)), key=lambda o: (o[0], o[2], o[1]))
    counts = np.zeros(len(parents), np.int32)
    for worth, v, j in offers:
        if (counts.sum() + 1) * members > budget or worth == 0:
            break
        if counts[v] == j - 1:
            counts[v] = j
    return counts


__all__ = ["GuessLayout", "allocate"]
