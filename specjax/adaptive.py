"""Adaptive speculation length by goodput (SmartSpec, arXiv 2406.14066).

The speculation length k is chosen from a small menu (default {0, 1, 2, 4}; k = 0 is plain
autoregressive decoding) to maximise the estimated goodput

    goodput(k) = E[tokens | alpha, k] / cost(k),   E = (1 - alpha^(k+1)) / (1 - alpha),

where alpha is a moving average of the per-token acceptance rate over the batch (accepted
drafts / drafts tried up to and including the first rejection, decayed by `decay` per step)
and cost(k) is the measured wall time of one step of the k-variant at this batch size,
profiled once on the host before the run (`profile_costs`: the same compiled loop with the
choice forced to each k) and passed in as an array.

Every variant is `engine.step` with its own drafter (a chain truncated to k, or the empty
drafter for k = 0), compiled once. An outer `lax.while_loop` picks k and `lax.switch`es to
that variant, which runs a segment of `segment` steps (default 8; alpha is updated after every
step) in its own inner while_loop — so the choice is re-made every `segment` steps rather
than every step, because a switch carries the whole decode state in and out of the branch
and on CPU that costs about as much as a small model's step. A k = 0 step costs what an AR
step costs: nothing of a bigger tree is run and masked. The draft model's cache is not fed
during k = 0 steps; the next k > 0 step first catches it up in chunks (`CatchUpDraftModel`).
While k = 0 wins alpha is not observed, so after `probe_every` consecutive AR steps one step
runs the smallest k > 0 to refresh it; the gap doubles after each probe (up to 256 steps) and
resets when speculation wins again.

Greedy output equals plain AR token for token (every variant is lossless); with sampling, each
variant uses its drafter's exact rule, so the output law is the target's.
"""

from __future__ import annotations

import dataclasses
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax import engine
from specjax.drafters.base import Context, Drafter, NoDrafter
from specjax.drafters.draft_model import DraftModel
from specjax.drafters.prompt_lookup import PromptLookup
from specjax.models import KVCache, Model, forward


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class CatchUpDraftModel(DraftModel):
    """A chain DraftModel whose cache may lag the committed tokens by any amount: `propose`
    first feeds the missing tokens `chunk` at a time, then drafts as DraftModel does."""

    chunk: int = dataclasses.field(default=16, metadata=dict(static=True))

    def propose(self, cache: KVCache, ctx: Context, key):
        cfg, params = self.draft.config, self.draft.params
        limit = ctx.length - 1 - self.max_depth  # DraftModel.propose catches up <= max_depth + 1

        def feed(c):
            start = jnp.minimum(c.lengths, ctx.length - 1)
            idx = jnp.clip(start[:, None] + jnp.arange(self.chunk)[None, :], 0, ctx.tokens.shape[1] - 1)
            out = forward(cfg, params, jnp.take_along_axis(ctx.tokens, idx, axis=1),
                          cache=c._replace(lengths=start), compute_logits=False)
            return out.cache._replace(lengths=jnp.minimum(start + self.chunk, ctx.length - 1))

        cache = jax.lax.while_loop(lambda c: jnp.any(c.lengths < limit), feed, cache)
        return super().propose(cache, ctx, key)


def truncate(base: Drafter, k: int) -> Drafter:
    """The variant of `base` that drafts a chain of k tokens (k = 0: the empty drafter, which
    passes the base's state through untouched)."""
    if k == 0:
        return NoDrafter()
    if isinstance(base, DraftModel) and base.mode == "chain":
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(DraftModel)}
        return CatchUpDraftModel(**{**fields, "k": k})
    if isinstance(base, PromptLookup):
        return dataclasses.replace(base, num_tokens=k)
    raise ValueError(f"adaptive speculation needs a chain drafter (DraftModel mode='chain' or "
                     f"PromptLookup), got {base.name}")


@dataclasses.dataclass(frozen=True)
class Adaptive:
    """Goodput-driven choice among chain lengths `ks` of `base` (0 = autoregressive)."""

    base: Drafter
    ks: tuple[int, ...] = (0, 1, 2, 4)
    decay: float = 0.9
    probe_every: int = 16
    prior_alpha: float = 0.5
    segment: int = 8

    def __post_init__(self):
        ks = tuple(int(k) for k in self.ks)
        if not ks or ks[0] != 0 or any(b <= a for a, b in zip(ks, ks[1:])):
            raise ValueError(f"ks must start at 0 and increase, got {self.ks}")
        if len(ks) < 2:
            raise ValueError("ks needs at least one speculation length > 0")
        if self.segment < 1 or self.probe_every < 0:
            raise ValueError(f"segment must be >= 1 and probe_every >= 0, got {self.segment}, {self.probe_every}")
        if not 0.0 <= self.decay < 1.0 or not 0.0 <= self.prior_alpha < 1.0:
            raise ValueError("decay and prior_alpha must lie in [0, 1)")
        truncate(self.base, ks[1])  # raises for drafters that cannot be truncated

    @property
    def name(self) -> str:
        return f"adaptive-{self.base.name}"

    def variants(self) -> tuple[Drafter, ...]:
        return tuple(truncate(self.base, k) for k in self.ks)

    @property
    def policy(self) -> "_Policy":
        """The hashable settings of the loop (a static jit argument; `base` holds arrays)."""
        return _Policy(tuple(int(k) for k in self.ks), float(self.decay), int(self.probe_every),
                       float(self.prior_alpha), int(self.segment))


class _Policy(NamedTuple):
    ks: tuple[int, ...]
    decay: float
    probe_every: int
    prior_alpha: float
    segment: int


class _Carry(NamedTuple):
    state: engine.DecodeState
    succ: jax.Array  # float32: decayed accepted drafts
    tried: jax.Array  # float32: decayed drafts tried (through the first rejection)
    since_spec: jax.Array  # int32: consecutive k = 0 steps
    gap: jax.Array  # int32: AR steps before the next probe (doubles after each probe)
    k_counts: jax.Array  # int32[len(ks)]: steps taken with each k
    drafted: jax.Array  # int32[kmax]: row-steps that drafted depth d and accepted depth d - 1
    reached: jax.Array  # int32[kmax]: row-steps that accepted depth d


def expected_tokens(alpha, k):
    """E[tokens per step] for a chain of k drafts with i.i.d. acceptance alpha (bonus included)."""
    alpha = jnp.clip(alpha, 0.0, 0.999)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def _choose(ad: _Policy, carry: _Carry, costs: jax.Array, force: jax.Array):
    """(variant index, steps to run it, next probe gap)."""
    ks = jnp.asarray(ad.ks, jnp.float32)
    alpha = carry.succ / jnp.maximum(carry.tried, 1e-6)
    best = jnp.argmax(expected_tokens(alpha, ks) / costs).astype(jnp.int32)
    probe = (best == 0) & (ad.probe_every > 0) & (carry.since_spec >= carry.gap)
    gap = jnp.where(probe, jnp.minimum(2 * carry.gap, _MAX_GAP),
                    jnp.where(best > 0, ad.probe_every, carry.gap))
    idx = jnp.where(force >= 0, force, jnp.where(probe, 1, best))  # force >= 0: profiling
    return idx, jnp.where(probe & (force < 0), 1, ad.segment), gap


_MAX_GAP = 256


def _branch(model, drafter, verifier, settings, k: int, kmax: int):
    """One step of the k-variant: (state with the step's accepted counts added, step_hist)."""
    def run(state: engine.DecodeState):
        b = state.length.shape[0]
        s = state._replace(accepted_hist=jnp.zeros((b, k + 1), jnp.int32))
        s = engine.step(model, drafter, s, settings=settings, verifier=verifier)
        step_hist = jnp.pad(s.accepted_hist, ((0, 0), (0, kmax - k)))
        return s._replace(accepted_hist=state.accepted_hist + step_hist), step_hist
    return run


def _segment(step, k: int, decay: float, kmax: int):
    """Up to n steps of one variant in an inner while_loop, updating the acceptance averages
    and the per-depth counts: (state, succ, tried, drafted, reached, n) -> (..., steps run)."""
    arange = jnp.arange(kmax + 1)
    depth = jnp.arange(1, kmax + 1)

    def run(args):
        state, succ, tried, drafted, reached, n = args

        def body(c):
            state, succ, tried, drafted, reached, i = c
            state, step_hist = step(state)
            accepted = (step_hist * arange).sum(1)
            active = step_hist.sum(1)
            t = accepted + active * (accepted < k)
            live = active[:, None] > 0
            drafted = drafted + (live & (depth <= k) & (accepted[:, None] >= depth - 1)).sum(0)
            reached = reached + (live & (accepted[:, None] >= depth)).sum(0)
            return (state, decay * succ + accepted.sum(), decay * tried + t.sum(), drafted, reached, i + 1)

        return jax.lax.while_loop(lambda c: (c[5] < n) & ~jnp.all(c[0].done), body,
                                  (state, succ, tried, drafted, reached, jnp.int32(0)))
    return run


def _loop(model, variants, state, costs, force, *, ad, settings, verifiers):
    """The outer loop picks a variant by goodput; the chosen variant runs a segment of
    `ad.segment` steps in its own inner loop (one lax.switch per segment, so the switch's
    cost is paid once per segment, not per step)."""
    kmax = ad.ks[-1]
    segments = [_segment(_branch(model, d, v, settings, k, kmax), k, ad.decay, kmax)
                for d, v, k in zip(variants, verifiers, ad.ks)]

    def body(c: _Carry) -> _Carry:
        idx, n, gap = _choose(ad, c, costs, force)
        state, succ, tried, drafted, reached, ran = jax.lax.switch(
            idx, segments, (c.state, c.succ, c.tried, c.drafted, c.reached, n))
        return _Carry(state, succ, tried, jnp.where(idx == 0, c.since_spec + ran, 0), gap,
                      c.k_counts.at[idx].add(ran), drafted, reached)

    carry = _Carry(state, jnp.float32(ad.prior_alpha), jnp.float32(1.0), jnp.int32(0),
                   jnp.int32(ad.probe_every), jnp.zeros((len(ad.ks),), jnp.int32),
                   jnp.zeros((kmax,), jnp.int32), jnp.zeros((kmax,), jnp.int32))
    return jax.lax.while_loop(lambda c: ~jnp.all(c.state.done), body, carry)


def _decode(model, variants, prompts, lengths, key, costs, force, *, ad, settings, verifiers, cache_len):
    state = engine.prefill(model, variants[-1], prompts, lengths, key, settings=settings, cache_len=cache_len)
    return _loop(model, variants, state, costs, force, ad=ad, settings=settings, verifiers=verifiers)


_decode_jit = jax.jit(_decode, static_argnames=("ad", "settings", "verifiers", "cache_len"))


def _setup(model, prompts, ad, max_new_tokens, temperature, top_k, top_p, eos_token_id):
    padded, lengths = engine.pad_prompts(prompts, model.config.vocab_size)
    variants = ad.variants()
    plan = engine._plan(model.config, model, padded.shape[1], variants[-1], None, max_new_tokens,
                        temperature, top_k, top_p, eos_token_id)
    verifiers = tuple(d.default_verifier(plan.settings.sampling) for d in variants)
    return padded, lengths, variants, plan, verifiers


def profile_costs(model: Model, prompts, ad: Adaptive, *, max_new_tokens: int = 64, repeats: int = 2,
                  temperature: float = 0.0, top_k=None, top_p=None) -> np.ndarray:
    """Seconds per decode step of each variant in `ad.ks` at the batch size of `prompts`: the
    adaptive loop itself (compiled once, shared with `generate`) decodes `prompts` with the
    choice forced to each k in turn; cost = wall time / loop steps, the least of `repeats`
    runs after a compiling one. The prefill is in the wall time, which charges variants with
    fewer steps (longer k) a little more: the error leans towards AR."""
    padded, lengths, variants, plan, verifiers = _setup(model, prompts, ad, max_new_tokens,
                                                        temperature, top_k, top_p, None)
    args = (model, variants, jnp.asarray(padded), jnp.asarray(lengths), jax.random.key(0),
            jnp.ones((len(ad.ks),), jnp.float32))
    kw = dict(ad=ad.policy, settings=plan.settings, verifiers=verifiers, cache_len=plan.cache_len)
    jax.block_until_ready(_decode_jit(*args, jnp.int32(0), **kw).state.out)  # compile
    best = np.full(len(ad.ks), np.inf)
    for _ in range(repeats):
        for i in range(len(ad.ks)):
            t0 = time.perf_counter()
            carry = _decode_jit(*args, jnp.int32(i), **kw)
            steps = int(jax.device_get(carry.state.target_calls).max())
            best[i] = min(best[i], (time.perf_counter() - t0) / max(steps, 1))
    return best.astype(np.float32)


def generate(model: Model, prompts, ad: Adaptive, *, max_new_tokens: int = 64, costs=None,
             temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
             key: jax.Array | None = None, eos_token_id=None) -> engine.GenerateOutput:
    """`sj.generate` with the speculation length chosen per step by goodput. `costs`: seconds
    per step of each k in `ad.ks` at this batch size (None: profiled here, see profile_costs).
    stats add `k_counts` (steps per k) and `costs`; acceptance_per_depth[d-1] counts only the
    steps that drafted depth d and accepted depth d - 1."""
    if costs is None:
        costs = profile_costs(model, prompts, ad, max_new_tokens=max_new_tokens, temperature=temperature,
                              top_k=top_k, top_p=top_p)
    costs = np.asarray(costs, np.float32)
    if costs.shape != (len(ad.ks),) or not np.all(costs > 0):
        raise ValueError(f"costs must be {len(ad.ks)} positive step times (one per k in {ad.ks}), got {costs}")
    padded, lengths, variants, plan, verifiers = _setup(model, prompts, ad, max_new_tokens,
                                                        temperature, top_k, top_p, eos_token_id)
    key = jax.random.key(0) if key is None else key
    t0 = time.perf_counter()
    carry = _decode_jit(model, variants, jnp.asarray(padded), jnp.asarray(lengths), key, jnp.asarray(costs),
                        jnp.int32(-1), ad=ad.policy, settings=plan.settings, verifiers=verifiers, cache_len=plan.cache_len)
    s = carry.state
    tokens, num, calls, hist, k_counts, drafted, reached = jax.device_get(
        (s.out, s.num_out, s.target_calls, s.accepted_hist, carry.k_counts, carry.drafted, carry.reached))
    wall = time.perf_counter() - t0
    stats = engine._stats(plan, num, calls, hist, wall)
    # acceptance at depth d among the steps that drafted depth d (AR steps and shorter chains
    # are not counted as rejections, as engine._stats would count them)
    stats["acceptance_per_depth"] = [float(r / d) if d else 0.0 for r, d in zip(reached, drafted)]
    stats.update(method=ad.name, verifier=type(verifiers[-1]).__name__,
                 k_counts={int(k): int(n) for k, n in zip(ad.ks, k_counts)},
                 costs=[float(c) for c in costs])
    return engine.GenerateOutput(np.asarray(tokens), np.asarray(num), stats)
