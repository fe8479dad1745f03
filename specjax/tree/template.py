"""Static tree templates: a tree shape fixed before tracing (numpy, root first) that a drafter
fills with tokens level by level.

A template is written as parent indices (parents[0] = -1, 0 <= parents[i] < i) or as rank
paths (one tuple (r_1, ..., r_d) per non-root node, each after its parent). A node's rank says
which of its parent's proposals it takes (a head's rank-r token, a draft's r-th draw); with
parent indices it is the node's order among its siblings. `depths` is the one depth
computation, shared with `DraftTree.build`'s check of concrete parents.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np


def depths(parents) -> np.ndarray:
    """Check concrete parents int[..., N] (parents[..., 0] = -1, 0 <= parents[..., i] < i) and
    return every node's depth, int32[..., N] (the root 0)."""
    parents = np.asarray(parents)
    lead = ":, " * (parents.ndim - 1)
    if np.any(parents[..., 0] != -1):
        raise ValueError(f"parents[{lead}0] must be -1: node 0 is the root")
    n = parents.shape[-1]
    bad = (parents[..., 1:] < 0) | (parents[..., 1:] >= np.arange(1, n))
    if np.any(bad):
        *row, col = np.argwhere(bad)[0]
        at = (*row, col + 1)
        raise ValueError(f"parents[{', '.join(str(int(i)) for i in at)}] = {parents[at]}: every non-root "
                         f"node needs a parent index in [0, {col}] (parents[i] < i)")
    depth = np.zeros(parents.shape, np.int32)
    for i in range(1, n):
        depth[..., i] = np.take_along_axis(depth, parents[..., i:i + 1], -1)[..., 0] + 1
    return depth


@dataclasses.dataclass(frozen=True, eq=False)
class Template:
    """A static tree: `parents`, `rank` (which of its parent's proposals the node takes; -1 at
    the root) and `depth`, all int32[N], root first."""

    parents: np.ndarray
    rank: np.ndarray
    depth: np.ndarray

    @classmethod
    def from_parents(cls, parents) -> Template:
        parents = np.asarray(parents, np.int32)
        if parents.ndim != 1 or not len(parents):
            raise ValueError(f"a tree template is a non-empty list of parent indices, got {parents}")
        depth = depths(parents)
        rank = np.array([np.sum(parents[1:i] == parents[i]) for i in range(len(parents))], np.int32)
        rank[0] = -1
        return cls(parents, rank, depth)

    @classmethod
    def from_rank_paths(cls, paths) -> Template:
        index = {(): 0}
        parents, rank = [-1], [-1]
        for p in (tuple(int(r) for r in p) for p in paths):
            if not p or min(p) < 0:
                raise ValueError(f"a rank path must be a non-empty tuple of ranks >= 0, got {p}")
            if p in index:
                raise ValueError(f"rank path {p} appears twice in the template")
            if p[:-1] not in index:
                raise ValueError(f"rank path {p} comes before its parent {p[:-1]} in the template")
            index[p] = len(parents)
            parents.append(index[p[:-1]])
            rank.append(p[-1])
        parents = np.asarray(parents, np.int32)
        return cls(parents, np.asarray(rank, np.int32), depths(parents))

    @property
    def num_nodes(self) -> int:
        return len(self.parents)

    @property
    def max_depth(self) -> int:
        return int(self.depth.max())

    @property
    def num_ranks(self) -> int:
        """Proposals a node needs (the highest rank + 1)."""
        return int(self.rank.max()) + 1

    def level(self, d: int) -> np.ndarray:
        """The nodes at depth d, in index order."""
        return np.flatnonzero(self.depth == d)


@functools.lru_cache(maxsize=256)
def parse(spec: tuple) -> Template:
    """The Template written as parent indices (ints, root first) or rank paths (int tuples,
    root excluded); see `as_spec` for a hashable spec."""
    if not spec:
        raise ValueError("the template is empty")
    if all(isinstance(t, int) for t in spec):
        return Template.from_parents(spec)
    return Template.from_rank_paths(spec)


def as_spec(template) -> tuple:
    """A hashable template spec: a tuple of ints (parent indices) or of int tuples (rank paths)."""
    try:
        items = list(template)
    except TypeError:
        raise ValueError(f"a template is a sequence of parent indices or of rank paths, got {template!r}")
    ints = [isinstance(t, (int, np.integer)) for t in items]
    if all(ints):
        return tuple(int(t) for t in items)
    if any(ints):
        raise ValueError("a template is either parent indices (ints) or rank paths (tuples), not both")
    return tuple(tuple(int(r) for r in t) for t in items)


def rank_paths_from_fanout(fanout: dict) -> tuple[tuple[int, ...], ...]:
    """Rank paths (root excluded, breadth-first) of the tree where path p has fanout[p] children
    of ranks 0..fanout[p]-1."""
    paths = [p + (r,) for p, f in fanout.items() for r in range(f)]
    return tuple(sorted(paths, key=lambda p: (len(p), p)))
