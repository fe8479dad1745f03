"""Medusa's static sparse tree, shared by the drafters that draft it (Medusa, Clover, PPD,
Hidden Transfer): the `num_nodes - 1` highest-valued rank paths of a per-depth per-rank accuracy
table (measured on held-out text by the trainer), or of a geometric prior when nothing was
measured. Plain data and functions; a drafter holds `tree_size` and `accuracy` fields and asks
`sparse_tree(...)` for its `Template`."""

from __future__ import annotations

import functools
import heapq

import numpy as np

from specjax.tree.template import Template, depths

DEFAULT_RANKS = 10

Accuracy = tuple[tuple[float, ...], ...]


def geometric_prior(depths: int, scale: float, ranks: int = DEFAULT_RANKS) -> Accuracy:
    """A prior when nothing was measured: depth k's rank-r token is right with probability
    scale * 0.6^k * 0.5^r (Medusa's heads use scale 0.6, PPD-style guesses 0.4)."""
    return tuple(tuple(scale * 0.6 ** k * 0.5 ** r for r in range(ranks)) for k in range(depths))


def checked_accuracy(tree_size, accuracy) -> Accuracy | None:
    """Validate a drafter's `tree_size` and `accuracy` settings; the accuracy as a float table."""
    if not isinstance(tree_size, int) or tree_size < 2:
        raise ValueError(f"tree_size must be an integer >= 2, got {tree_size!r}")
    if accuracy is None:
        return None
    acc = tuple(tuple(float(a) for a in row) for row in accuracy)
    if not acc or not acc[0] or len({len(row) for row in acc}) != 1:
        raise ValueError("accuracy must be a non-empty [depth][rank] table with rows of equal length")
    return acc


@functools.lru_cache(maxsize=64)
def medusa_tree(accuracy: Accuracy, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Medusa's sparse tree: the num_nodes - 1 paths (r_1..r_d) of highest value
    prod_j accuracy[j][r_j] (r_j = rank of the token head j-1 proposes), taken greedily (the value
    only drops along a path, so they form a tree), breadth-first with siblings in rank order.
    Returns (parents int32[N], rank int32[N]) (the root has rank -1)."""
    heads, ranks = len(accuracy), len(accuracy[0])
    heap = [(-accuracy[0][r], (r,)) for r in range(ranks)]
    heapq.heapify(heap)
    chosen = []
    while heap and len(chosen) < num_nodes - 1:
        neg, path = heapq.heappop(heap)
        chosen.append(path)
        if len(path) < heads:
            for r in range(ranks):
                heapq.heappush(heap, (neg * accuracy[len(path)][r], path + (r,)))
    if len(chosen) < num_nodes - 1:
        raise ValueError(f"a Medusa tree of {num_nodes} nodes needs more than {heads} heads x {ranks} ranks")
    chosen.sort(key=lambda p: (len(p), p))
    index = {p: i + 1 for i, p in enumerate(chosen)}
    parents = [-1] + [index[p[:-1]] if len(p) > 1 else 0 for p in chosen]
    rank = [-1] + [p[-1] for p in chosen]
    return np.asarray(parents, np.int32), np.asarray(rank, np.int32)


@functools.lru_cache(maxsize=64)
def sparse_tree(accuracy: Accuracy, num_nodes: int) -> Template:
    """The template of `num_nodes` nodes built from `accuracy` (see `medusa_tree`); a node's
    rank is that of its token among its parent's proposals."""
    parents, rank = medusa_tree(accuracy, num_nodes)
    return Template(parents, rank, depths(parents))
