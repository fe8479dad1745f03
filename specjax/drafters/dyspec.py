"""DySpec's dynamic token tree (Xiong et al., arXiv 2410.11744), grown under a node budget from
any drafter's distributions; used by DraftModel (mode "dyspec") and Eagle (tree "dyspec").

DySpec estimates a node's chance of acceptance by the draft probability of its path, and grows
the tree greedily from a max-heap of "slots" (a node's next child) until the budget is spent.
Here the heap is a static-shape top-k: each round takes the `widths[r]` best open slots of
every node whose distribution is known, then one draft call gives the distributions after the
new nodes. A node draws its children once, in order, when its distribution arrives (Gumbel
top-k: without replacement, in draw order; at temperature 0 its top tokens) and each slot
holds the next of them, so a node's slots are taken in draw order and siblings are indexed so.

Slot scores. v(child) = v(parent) * q(child), v(root) = 1. At temperature 0, slot j of node n
scores v(n) * q(x_j), the chance its token is the target's (EAGLE-2's rerank, grown
greedily). When sampling, slot j scores v(n) * (1 - sum_{i<j} q(x_i)), the draft mass not yet
drawn: DySpec's heap key, known before x_j is drawn. That is what keeps RSD exact: whether a
node gets a j-th child never depends on that child's token (a slot ranks below its node's
earlier slots, and every other score is fixed by earlier draws or by independent ones), so
the children are a sequential draw without replacement stopped by a rule that looks only at
the past, and recursive rejection is exact for any such stopping rule.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from specjax import sampling
from specjax.tree import DraftTree

# (tree so far, the slice of its newest nodes, carry) -> (draft distributions float[B, n_new, V]
# after each new node, carry)
DistAfter = Callable[[DraftTree, slice, Any], tuple[jax.Array, Any]]


def grow(root: jax.Array, root_dist: jax.Array, dist_after: DistAfter, carry: Any, key: jax.Array, *,
         widths: tuple[int, ...], greedy: bool) -> tuple[DraftTree, Any]:
    """A DySpec tree of 1 + sum(widths) nodes and depth <= len(widths) after `root` int32[B],
    whose draft distribution is `root_dist` float[B, V]; round r adds `widths[r]` nodes (a node
    has at most max(widths) children). Returns the tree (q set when sampling) and the carry."""
    b, v = root_dist.shape
    n, fanout, depth = 1 + sum(widths), max(widths), len(widths)
    rows = jnp.arange(b)[:, None]
    tokens = jnp.zeros((b, n), jnp.int32).at[:, 0].set(root)
    parents = jnp.zeros((b, n), jnp.int32).at[:, 0].set(-1)
    valid = jnp.zeros((b, n), bool).at[:, 0].set(True)
    dist = jnp.zeros((b, n, v), jnp.float32).at[:, 0].set(root_dist)
    value = jnp.zeros((b, n), jnp.float32).at[:, 0].set(1.0)
    ready = valid  # nodes whose distribution (and children) are known
    taken = jnp.zeros((b, n), jnp.int32)  # slots used per node
    keys = jax.random.split(key, depth)
    child = jnp.zeros((b, n, fanout), jnp.int32)  # each node's children, in draw order
    child_q = jnp.zeros((b, n, fanout), jnp.float32)
    c, cq = _children(root_dist[:, None], fanout, keys[0], greedy)
    child, child_q = child.at[:, :1].set(c), child_q.at[:, :1].set(cq)
    slot = jnp.arange(fanout)
    start = 1
    for r, width in enumerate(widths):
        open_ = ready[:, :, None] & (slot >= taken[:, :, None]) & (child_q > 0)
        score = jnp.where(open_, value[:, :, None] * _slot_gain(child_q, greedy), -jnp.inf)
        score = score.reshape(b, n * fanout)
        best, flat = jax.lax.top_k(score, width)  # equal scores: lower index, so earlier slot
        ok = best > -jnp.inf
        par, j = flat // fanout, flat % fanout
        new = slice(start, start + width)
        tokens = tokens.at[:, new].set(child[rows, par, j])
        parents = parents.at[:, new].set(jnp.where(ok, par, 0))
        valid = valid.at[:, new].set(ok)
        value = value.at[:, new].set(value[rows, par] * child_q[rows, par, j])
        taken = taken.at[rows, par].add(ok.astype(jnp.int32))
        if r + 1 < depth:
            tree = DraftTree.build(tokens, parents, valid=valid, max_depth=depth)
            new_dist, carry = dist_after(tree, new, carry)
            c, cq = _children(new_dist, fanout, keys[r + 1], greedy)
            dist, ready = dist.at[:, new].set(new_dist), ready.at[:, new].set(ok)
            child, child_q = child.at[:, new].set(c), child_q.at[:, new].set(cq)
        start += width
    q = None if greedy else dist[rows, jnp.maximum(parents, 0)]
    return DraftTree.build(tokens, parents, q=q, valid=valid, max_depth=depth), carry


def _slot_gain(child_q: jax.Array, greedy: bool) -> jax.Array:
    """float[B, N, K]: each slot's score over its node's value: the child's draft probability
    at temperature 0; when sampling, the draft mass not drawn before it (see the module)."""
    return child_q if greedy else 1.0 - (jnp.cumsum(child_q, -1) - child_q)


def _children(dist: jax.Array, fanout: int, key: jax.Array, greedy: bool) -> tuple[jax.Array, jax.Array]:
    """The first `fanout` children drawn from dist float[B, M, V] without replacement, in draw
    order (Gumbel top-k; the top tokens when greedy), and their draft probabilities."""
    logq = jnp.log(dist)
    if not greedy:
        logq = logq + sampling.gumbel(key, logq.shape)
    tok = jax.lax.top_k(logq, fanout)[1].astype(jnp.int32)
    return tok, jnp.take_along_axis(dist, tok, axis=-1)
