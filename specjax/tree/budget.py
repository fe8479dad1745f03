"""Prune a scored candidate tree to a node budget (RASD's fused trees, ADED's lookahead trees).

Candidates come as tokens, parents (parents[i] < i, root first), scores and valid flags, all
[B, M]. A node's score is capped by its parent's, so scores never grow down a path; the root and
the `budget - 1` best nodes (ties: the lower index, so a parent before its child) then form a
tree, compacted in candidate order (still topological): a DraftTree of exactly `budget` nodes,
the kept ones first, so a step with few kept nodes verifies a small forward (`tree_sizes`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.tree.draft_tree import DraftTree


def best_subtree(tokens, parents, score, valid, budget: int, max_depth: int) -> DraftTree:
    """The root and the `budget - 1` best-scored valid candidates (see the module docstring)."""
    b, m = tokens.shape
    up = jnp.maximum(parents, 0)
    score = jnp.where(valid, score.astype(jnp.float32), -jnp.inf).at[:, 0].set(jnp.inf)
    for _ in range(max_depth):  # cap by the parent's score (and drop orphans of invalid nodes)
        score = jnp.minimum(score, jnp.where(parents >= 0, jnp.take_along_axis(score, up, axis=1), jnp.inf))
    idx = jnp.broadcast_to(jnp.arange(m), (b, m))
    _, order = jax.lax.sort((-score, idx), num_keys=2)
    chosen = order[:, :budget]
    keep = jnp.zeros((b, m), bool).at[jnp.arange(b)[:, None], chosen].set(True)
    keep &= score > -jnp.inf
    new_index = jnp.cumsum(keep, axis=1) - 1
    at = jnp.where(keep, new_index, budget)  # dropped nodes go past the end
    rows = jnp.arange(b)[:, None]
    new_parent = jnp.where(parents >= 0, jnp.take_along_axis(new_index, up, axis=1), -1)
    out_tokens = jnp.zeros((b, budget), jnp.int32).at[rows, at].set(tokens, mode="drop")
    out_parents = jnp.zeros((b, budget), jnp.int32).at[rows, at].set(new_parent, mode="drop")
    out_valid = jnp.zeros((b, budget), bool).at[rows, at].set(True, mode="drop")
    return DraftTree.build(out_tokens, out_parents.at[:, 0].set(-1), valid=out_valid,
                           max_depth=min(max_depth, budget - 1))
