"""Acceptance rules: `rule(tree, target_probs, key) -> Verdict`.

`target_probs` float[B, N, V]: row [b, i] is the processed target distribution p(. | path to i)
(temperature, top-k and top-p applied as in `specjax.sampling.probs`). Every rule is a frozen
dataclass (hashable, so it can be a static jit argument) whose call is a pure, batched,
jit/vmap-able function of static shape. Formulas: reference/methods.md sections 1-2.

Exact rules (the emitted tokens are distributed as the target; at temperature 0, where
target_probs are one-hot, they all emit the greedy tokens):
  Greedy, SpeculativeSampling (chain), SpecInfer (independent children), RSD (children drawn
  without replacement), SpecTr (k i.i.d. children, K-SEQ), TopK (deterministic children).
Lossy: Typical (Medusa typical acceptance).

The sibling-walking rules share one pass over the nodes in index order: a node is tried when
its parent is the current node, so a parent's children are tried in sibling (draw) order,
acceptance descends, and a parent whose children were all rejected is never the parent of a
later node. The final token is drawn from the current node's residual (or its fresh target
distribution at a leaf).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from pallas_kernels import argmax
from specjax.tree import DraftTree, Verdict, row_gather

__all__ = [
    "RSD",
    "Greedy",
    "SpecInfer",
    "SpecTr",
    "SpeculativeSampling",
    "TopK",
    "Typical",
    "Verdict",
    "Verifier",
]


@dataclasses.dataclass(frozen=True)
class Verifier:
    """Base class: input checks, then `_verify`."""

    exact = True  # lossless w.r.t. target_probs
    needs_q = False  # reads tree.q

    def __call__(self, tree: DraftTree, target_probs: jax.Array, key: jax.Array) -> Verdict:
        """Verify `tree` against target_probs float[B, N, V]; `key` drives the random rules."""
        if not isinstance(tree, DraftTree):
            raise TypeError(f"expected a DraftTree, got {type(tree).__name__}")
        shape = (tree.batch, tree.num_nodes)
        if target_probs.ndim != 3 or target_probs.shape[:2] != shape:
            raise ValueError(f"target_probs must be [B, N, V] with [B, N] = {list(shape)}, "
                             f"got {list(target_probs.shape)}")
        if self.needs_q:
            if tree.q is None:
                raise ValueError(f"{type(self).__name__} needs the draft distributions: build the "
                                 "DraftTree with q=... (or use TopK for deterministic drafts)")
            if tree.q.shape[-1] != target_probs.shape[-1]:
                raise ValueError(f"vocabulary mismatch: q has V={tree.q.shape[-1]}, "
                                 f"target_probs has V={target_probs.shape[-1]}")
        return _verify(self, tree, target_probs.astype(jnp.float32), key)

    def _verify(self, tree: DraftTree, p: jax.Array, key: jax.Array) -> Verdict:
        raise NotImplementedError


@functools.partial(jax.jit, static_argnums=0)
def _verify(rule: Verifier, tree: DraftTree, p: jax.Array, key: jax.Array) -> Verdict:
    """Compiled once per rule and shapes when called eagerly; inlined under an outer jit."""
    return rule._verify(tree, p, key)


# ---- deterministic path scoring ----------------------------------------------------------------

def _best_path(tree: DraftTree, node_ok: jax.Array,
               tie_score: jax.Array | None = None) -> jax.Array:
    """int32[B]: the deepest node whose path (root excluded) is all `node_ok` bool[B, N]; ties go
    to the higher `tie_score` float[B, N], then to the lowest index."""
    node_ok = node_ok.at[:, 0].set(True) & tree.valid
    path_ok = ~jnp.any(tree.ancestors & ~node_ok[:, None, :], axis=-1)
    depth = jnp.where(path_ok, tree.depth, -1)
    if tie_score is None:
        return jnp.argmax(depth, axis=-1).astype(jnp.int32)
    deepest = depth == depth.max(-1, keepdims=True)
    return jnp.argmax(jnp.where(deepest, tie_score, -jnp.inf), axis=-1).astype(jnp.int32)


def _parent_probs_of_tokens(tree: DraftTree, p: jax.Array) -> jax.Array:
    """float[B, N]: p[b, parent(i), tokens[b, i]] (the root gets p[b, 0, tokens[b, 0]])."""
    rows = jnp.arange(tree.batch)[:, None]
    return p[rows, jnp.maximum(tree.parents, 0), tree.tokens]


def _node_probs_of_tokens(x: jax.Array, tree: DraftTree) -> jax.Array:
    """float[B, N]: x[b, i, tokens[b, i]] for x float[B, N, V]."""
    return jnp.take_along_axis(x, tree.tokens[:, :, None], axis=2)[..., 0]


def _verdict(tree: DraftTree, node: jax.Array, next_token: jax.Array) -> Verdict:
    return Verdict(row_gather(tree.paths, node), row_gather(tree.depth, node), next_token.astype(jnp.int32))


def _noise(key: jax.Array, b: int, n: int, v: int) -> tuple[jax.Array, jax.Array]:
    """One random draw per verification: uniforms float[B, N] (one per node) and Gumbel noise
    float[B, V] for the final token."""
    u = jax.random.uniform(key, (b, n + v))
    return u[:, :n], -jnp.log(-jnp.log(u[:, n:]))


def _draw(p: jax.Array, gumbel: jax.Array) -> jax.Array:
    """int32[B]: Gumbel-max draw from p float[B, V] (rows need not be normalised)."""
    return argmax(jnp.log(jnp.maximum(p, 0.0)) + gumbel)


@dataclasses.dataclass(frozen=True)
class Greedy(Verifier):
    """Longest path whose every token is the target argmax at its parent (ties: lowest node
    index); next token = argmax at the end of the path. Exact at temperature 0; `key` unused."""

    def _verify(self, tree, p, key):
        top = argmax(p)  # ties to the lowest index
        top_at_parent = jnp.take_along_axis(top, jnp.maximum(tree.parents, 0), axis=1)
        node = _best_path(tree, tree.tokens == top_at_parent)
        return _verdict(tree, node, row_gather(top, node))


@dataclasses.dataclass(frozen=True)
class Typical(Verifier):
    """Medusa typical acceptance. LOSSY: the output is NOT distributed as the target.

    A node is acceptable iff p_parent(x) > min(epsilon, delta * exp(-H(p_parent))); the deepest
    all-acceptable path wins (ties: larger sum of log p, then lowest index); the next token is
    sampled from p at its end. H is computed on target_probs (Medusa uses softmax(logits / T)).
    """

    epsilon: float = 0.09
    delta: float = 0.3
    exact = False

    def __post_init__(self):
        if not (self.epsilon >= 0 and self.delta >= 0):
            raise ValueError(f"epsilon and delta must be >= 0, got {self.epsilon}, {self.delta}")

    def _verify(self, tree, p, key):
        entropy = -jnp.sum(p * jnp.log(p + 1e-5), axis=-1)  # [B, N]
        threshold = jnp.minimum(self.epsilon, self.delta * jnp.exp(-entropy))
        par = jnp.maximum(tree.parents, 0)
        px = _parent_probs_of_tokens(tree, p)
        ok = px > jnp.take_along_axis(threshold, par, axis=1)
        logp = jnp.where(tree.ancestors & (jnp.arange(tree.num_nodes) > 0),
                         jnp.log(jnp.maximum(px, 1e-30))[:, None, :], 0.0).sum(-1)
        node = _best_path(tree, ok, logp)
        _, g = _noise(key, tree.batch, 0, p.shape[-1])
        return _verdict(tree, node, _draw(row_gather(p, node), g))


# ---- speculative sampling on a chain -----------------------------------------------------------

def _residual(p: jax.Array, q: jax.Array) -> jax.Array:
    """norm((p - q)+) over the last axis; p itself where that has no mass (a float-rounding
    corner: a rejection is impossible when p <= q everywhere)."""
    r = jnp.maximum(p - q, 0.0)
    mass = r.sum(-1, keepdims=True)
    return jnp.where(mass > 0, r / jnp.where(mass > 0, mass, 1.0), p)


@dataclasses.dataclass(frozen=True)
class SpeculativeSampling(Verifier):
    """Leviathan et al. / Chen et al. speculative sampling on a chain.

    Verifies the chain 0 -> 1 -> 2 -> ... (nodes in index order while each is the previous one's
    child); any other branch is ignored, so use SpecInfer / RSD / SpecTr for trees. Accept x_i
    iff u_i * q_i(x_i) < p_{i-1}(x_i); at the first rejection sample norm((p - q)+), after the
    whole chain sample the bonus from p at its end.
    """

    needs_q = True

    def _verify(self, tree, p, key):
        b, n, v = p.shape
        u, g = _noise(key, b, n, v)
        node = jnp.arange(n)
        link = tree.valid & (tree.parents == node - 1)  # node i continues the chain
        qx = _node_probs_of_tokens(tree.q, tree)
        accept = link & (u * qx < _parent_probs_of_tokens(tree, p))
        last = jnp.cumprod(accept[:, 1:], axis=1).sum(-1).astype(jnp.int32)  # accepted prefix
        nxt = jnp.minimum(last + 1, n - 1)
        rejected = (last + 1 < n) & row_gather(link, nxt)
        p_last = row_gather(p, last)
        dist = jnp.where(rejected[:, None], _residual(p_last, row_gather(tree.q, nxt)), p_last)
        return _verdict(tree, last, _draw(dist, g))


# ---- recursive rejection over siblings (SpecInfer, RSD, TopK) ----------------------------------

@dataclasses.dataclass(frozen=True)
class _SiblingWalk(Verifier):
    """One pass over the nodes in index order. A node whose parent is the current node is tried:
    accept x iff u * q_x(x) < p_cur(x), where q_x = `_draft_law` (the law x was drawn from given
    the siblings tried before it); on acceptance descend (p_cur = p at x), on rejection
    p_cur = `_residual(p_cur, q_x)`. Finally sample from p_cur."""

    def _draft_law(self, q: jax.Array | None, x: jax.Array, tried: jax.Array) -> jax.Array:
        """float[B, V]: the law of sibling token x int[B] given the tried tokens bool[B, V]."""
        raise NotImplementedError

    def _residual(self, p: jax.Array, q: jax.Array) -> jax.Array:
        return _residual(p, q)

    def _verify(self, tree, p, key):
        b, n, v = p.shape
        u, g = _noise(key, b, n, v)

        def step(j, carry):  # node j (the root, node 0, is never tried)
            cur, p_cur, tried = carry
            x = tree.tokens[:, j]
            q_x = self._draft_law(tree.q[:, j] if self.needs_q else None, x, tried)
            is_try = tree.valid[:, j] & (tree.parents[:, j] == cur)
            accept = is_try & (u[:, j] * row_gather(q_x, x) < row_gather(p_cur, x))
            reject = is_try & ~accept
            p_cur = jnp.where(accept[:, None], p[:, j],
                              jnp.where(reject[:, None], self._residual(p_cur, q_x), p_cur))
            seen = jax.nn.one_hot(x, v, dtype=bool)
            tried = jnp.where(accept[:, None], False, tried | (reject[:, None] & seen))
            return jnp.where(accept, j, cur), p_cur, tried

        init = (jnp.zeros((b,), jnp.int32), p[:, 0], jnp.zeros((b, v), bool))
        cur, p_cur, _ = jax.lax.fori_loop(1, n, step, init)
        return _verdict(tree, cur, _draw(p_cur, g))


@dataclasses.dataclass(frozen=True)
class SpecInfer(_SiblingWalk):
    """SpecInfer multi-step speculative sampling: children drawn independently, child x with its
    own q[b, x_node]; p_cur := norm((p_cur - q)+) after each rejection. Not exact for children
    drawn without replacement (use RSD)."""

    needs_q = True

    def _draft_law(self, q, x, tried):
        return q


@dataclasses.dataclass(frozen=True)
class RSD(_SiblingWalk):
    """Recursive rejection sampling (RSD, EAGLE-1): children drawn WITHOUT replacement, in draw
    order; the i-th sibling's law is q with the earlier-tried siblings removed, renormalised."""

    needs_q = True

    def _draft_law(self, q, x, tried):
        q = jnp.where(tried, 0.0, q)
        mass = q.sum(-1, keepdims=True)
        return q / jnp.where(mass > 0, mass, 1.0)


@dataclasses.dataclass(frozen=True)
class TopK(_SiblingWalk):
    """Deterministic children (top-k or retrieval drafts; q is a point mass, tree.q is ignored):
    accept child x with probability p_cur(x); on rejection zero p_cur(x) and renormalise."""

    def _draft_law(self, q, x, tried):
        return jax.nn.one_hot(x, tried.shape[-1], dtype=jnp.float32)


# ---- SpecTr K-SEQ ------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SpecTr(Verifier):
    """SpecTr K-SEQ over the k i.i.d. children of each node (duplicates stay separate nodes).

    At the current node with p, shared child law q and k valid children: rho* in [1, k] is the
    root of rho * beta(rho) - 1 + (1 - beta(rho))^k, beta(rho) = sum min(q, p / rho), found by
    `iters` bisection steps (keeping the side where p_res >= 0, with a relative `tolerance` for
    float32 rounding, so that rho* = 1 when q == p). Child x is accepted iff
    u * rho* * q(x) < p(x), the first accepted child (sibling order) is descended into; if all k
    fail, the final token is drawn from p_res = (p - min(q, p/rho*) (1-(1-beta)^k)/beta)/(1-beta)^k
    and the step ends; at a leaf it is drawn from p.
    """

    iters: int = 30
    tolerance: float = 1e-5
    needs_q = True

    def __post_init__(self):
        if not isinstance(self.iters, int) or self.iters < 1:
            raise ValueError(f"iters must be an int >= 1, got {self.iters!r}")

    def _rho(self, p: jax.Array, q: jax.Array, k: jax.Array) -> jax.Array:
        """float[B]: rho* for p, q float[B, V] and k float[B] (>= 1), by bisection on [1, k]."""
        def f_nonneg(rho):  # p_res >= 0, up to float32 summation error in beta
            beta = jnp.minimum(q, p / rho[:, None]).sum(-1)
            fail = jnp.maximum(1.0 - beta, 0.0) ** k
            return rho * beta * (1.0 + self.tolerance) - 1.0 + fail >= 0

        def body(_, lo_hi):
            lo, hi = lo_hi
            mid = 0.5 * (lo + hi)
            ok = f_nonneg(mid)
            return jnp.where(ok, lo, mid), jnp.where(ok, mid, hi)

        _, hi = jax.lax.fori_loop(0, self.iters, body, (jnp.ones_like(k), k))
        return hi

    def _verify(self, tree, p, key):
        b, n, v = p.shape
        u, g = _noise(key, b, n, v)
        qx = _node_probs_of_tokens(tree.q, tree)
        px = _parent_probs_of_tokens(tree, p)

        def descend(_, carry):
            cur, stop, rho, k = carry
            children = tree.valid & (tree.parents == cur[:, None]) & ~stop[:, None]
            k_here = children.sum(-1).astype(jnp.float32)
            first = jnp.argmax(children, axis=-1)
            rho_here = self._rho(row_gather(p, cur), row_gather(tree.q, first), jnp.maximum(k_here, 1.0))
            accept = children & (u * rho_here[:, None] * qx < px)
            moved = accept.any(-1)
            now_stop = ~stop & ~moved
            cur = jnp.where(moved, jnp.argmax(accept, axis=-1).astype(jnp.int32), cur)
            return (cur, stop | now_stop, jnp.where(now_stop, rho_here, rho),
                    jnp.where(now_stop, k_here, k))

        init = (jnp.zeros((b,), jnp.int32), jnp.zeros((b,), bool), jnp.ones((b,)), jnp.zeros((b,)))
        cur, _, rho, k = jax.lax.fori_loop(0, tree.max_depth + 1, descend, init)
        p_cur = row_gather(p, cur)
        q_cur = row_gather(tree.q, jnp.argmax(tree.valid & (tree.parents == cur[:, None]), axis=-1))
        dist = jnp.where((k > 0)[:, None], self._p_res(p_cur, q_cur, rho, k), p_cur)
        return _verdict(tree, cur, _draw(dist, g))

    @staticmethod
    def _p_res(p, q, rho, k):
        """p_res float[B, V] after all k candidates failed (clipped at 0; p if it has no mass)."""
        capped = jnp.minimum(q, p / rho[:, None])
        beta = capped.sum(-1)
        fail = jnp.maximum(1.0 - beta, 0.0) ** k
        gain = jnp.where(beta > 0, (1.0 - fail) / jnp.where(beta > 0, beta, 1.0), k)
        r = jnp.maximum(p - capped * gain[:, None], 0.0)
        mass = r.sum(-1, keepdims=True)
        return jnp.where(mass > 0, r / jnp.where(mass > 0, mass, 1.0), p)
