"""Dynamic trees grown round by round from a drafter's distributions: DySpec's (`dyspec`) and
EAGLE-2's (`eagle2`). Each takes the root's distribution and a callback that gives the
distributions after the newest nodes of the tree so far (one draft call per round), so any
drafter that can score a partial tree under its ancestor mask (a draft model, an EAGLE head)
grows either.

DySpec (Xiong et al., arXiv 2410.11744) estimates a node's chance of acceptance by the draft
probability of its path, and grows the tree greedily from a max-heap of "slots" (a node's next
child) until the budget is spent. Here the heap is a static-shape top-k: each round takes the
`widths[r]` best open slots of every node whose distribution is known, then one draft call
gives the distributions after the new nodes. A node draws its children once, in order, when
its distribution arrives (Gumbel top-k: without replacement, in draw order; at temperature 0
its top tokens) and each slot holds the next of them, so a node's slots are taken in draw
order and siblings are indexed so.

Slot scores. v(child) = v(parent) * q(child), v(root) = 1. At temperature 0, slot j of node n
scores v(n) * q(x_j), the chance its token is the target's (EAGLE-2's rerank, grown
greedily). When sampling, slot j scores v(n) * (1 - sum_{i<j} q(x_i)), the draft mass not yet
drawn: DySpec's heap key, known before x_j is drawn. That is what keeps RSD exact: whether a
node gets a j-th child never depends on that child's token (a slot ranks below its node's
earlier slots, and every other score is fixed by earlier draws or by independent ones), so
the children are a sequential draw without replacement stopped by a rule that looks only at
the past, and recursive rejection is exact for any such stopping rule.

EAGLE-2 (Li et al., arXiv 2406.16858) expands the `top_k` beams of highest path
log-probability, `top_k` children each, for `depth` levels, then reranks every candidate by
its path probability: deterministic drafts (q = None), exact with Greedy and TopK.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from specjax import sampling
from specjax.tree.budget import best_subtree
from specjax.tree.draft_tree import DraftTree

# (tree so far, the slice of its newest nodes, carry) -> (the draft's distributions (dyspec) or
# log-probabilities (eagle2) float[B, n_new, V] after each new node, carry)
DistAfter = Callable[[DraftTree, slice, Any], tuple[jax.Array, Any]]


def dyspec(root: jax.Array, root_dist: jax.Array, dist_after: DistAfter, carry: Any, key: jax.Array, *,
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


def eagle2(root: jax.Array, root_logp: jax.Array, logp_after: DistAfter, carry: Any, *, top_k: int,
           depth: int, num_nodes: int, min_prob: float = 0.0) -> tuple[DraftTree, Any]:
    """EAGLE-2's tree of `num_nodes` nodes after `root` int32[B], whose draft log-probabilities
    are `root_logp` float[B, V]: `depth` levels of the `top_k` best beams, top_k children each,
    then the root and the num_nodes - 1 candidates of highest path probability (at least
    `min_prob`), parents first, the kept ones before the dropped (`budget.best_subtree`).
    `logp_after` sees the tree of the beams expanded so far (the root, then top_k per level)
    and the slice of the newest level. Returns the tree (q = None) and the carry."""
    b, k = root.shape[0], top_k
    lp, tk = jax.lax.top_k(root_logp, k)  # [B, k]
    cand_tok, cand_par, cand_score = [tk], [jnp.full((b, k), -1, jnp.int32)], [lp]
    beam_tok, beam_score, beam_cand = tk, lp, jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (b, k))
    beam_node = jnp.zeros((b, k), jnp.int32)  # each beam's parent among the expanded beams (0: the root)
    tokens = jnp.zeros((b, 1 + (depth - 1) * k), jnp.int32).at[:, 0].set(root)
    parents = jnp.zeros_like(tokens).at[:, 0].set(-1)
    offset = k
    for s in range(1, depth):
        new = slice(1 + (s - 1) * k, 1 + s * k)
        tokens, parents = tokens.at[:, new].set(beam_tok), parents.at[:, new].set(beam_node)
        logp, carry = logp_after(DraftTree.build(tokens, parents, max_depth=depth - 1), new, carry)
        clp, ctok = jax.lax.top_k(logp, k)  # [B, k, k]
        score = (beam_score[:, :, None] + clp).reshape(b, k * k)
        cand_tok.append(ctok.reshape(b, k * k))
        cand_par.append(jnp.repeat(beam_cand, k, axis=1))
        cand_score.append(score)
        beam_score, best = jax.lax.top_k(score, k)
        beam_tok = jnp.take_along_axis(ctok.reshape(b, k * k), best, axis=1)
        beam_cand = offset + best.astype(jnp.int32)
        beam_node = new.start + (best // k).astype(jnp.int32)
        offset += k * k
    cand_tok, cand_par, cand_score = (jnp.concatenate(x, 1) for x in (cand_tok, cand_par, cand_score))
    tokens = jnp.concatenate([root[:, None], cand_tok], 1)
    parents = jnp.concatenate([jnp.full((b, 1), -1, jnp.int32), cand_par + 1], 1)  # candidate c is node c + 1
    score = jnp.concatenate([jnp.zeros((b, 1)), cand_score], 1)
    return best_subtree(tokens, parents, score, score >= jnp.log(min_prob), num_nodes, depth), carry


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
