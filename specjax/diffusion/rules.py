"""Which masked positions a dLLM commits after a forward: the selection rules of the parallel
decoding literature, each a frozen dataclass whose `select` turns this forward's predictions
into a bool mask (no variable-size gathers).

Every rule commits at least one eligible position per forward (the most confident one), so a
block always finishes. `eligible` = still MASK and inside the current block.

| rule | paper | commits |
|---|---|---|
| `TopK(k)` | LLaDA's low-confidence remasking | the k most confident (k per step: the static baseline) |
| `RandomK(k)` | LLaDA's random remasking | k drawn uniformly at random, whatever the predictions |
| `Threshold(tau)` | Fast-dLLM | the most confident, and every one with confidence >= tau |
| `Factor(f)` | Fast-dLLM | the longest prefix by confidence with (n + 1)(1 - c(n)) < f |
| `Entropy(h)` | dParallel | the lowest-entropy one, and every one with entropy < h |
| `LocalLeap(...)` | LocalLeap | Threshold, with tau relaxed within `radius` of an anchor |
| `Credit(...)` | CreditDecoding | Threshold on logits fused with decayed trace credits |
| `Learn2PD(...)` | Learn2PD | the most confident, and those a small filter MLP accepts |
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from pallas_kernels import argmax
from specjax.pytrees import register_dataclass

NEG_INF = -jnp.inf


class Prediction(NamedTuple):
    """A forward's guess at every canvas position: x0 int32[B, T] (argmax, or Gumbel-max with a
    temperature), conf float32[B, T] (softmax probability of x0), entropy float32[B, T]."""

    x0: jax.Array
    conf: jax.Array
    entropy: jax.Array


def predict(logits: jax.Array, temperature: float = 0.0, key: jax.Array | None = None) -> Prediction:
    """Prediction from float logits [B, T, V] (MASK already excluded by the caller). With a
    temperature, x0 = argmax(logits + temperature * Gumbel) (LLaDA's sampler), the confidence
    still that of the unperturbed softmax."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    scores = logp if temperature == 0 else logp + temperature * jax.random.gumbel(key, logp.shape)
    x0 = argmax(scores)
    conf = jnp.exp(jnp.take_along_axis(logp, x0[..., None], axis=-1)[..., 0])
    entropy = -jnp.sum(jnp.exp(logp) * jnp.where(jnp.isfinite(logp), logp, 0.0), axis=-1)
    return Prediction(x0, conf, entropy)


class Context(NamedTuple):
    """Where the current block is: eligible bool[B, T] (MASK and in the block), block_start
    int32[B] (canvas index), whether this is the block's first forward (bool scalar), and this
    forward's random key for rules that draw (`RandomK`)."""

    eligible: jax.Array
    block_start: jax.Array
    first: jax.Array
    key: jax.Array | None = None


def rank_of(score: jax.Array, eligible: jax.Array) -> jax.Array:
    """int32[B, T]: each eligible position's rank by descending score (ties: lower index
    first); ineligible positions rank after every eligible one."""
    key = jnp.where(eligible, -score, jnp.inf)
    order = jnp.argsort(key, axis=-1, stable=True)
    return jnp.argsort(order, axis=-1, stable=True).astype(jnp.int32)


def _best_and(eligible, score, extra):
    """The top-scoring eligible position, plus eligible positions where `extra` holds."""
    return eligible & ((rank_of(score, eligible) == 0) | extra)


def _pytree(cls):
    """Register a rule as a pytree: its arrays (Learn2PD's `params`) are leaves, every other
    field static, so a rule passes through jit as an argument."""
    return register_dataclass(cls, data_fields=[f.name for f in dataclasses.fields(cls) if f.name == "params"])


class Rule:
    """A selection rule. `init` makes the state carried across forwards (reset at each block),
    `fuse` may rewrite the logits before `predict` (CreditDecoding), `select` picks."""

    def init(self, batch: int, length: int, vocab: int) -> Any:
        return ()

    def fuse(self, logits: jax.Array, state: Any, ctx: Context) -> tuple[jax.Array, Any]:
        return logits, state

    def select(self, pred: Prediction, ctx: Context, state: Any) -> jax.Array:
        raise NotImplementedError


@_pytree
@dataclasses.dataclass(frozen=True)
class TopK(Rule):
    """LLaDA's low-confidence remasking with k tokens per forward (k = 1: static decoding)."""

    k: int = 1

    def __post_init__(self):
        if self.k < 1:
            raise ValueError(f"TopK needs k >= 1, got {self.k}")

    def select(self, pred, ctx, state):
        return ctx.eligible & (rank_of(pred.conf, ctx.eligible) < self.k)


@_pytree
@dataclasses.dataclass(frozen=True)
class RandomK(Rule):
    """LLaDA's random remasking: k eligible positions drawn uniformly at random, independently
    of the predictions (the order ParallelBench's closed-form accuracies assume)."""

    k: int = 1

    def __post_init__(self):
        if self.k < 1:
            raise ValueError(f"RandomK needs k >= 1, got {self.k}")

    def select(self, pred, ctx, state):
        if ctx.key is None:
            raise ValueError("RandomK draws its positions: the Context needs a key")
        return ctx.eligible & (rank_of(jax.random.uniform(ctx.key, ctx.eligible.shape), ctx.eligible) < self.k)


@_pytree
@dataclasses.dataclass(frozen=True)
class Threshold(Rule):
    """Fast-dLLM: the most confident eligible position and every one with conf >= tau."""

    tau: float = 0.9

    def select(self, pred, ctx, state):
        return _best_and(ctx.eligible, pred.conf, pred.conf >= self.tau)


@_pytree
@dataclasses.dataclass(frozen=True)
class Factor(Rule):
    """Fast-dLLM's factor rule: sort the eligible confidences c(1) >= c(2) >= ...; commit the
    largest n with c(m) >= 1 - f / (m + 1) for every m <= n (m = 1 always). The reference loop
    also accepts a failing token when it is the last one; this rule does not."""

    f: float = 1.0

    def select(self, pred, ctx, state):
        rank = rank_of(pred.conf, ctx.eligible)
        order = jnp.argsort(rank, axis=-1)
        sorted_conf = jnp.take_along_axis(jnp.where(ctx.eligible, pred.conf, NEG_INF), order, axis=-1)
        m = jnp.arange(1, sorted_conf.shape[-1] + 1)
        ok = (sorted_conf >= 1.0 - self.f / (m + 1)) | (m == 1)
        n = jnp.sum(jnp.cumprod(ok, axis=-1), axis=-1, keepdims=True)
        return ctx.eligible & (rank < n)


@_pytree
@dataclasses.dataclass(frozen=True)
class Entropy(Rule):
    """dParallel's decoding: the lowest-entropy eligible position and every one with entropy < h."""

    h: float = 0.5

    def select(self, pred, ctx, state):
        return _best_and(ctx.eligible, -pred.entropy, pred.entropy < self.h)


@_pytree
@dataclasses.dataclass(frozen=True)
class LocalLeap(Rule):
    """LocalLeap: anchors (eligible, conf >= tau) relax the threshold to `relaxed` for the
    positions within `radius` of one; the most confident position is always committed."""

    tau: float = 0.9
    relaxed: float = 0.75
    radius: int = 4

    def select(self, pred, ctx, state):
        anchor = ctx.eligible & (pred.conf >= self.tau)
        width = 2 * self.radius + 1
        near = jax.lax.reduce_window(anchor, False, jax.lax.bitwise_or, (1, width), (1, 1),
                                     ((0, 0), (self.radius, self.radius)))
        return _best_and(ctx.eligible, pred.conf, pred.conf >= jnp.where(near, self.relaxed, self.tau))


@_pytree
@dataclasses.dataclass(frozen=True)
class Credit(Rule):
    """CreditDecoding (dInfer's CreditThresholdParallelDecoder): a credit C[B, T, V] decays by
    beta each forward of a block after the first; each eligible position's top-1 token earns
    p^gamma; logits + alpha * log(1 + C) then go through the threshold rule. Memory: T * V
    floats per row."""

    tau: float = 0.9
    alpha: float = 0.7
    gamma: float = 0.2
    beta: float = 0.8

    def init(self, batch, length, vocab):
        return jnp.zeros((batch, length, vocab), jnp.float32)

    def fuse(self, logits, state, ctx):
        credit = jnp.where(ctx.first, 0.0, self.beta * state)
        p = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
        top = argmax(p)
        earned = jnp.take_along_axis(p, top[..., None], axis=-1) ** self.gamma
        credit = credit + jnp.where(ctx.eligible[..., None], jax.nn.one_hot(top, p.shape[-1]) * earned, 0.0)
        return logits + self.alpha * jnp.log1p(credit), credit

    def select(self, pred, ctx, state):
        return _best_and(ctx.eligible, pred.conf, pred.conf >= self.tau)


@_pytree
@dataclasses.dataclass(frozen=True)
class Learn2PD(Rule):
    """Learn2PD's filter: an MLP over the top-1 confidences of the block's `block_length`
    positions (committed ones included) scores each position; commit the eligible ones whose
    sigmoid score exceeds `accept`, plus the most confident. `params`: the MLP's layers as
    ((w [n, n], b [n]), ...) with ReLU between (`specjax.diffusion.learn2pd.train_filter`)."""

    params: tuple = dataclasses.field(compare=False)
    block_length: int = 32
    accept: float = 0.96

    def select(self, pred, ctx, state):
        accepted = filter_scores(self.params, block_confidences(pred.conf, ctx.block_start, self.block_length))
        extra = scatter_block(accepted > self.accept, ctx.block_start, pred.conf.shape[-1])
        return _best_and(ctx.eligible, pred.conf, extra)


def filter_scores(params, conf_block: jax.Array) -> jax.Array:
    """sigmoid(MLP(conf_block)) float32[B, n] for block confidences [B, n]."""
    h = conf_block
    for i, (w, b) in enumerate(params):
        h = h @ w + b
        if i < len(params) - 1:
            h = jax.nn.relu(h)
    return jax.nn.sigmoid(h)


def block_confidences(conf: jax.Array, block_start: jax.Array, n: int) -> jax.Array:
    """float32[B, n]: conf at canvas positions [block_start, block_start + n) (0 past the end)."""
    idx = block_start[:, None] + jnp.arange(n)[None, :]
    inside = idx < conf.shape[-1]
    return jnp.where(inside, jnp.take_along_axis(conf, jnp.minimum(idx, conf.shape[-1] - 1), axis=-1), 0.0)


def scatter_block(values: jax.Array, block_start: jax.Array, length: int) -> jax.Array:
    """bool[B, length]: `values` bool[B, n] placed at [block_start, block_start + n)."""
    rows = jnp.arange(values.shape[0])[:, None]
    idx = block_start[:, None] + jnp.arange(values.shape[1])[None, :]
    return jnp.zeros((values.shape[0], length), bool).at[rows, idx].set(values, mode="drop")
