"""DraftTree: the static-shape token tree a drafter proposes, and the Verdict a verifier returns.

A tree has N nodes per row. Node 0 is the root: the last committed token, whose K/V is not in
the cache yet (parent -1). Every other node i has a parent `parents[i] < i`; siblings are
ordered by index, and drafters that sample without replacement put children in draw order.
A chain is the tree with `parents[i] = i - 1`.

Everything a consumer needs is derived once, in `DraftTree.build`: node depths, the ancestor
mask (the tree-attention mask) and each node's root-first path. The maximum depth D is a static
Python int, because it fixes the width of `Verdict.path`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax.pytrees import register_dataclass
from specjax.tree.gather import row_gather
from specjax.tree.template import depths


class Verdict(NamedTuple):
    """What a verifier decided for one step.

    path: int32[B, D+1], node indices of the accepted path, root (0) first. Entries after
      `num_accepted` repeat the last accepted node, so every entry is a valid node index; only
      `path[:, :num_accepted+1]` is meaningful (the engine moves K/V from `lengths + path[j]`).
    num_accepted: int32[B], draft tokens accepted (root and the final token excluded).
    next_token: int32[B], the bonus or correction token; it becomes the next root.
    """

    path: jax.Array
    num_accepted: jax.Array
    next_token: jax.Array

    @property
    def last_node(self) -> jax.Array:
        """int32[B]: the last accepted node, path[b, num_accepted[b]] (the root when none was)."""
        return row_gather(self.path, self.num_accepted)

    def emitted(self, tree: DraftTree) -> jax.Array:
        """int32[B, D+1]: the accepted draft tokens, then `next_token`, then -1 padding."""
        drafted = row_gather(tree.tokens, self.path[:, 1:])
        drafted = jnp.pad(drafted, ((0, 0), (0, 1)), constant_values=-1)
        j = jnp.arange(self.path.shape[1])[None, :]
        a = self.num_accepted[:, None]
        return jnp.where(j < a, drafted, jnp.where(j == a, self.next_token[:, None], -1))


@register_dataclass
@dataclasses.dataclass(frozen=True)
class DraftTree:
    """A batch of draft trees (a pytree; `max_depth` is static). Build with `DraftTree.build`.

    tokens: int32[B, N]; parents: int32[B, N] (-1 at the root);
    depth: int32[B, N] (root 0);
    valid: bool[B, N], effective validity: the node, all its ancestors and depth <= max_depth;
      invalid nodes are treated as absent (never drawn, never accepted);
    ancestors: bool[B, N, N], ancestors[b, i, j] iff j is i or an ancestor of i (the attention
      mask of the tree block);
    paths: int32[B, N, D+1], paths[b, i, d] = the ancestor of i at depth d, padded with i after
      depth[b, i];
    q: float32[B, N, V] or None, q[b, i] = the draft's processed distribution at i's parent
      before any sibling was removed (siblings share it; q[:, 0] is unused). None for
      deterministic drafts.
    """

    tokens: jax.Array
    parents: jax.Array
    depth: jax.Array
    valid: jax.Array
    ancestors: jax.Array
    paths: jax.Array
    q: jax.Array | None
    max_depth: int = dataclasses.field(metadata={"static": True})

    @property
    def batch(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]

    def positions(self, lengths: jax.Array) -> jax.Array:
        """int32[B, N] position ids of the nodes for a cache with committed `lengths` int32[B]."""
        return lengths[:, None].astype(jnp.int32) + self.depth

    @classmethod
    def build(cls, tokens, parents, q=None, valid=None, *,
              max_depth: int | None = None) -> DraftTree:
        """Build a tree from tokens int[B, N], parents int[B, N] (or int[N], shared by all rows),
        optional q float[B, N, V] and valid bool[B, N].

        max_depth (static) defaults to the deepest node when `parents` is concrete; it is
        required when `parents` is traced (nodes deeper than it then become invalid).
        """
        tokens = jnp.asarray(tokens)
        if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise ValueError(
                f"tokens must be an int array [B, N], got {tokens.dtype}{list(tokens.shape)}")
        b, n = tokens.shape
        parents_np = _concrete(parents)
        parents = jnp.asarray(parents)
        if parents.ndim == 1:
            parents = jnp.broadcast_to(parents, (b, n))
            parents_np = None if parents_np is None else np.broadcast_to(parents_np, (b, n))
        if parents.shape != (b, n) or not jnp.issubdtype(parents.dtype, jnp.integer):
            raise ValueError(f"parents must be an int array [B, N] = {[b, n]} or [N], "
                             f"got {parents.dtype}{list(parents.shape)}")
        if parents_np is not None:
            depth_max = int(depths(parents_np).max())
            if max_depth is None:
                max_depth = depth_max
            elif depth_max > max_depth:
                raise ValueError(f"the tree has depth {depth_max} > max_depth={max_depth}")
        elif max_depth is None:
            raise ValueError("parents is traced (built inside jit/vmap from traced values): "
                             "pass a static max_depth")
        if not isinstance(max_depth, int) or not 0 <= max_depth < n:
            raise ValueError(
                f"max_depth must be an int in [0, N-1] = [0, {n - 1}], got {max_depth!r}")

        if valid is None:
            valid = jnp.ones((b, n), bool)
        else:
            valid_np = _concrete(valid)
            valid = jnp.broadcast_to(jnp.asarray(valid), (b, n))
            if valid.dtype != jnp.bool_:
                raise ValueError(f"valid must be a bool array [B, N], got {valid.dtype}")
            if valid_np is not None and not np.all(np.broadcast_to(valid_np, (b, n))[:, 0]):
                raise ValueError("valid[:, 0] must be True: the root is the committed token")
        if q is not None:
            q = jnp.asarray(q)
            if q.ndim != 3 or q.shape[:2] != (b, n) or not jnp.issubdtype(q.dtype, jnp.floating):
                raise ValueError(f"q must be a float array [B, N, V] with [B, N] = {[b, n]}, "
                                 f"got {q.dtype}{list(q.shape)}")
            q = q.astype(jnp.float32)

        parents = parents.astype(jnp.int32)
        depth, valid, ancestors, paths = _derive(parents, valid, max_depth)
        return cls(tokens.astype(jnp.int32), parents, depth, valid, ancestors, paths, q, max_depth)


def chain(tokens, q=None, valid=None) -> DraftTree:
    """A chain tree (parents[i] = i - 1) over tokens int[B, N]; node 0 is the root."""
    n = jnp.shape(tokens)[-1]
    return DraftTree.build(tokens, np.arange(n, dtype=np.int32) - 1, q, valid, max_depth=n - 1)


def _concrete(x) -> np.ndarray | None:
    """x as a numpy array, or None if it is traced."""
    if isinstance(x, jax.core.Tracer):
        return None
    return np.asarray(x)


@functools.partial(jax.jit, static_argnums=2)
def _derive(parents: jax.Array, valid: jax.Array, max_depth: int):
    """depth, effective valid, ancestors and paths from parents int32[B, N] and valid bool[B, N]."""
    n = parents.shape[1]
    ancestors = _ancestors(parents)
    depth = ancestors.sum(-1, dtype=jnp.int32) - 1
    ok = valid & (depth <= max_depth)
    valid = ~jnp.any(ancestors & ~ok[:, None, :], axis=-1)
    at_depth = (depth[:, :, None] == jnp.arange(max_depth + 1)).astype(jnp.int32)  # [B,N,D+1]
    node = jnp.arange(n, dtype=jnp.int32)
    paths = jnp.einsum("bij,bjd->bid", ancestors * node, at_depth)
    found = jnp.einsum("bij,bjd->bid", ancestors.astype(jnp.int32), at_depth) > 0
    return depth, valid, ancestors, jnp.where(found, paths, node[None, :, None])


def _ancestors(parents: jax.Array) -> jax.Array:
    """bool[B, N, N] ancestor-or-self mask, by pointer doubling (log2 N gathers)."""
    b, n = parents.shape
    node = jnp.arange(n)
    up = jnp.where(node == 0, 0, jnp.clip(parents, 0, n - 1))  # the root points at itself
    rows = jnp.arange(b)[:, None]
    anc = (node[:, None] == node[None, :])[None] | jax.nn.one_hot(up, n, dtype=bool)
    for _ in range(max(0, math.ceil(math.log2(max(n - 1, 1))))):
        anc = anc | anc[rows, up]
        up = up[rows, up]
    return anc
