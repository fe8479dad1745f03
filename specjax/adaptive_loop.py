"""The device side of adaptive speculation (`specjax.adaptive`): the goodput rule and the compiled
loop that picks a chain length by it for each segment and `lax.switch`es to that variant."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from specjax import decoding, engine


class LoopPolicy(NamedTuple):
    """`Adaptive`'s settings less the drafter: hashable, a static jit argument."""

    ks: tuple[int, ...]
    decay: float
    probe_every: int
    margin: float
    segment: int


def expected_tokens(rates, ks):
    """E[tokens per step] of a chain of k drafts, for each k in `ks` (bonus included):
    1 + sum_{d <= k} prod_{j <= d} rates[j - 1]."""
    rates = jnp.asarray(rates, jnp.float32)
    return jnp.concatenate([jnp.ones(1), 1.0 + jnp.cumsum(jnp.cumprod(rates))])[jnp.asarray(ks)]


def goodput(rates, ks, costs, margin: float):
    """Tokens per second of each k in `ks` (ks[0] = 0), AR's raised by the margin a chain must beat."""
    return expected_tokens(rates, ks) / jnp.asarray(costs) * jnp.where(jnp.asarray(ks) == 0, 1.0 + margin, 1.0)


class Carry(NamedTuple):
    """The outer loop's state: the decode state and the per-depth counts."""

    state: engine.DecodeState
    succ: jax.Array  # float32[kmax]: decayed accepted drafts per depth (seeded: rate, weight 1)
    tried: jax.Array  # float32[kmax]: decayed drafts per depth whose parent was accepted
    since_spec: jax.Array  # int32: consecutive k = 0 steps
    gap: jax.Array  # int32: AR steps before the next probe (doubles after each probe)
    k_counts: jax.Array  # int32[len(ks)]: steps taken with each k
    drafted: jax.Array  # int32[kmax]: row-steps that drafted depth d and accepted depth d - 1
    reached: jax.Array  # int32[kmax]: row-steps that accepted depth d


_MAX_GAP = 256


def _choose(ad: LoopPolicy, carry: Carry, costs: jax.Array, force: jax.Array):
    """(variant index, steps to run it, next probe gap). A k = 0 choice runs until the next
    probe, since nothing it does can change the rates."""
    best = jnp.argmax(goodput(carry.succ / jnp.maximum(carry.tried, 1e-6), ad.ks, costs, ad.margin))
    best = best.astype(jnp.int32)
    if ad.probe_every > 0:
        probe = (best == 0) & (carry.since_spec >= carry.gap)
        gap = jnp.where(probe, jnp.minimum(2 * carry.gap, _MAX_GAP), jnp.where(best > 0, ad.probe_every, carry.gap))
        ar_steps = carry.gap - carry.since_spec
    else:
        probe, gap, ar_steps = jnp.bool_(False), carry.gap, jnp.int32(_MAX_GAP)
    probe = probe & (force < 0)
    idx = jnp.where(force >= 0, force, jnp.where(probe, 1, best))  # force >= 0: calibrating
    ar_steps = jnp.where(force >= 0, _MAX_GAP, ar_steps)
    return idx, jnp.where(idx == 0, ar_steps, jnp.where(probe, 1, ad.segment)), gap


def _branch(model, drafter, verifier, settings, kmax: int):
    """One engine step of a variant: (state, step_hist int32[B, kmax + 1], the step's accepted
    count one-hot on the rows that stepped)."""
    def run(state: engine.DecodeState):
        state, record = engine.step(model, drafter, state, settings=settings, verifier=verifier)
        return state, jax.nn.one_hot(record.num_accepted, kmax + 1, dtype=jnp.int32) * record.active[:, None]
    return run


def _segment(step, k: int, decay: float, kmax: int):
    """Up to n steps of one variant in an inner while_loop; a k > 0 variant also updates the
    per-depth counts: (state, succ, tried, drafted, reached, n) -> (..., steps run)."""
    arange = jnp.arange(kmax + 1)
    depth = jnp.arange(1, kmax + 1)

    def observe(c, step_hist):
        succ, tried, drafted, reached = c
        accepted = (step_hist * arange).sum(1)[:, None]
        live = step_hist.sum(1)[:, None] > 0
        new_drafted = (live & (depth <= k) & (accepted >= depth - 1)).sum(0)
        new_reached = (live & (accepted >= depth)).sum(0)
        forget = jnp.where(depth <= k, decay, 1.0)  # depths this variant does not draft keep their estimate
        return (forget * succ + new_reached, forget * tried + new_drafted,
                drafted + new_drafted, reached + new_reached)

    def run(args):
        state, *counts, n = args

        def body(c):
            state, counts, i = c
            state, step_hist = step(state)
            return state, observe(counts, step_hist) if k > 0 else counts, i + 1

        state, counts, ran = jax.lax.while_loop(lambda c: (c[2] < n) & ~jnp.all(c[0].done), body,
                                                (state, tuple(counts), jnp.int32(0)))
        return (state, *counts, ran)
    return run


def _decode(model, variants, rows: decoding.Batch, key, constraint, costs, rates, force, *, ad, settings,
            verifiers, cache_len) -> Carry:
    """Prefill, then the outer loop picks a variant by goodput; the chosen variant runs a segment
    in its own inner loop (one lax.switch per segment, so its cost is paid once per segment)."""
    state = engine.prefill(model, variants[-1], rows.prompts, rows.lengths, key, settings=settings,
                           cache_len=cache_len, constraint=constraint, budget=rows.budget)
    kmax = ad.ks[-1]
    segments = [_segment(_branch(model, d, v, settings, kmax), k, ad.decay, kmax)
                for d, v, k in zip(variants, verifiers, ad.ks)]

    def body(c: Carry) -> Carry:
        idx, n, gap = _choose(ad, c, costs, force)
        state, succ, tried, drafted, reached, ran = jax.lax.switch(
            idx, segments, (c.state, c.succ, c.tried, c.drafted, c.reached, n))
        return Carry(state, succ, tried, jnp.where(idx == 0, c.since_spec + ran, 0), gap,
                      c.k_counts.at[idx].add(ran), drafted, reached)

    zeros = jnp.zeros((kmax,), jnp.int32)
    carry = Carry(state, rates, jnp.ones((kmax,), jnp.float32), jnp.int32(0), jnp.int32(ad.probe_every),
                   jnp.zeros((len(ad.ks),), jnp.int32), zeros, zeros)
    return jax.lax.while_loop(lambda c: ~jnp.all(c.state.done), body, carry)


decode = jax.jit(_decode, static_argnames=("ad", "settings", "verifiers", "cache_len"))
