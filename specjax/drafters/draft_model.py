"""DraftModel: a small model of the same tokenizer drafts chains or trees for the target.

Modes (each builds its tree level by level, one draft forward per level):
- "chain": k tokens, each drawn from the draft (SpeculativeSampling);
- "iid": k independent sequences of length `depth`, duplicates kept apart (SpecTr K-SEQ);
- "gumbel": a tree with branching factors b_1..b_L, children drawn without replacement by the
  Gumbel-top-k trick, in draw order (RSD-C);
- "beam": stochastic beam search (Kool et al. 2019) of width W and depth L: W sequences drawn
  without replacement from the draft over sequences (RSD-S);
- "topk": a static tree template whose children are the draft's top tokens in rank order,
  deterministic (q = point mass; TopK);
- "dyspec": DySpec's dynamic tree (`specjax.tree.growth.dyspec`), `depth` rounds of the `width`
  best slots by the draft's path probability, children drawn without replacement (RSD).

At temperature 0 every mode drafts deterministically (argmax, top-k, plain beam search) from
the draft's softmax and the Greedy rule verifies.

The draft keeps its own KV cache in step with the target's: each propose first feeds the
tokens committed since the last one, the root last (the last depth + 1 in one forward, any
before them `chunk` at a time: none after a step it drafted, more after steps it did not
draft or a Forced run), then the tree so far under its ancestor mask, one forward per level
(a chain feeds only its newest node: the nodes above it are already in the draft's cache).
Tree entries written past the committed length are never read from the cache, so nothing
needs undoing on rejection.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import argmax
from specjax import sampling, verify
from specjax.drafters.base import Context, Drafter
from specjax.models import KVCache, Model, forward
from specjax.models.target import fill
from specjax.pytrees import register_dataclass
from specjax.tree import DraftTree, Template, growth

MODES = ("chain", "iid", "gumbel", "beam", "topk", "dyspec")


class DraftModelState(NamedTuple):
    cache: KVCache  # the draft's own KV cache, committed up to the target's length


@register_dataclass
@dataclasses.dataclass(frozen=True)
class DraftModel(Drafter):
    """Draft with `draft` (a Model with the target's vocabulary).

    chain: k; iid: k sequences of `depth`; gumbel: `branching` (b_1, ..., b_L); beam: `width`
    and `depth`; topk: `template`, parent indices in breadth-first order (root first, -1);
    dyspec: `width` nodes per round for `depth` rounds. `chunk`: tokens per forward of a
    catch-up longer than the tree's depth + 1.
    """

    draft: Model
    mode: str = dataclasses.field(default="chain", metadata=dict(static=True))
    k: int = dataclasses.field(default=4, metadata=dict(static=True))
    depth: int = dataclasses.field(default=4, metadata=dict(static=True))
    branching: tuple[int, ...] = dataclasses.field(default=(2, 2, 1), metadata=dict(static=True))
    width: int = dataclasses.field(default=4, metadata=dict(static=True))
    template: tuple[int, ...] = dataclasses.field(default=(-1, 0, 0, 0, 1, 1, 2, 4), metadata=dict(static=True))
    chunk: int = dataclasses.field(default=16, metadata=dict(static=True))

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"unknown DraftModel mode {self.mode!r}; choose from {MODES}")
        for name in ("k", "depth", "width", "chunk"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.mode == "gumbel" and (not self.branching or min(self.branching) < 1):
            raise ValueError(f"branching must be a non-empty tuple of integers >= 1, got {self.branching}")
        if self.mode == "topk":
            if np.any(np.diff(Template.from_parents(self.template).depth) < 0):
                raise ValueError("a topk template must list nodes breadth-first (depth non-decreasing)")

    @property
    def name(self) -> str:
        return f"draft-{self.mode}"

    # ---- static tree layout --------------------------------------------------------------------

    @property
    def _levels(self) -> list[int]:
        """Nodes per level, levels 1..L."""
        if self.mode == "chain":
            return [1] * self.k
        if self.mode in ("iid", "beam", "dyspec"):
            return [self.k if self.mode == "iid" else self.width] * self.depth
        if self.mode == "gumbel":
            return [math.prod(self.branching[: i + 1]) for i in range(len(self.branching))]
        t = Template.from_parents(self.template)
        return [len(t.level(d)) for d in range(1, t.max_depth + 1)]

    @property
    def num_nodes(self) -> int:
        return 1 + sum(self._levels)

    @property
    def max_depth(self) -> int:
        return len(self._levels)

    def _static_parents(self) -> np.ndarray:
        """Parent of every node for the static layouts (beam fills its parents as it goes)."""
        if self.mode == "topk":
            return np.asarray(self.template, np.int32)
        parents, offset, prev = [-1], 1, [0]
        for level, n in enumerate(self._levels):
            if self.mode == "gumbel":
                parents += [prev[j // self.branching[level]] for j in range(n)]
            elif self.mode in ("beam", "dyspec"):
                parents += [0] * n  # placeholders
            else:  # chain, iid: node j continues node j of the previous level (or the root)
                parents += [prev[j] if len(prev) > 1 else prev[0] for j in range(n)]
            prev = list(range(offset, offset + n))
            offset += n
        return np.asarray(parents, np.int32)

    def default_verifier(self, params: sampling.SamplingParams) -> verify.Verifier:
        if params.greedy:
            return verify.Greedy()
        return {"chain": verify.SpeculativeSampling(), "iid": verify.SpecTr(), "gumbel": verify.RSD(),
                "beam": verify.RSD(), "topk": verify.TopK(), "dyspec": verify.RSD()}[self.mode]

    @property
    def supports_chain(self) -> bool:
        return self.mode == "chain"

    def chain(self, k: int) -> "DraftModel":
        """A chain of k (mode 'chain' only); its cache catches up after the steps it skips."""
        if self.mode != "chain":
            return super().chain(k)
        return dataclasses.replace(self, k=k)

    def check(self, target: Model) -> None:
        if self.draft.config.vocab_size != target.config.vocab_size:
            raise ValueError(f"draft vocabulary ({self.draft.config.vocab_size}) differs from the "
                             f"target's ({target.config.vocab_size})")

    # ---- the three functions -------------------------------------------------------------------

    def init(self, target, prompts, lengths, cache_len, prefill=None):
        cfg = self.draft.config
        cache = KVCache.init(cfg, prompts.shape[0], cache_len)
        if prompts.shape[1] > 1:
            cache = fill(self.draft, prompts[:, :-1], cache, compute_logits=False).cache
        return DraftModelState(cache._replace(lengths=lengths - 1))

    def propose(self, state: DraftModelState, ctx: Context, key):
        cfg, cache = self.draft.config, state.cache
        b = ctx.tokens.shape[0]
        # 1. catch up on the tokens committed since the last propose (the root last): `chunk` at
        #    a time while any row lags more than one window, then one window.
        window = self.max_depth + 1

        def feed(c):
            start = jnp.minimum(c.lengths, ctx.length - 1)
            out = forward(cfg, self.draft.params, _tokens_from(ctx.tokens, start, self.chunk),
                          cache=c._replace(lengths=start), compute_logits=False)
            return out.cache._replace(lengths=jnp.minimum(start + self.chunk, ctx.length - 1))

        cache = jax.lax.while_loop(lambda c: jnp.any(c.lengths < ctx.length - window), feed, cache)
        start = jnp.minimum(cache.lengths, ctx.length - 1)
        out = forward(cfg, self.draft.params, _tokens_from(ctx.tokens, start, window),
                      cache=cache._replace(lengths=start))
        root_logits = jnp.take_along_axis(out.logits, (ctx.length - 1 - start)[:, None, None], axis=1)
        cache = out.cache._replace(lengths=ctx.length)
        # 2. grow the tree level by level.
        greedy = ctx.sampling.greedy
        process = functools.partial(sampling.draft_probs, params=ctx.sampling)
        if self.mode == "dyspec":
            def dist_after(tree, new, carry):
                return process(self._tree_logits(tree, cache, ctx)[:, new.start - 1: new.stop - 1]), carry
            tree, _ = growth.dyspec(ctx.root, process(root_logits[:, 0]), dist_after, None, key,
                                    widths=tuple(self._levels), greedy=greedy)
            return tree, DraftModelState(cache)
        n, levels = self.num_nodes, self._levels
        tokens = jnp.zeros((b, n), jnp.int32).at[:, 0].set(ctx.root)
        parents = jnp.broadcast_to(jnp.asarray(self._static_parents()), (b, n))
        q = jnp.zeros((b, n, cfg.vocab_size), jnp.float32)
        dist = process(ctx.constrain(root_logits))  # [B, nodes of the previous level, V]
        score = jnp.zeros((b, 1), jnp.float32)  # beam: perturbed scores G of the previous level
        logq = jnp.zeros((b, 1), jnp.float32)  # beam: log q of each previous-level sequence
        offset, prev_offset = 1, 0
        keys = jax.random.split(key, len(levels))
        for level, width in enumerate(levels):
            nodes = slice(offset, offset + width)
            new_tok, par_local, score, logq = self._expand(level, dist, score, logq, keys[level], greedy)
            tokens = tokens.at[:, nodes].set(new_tok)
            if self.mode == "beam":
                parents = parents.at[:, nodes].set(prev_offset + par_local if level else 0)
            q = q.at[:, nodes].set(jnp.take_along_axis(dist, par_local[:, :, None], axis=1))
            if level + 1 < len(levels):
                tree = DraftTree.build(tokens, parents, max_depth=self.max_depth)
                if self.mode == "chain":  # one node a level: feed it alone, its ancestors' K/V cached
                    out = forward(cfg, self.draft.params, new_tok, cache=cache)
                    cache, logits = out.cache.advance(jnp.ones((b,), jnp.int32)), out.logits
                else:
                    logits = self._tree_logits(tree, cache, ctx)[:, offset - 1: offset - 1 + width]
                dist = process(ctx.constrain(logits, tree, nodes))
            prev_offset, offset = offset, offset + width
        cache = cache._replace(lengths=ctx.length)
        valid = jnp.take_along_axis(q, tokens[:, :, None], axis=2)[..., 0] > 0
        valid = valid.at[:, 0].set(True)
        tree_q = None if (greedy or self.mode == "topk") else q
        tree = DraftTree.build(tokens, parents, q=tree_q, valid=valid, max_depth=self.max_depth)
        return tree, DraftModelState(cache)

    def _tree_logits(self, tree: DraftTree, cache: KVCache, ctx: Context) -> jax.Array:
        """The draft's logits after every non-root node of `tree` [B, N-1, V] (the tree's K/V
        go past the committed entries of `cache`, where nothing reads them later)."""
        return forward(self.draft.config, self.draft.params, tree.tokens[:, 1:],
                       positions=tree.positions(ctx.length - 1)[:, 1:], cache=cache,
                       tree_mask=tree.ancestors[:, 1:, 1:]).logits

    def _expand(self, level, dist, score, logq, key, greedy):
        """Children of one level: tokens [B, n], their parent's position in the previous level
        [B, n], and (beam only) the new scores and sequence log-probabilities."""
        b, n_prev, v = dist.shape
        logd = jnp.log(dist)
        noise = jnp.zeros(logd.shape) if greedy else sampling.gumbel(key, logd.shape)
        if self.mode == "chain" or (self.mode == "iid" and level > 0):
            per = argmax(logd + noise)  # one child per node
            return per, jnp.broadcast_to(jnp.arange(n_prev), (b, n_prev)), score, logq
        if self.mode == "iid":  # level 1: k independent draws from the root (top-k when greedy)
            if greedy:
                tok = jax.lax.top_k(logd[:, 0], self.k)[1]
            else:
                tok = jax.random.categorical(key, logd[:, 0, None, :], axis=-1, shape=(b, self.k))
            return tok.astype(jnp.int32), jnp.zeros((b, self.k), jnp.int32), score, logq
        if self.mode in ("gumbel", "topk"):
            local_parent, rank = self._selection(level)
            g = logd if self.mode == "topk" else logd + noise
            top = jax.lax.top_k(g, int(rank.max()) + 1)[1]  # [B, n_prev, fanout], draw/rank order
            return (top[:, local_parent, rank].astype(jnp.int32),
                    jnp.broadcast_to(jnp.asarray(local_parent), (b, len(rank))), score, logq)
        # beam: stochastic beam search over (beam, token) pairs.
        phi = logq[:, :, None] + logd  # [B, W_prev, V]
        if greedy:
            g = phi
        else:
            perturbed = phi + noise
            z = perturbed.max(-1, keepdims=True)
            g = _truncated_gumbel(score[:, :, None], perturbed, z)
        top_g, flat = jax.lax.top_k(g.reshape(b, -1), self.width)
        par, tok = flat // v, flat % v
        return tok.astype(jnp.int32), par.astype(jnp.int32), top_g, jnp.take_along_axis(
            phi.reshape(b, -1), flat, axis=1)

    def _selection(self, level) -> tuple[np.ndarray, np.ndarray]:
        """For each node of level + 1 (static layouts): its parent's position within level
        `level`, and its rank among its siblings (the k-th child takes the k-th draw)."""
        t = Template.from_parents(self._static_parents())
        nodes = t.level(level + 1)
        return np.searchsorted(t.level(level), t.parents[nodes]).astype(np.int32), t.rank[nodes]


def _tokens_from(tokens, start, n):
    """tokens[b, start[b]: start[b] + n] of each row [B, n] (indices past the end clipped)."""
    idx = jnp.clip(start[:, None] + jnp.arange(n)[None, :], 0, tokens.shape[1] - 1)
    return jnp.take_along_axis(tokens, idx, axis=1)


def _truncated_gumbel(t, perturbed, z):
    """Gumbels `perturbed` conditioned on their maximum being t (Kool et al. 2019, appendix B,
    the numerically stable form): t - max(v, 0) - log1p(exp(-|v|)), v = t - x + log1mexp(x - z)."""
    v = t - perturbed + jnp.log(-jnp.expm1(jnp.minimum(perturbed - z, -1e-30)))
    out = t - jnp.maximum(v, 0) - jnp.log1p(jnp.exp(-jnp.abs(v)))
    return jnp.where(jnp.isfinite(perturbed), out, -jnp.inf)
