"""Logits -> processed distribution (temperature, top-k, top-p), and the sampling helpers.

Every acceptance rule in specjax is exact with respect to the *processed* target distribution
returned by `probs`; drafters apply the same processing to their own logits.  Temperature 0 is
greedy decoding: the processed distribution is a point mass on the argmax (ties to the lowest
index), so greedy and sampled decoding share one code path.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from pallas_kernels import argmax


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Static sampling settings (hashable, so they can be a static jit argument)."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        if not _number(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if self.top_k is not None and (not _number(self.top_k) or not isinstance(self.top_k, int)
                                       or self.top_k < 1):
            raise ValueError(f"top_k must be an integer >= 1 or None, got {self.top_k!r}")
        if self.top_p is not None and (not _number(self.top_p) or not 0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1] or None, got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _number(x) -> bool:
    """A finite real number (NaN, inf and bools are not)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def probs(logits: jax.Array, params: SamplingParams) -> jax.Array:
    """Processed float32 distribution over the last axis of `logits`."""
    logits = logits.astype(jnp.float32)
    if params.greedy:
        return jax.nn.one_hot(argmax(logits), logits.shape[-1], dtype=jnp.float32)
    logits = logits / params.temperature
    if params.top_k is not None and params.top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logits, params.top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if params.top_p is not None and params.top_p < 1.0:
        # Keep the smallest prefix of the sorted distribution whose mass reaches top_p.
        sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
        sorted_p = jax.nn.softmax(sorted_logits, axis=-1)
        mass_before = jnp.cumsum(sorted_p, axis=-1) - sorted_p
        keep = mass_before < params.top_p
        cutoff = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < cutoff, -jnp.inf, logits)
    return jax.nn.softmax(logits, axis=-1)


def draft_probs(logits: jax.Array, params: SamplingParams) -> jax.Array:
    """A draft's distribution q: the processed one when sampling; at temperature 0 its softmax,
    whose ranking the draft follows (Greedy verification reads no q)."""
    return jax.nn.softmax(logits.astype(jnp.float32), axis=-1) if params.greedy else probs(logits, params)


def sample(key: jax.Array, p: jax.Array) -> jax.Array:
    """One int32 draw from each distribution on the last axis of `p` (rows need not be normalised)."""
    logp = jnp.log(jnp.maximum(p, 0.0))
    return jax.random.categorical(key, logp, axis=-1).astype(jnp.int32)


def gumbel(key: jax.Array, shape, dtype=jnp.float32) -> jax.Array:
    """Standard Gumbel noise, for Gumbel-max and Gumbel-top-k draws."""
    return jax.random.gumbel(key, shape, dtype)
