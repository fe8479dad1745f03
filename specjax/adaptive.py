"""Adaptive speculation length by goodput (SmartSpec, arXiv 2406.14066).

The speculation length k is chosen from a small menu (default {0, 1, 2, 4}; k = 0 is plain
autoregressive decoding) to maximise the goodput

    goodput(k) = E[tokens | k] / cost(k),   E[tokens | k] = 1 + sum_{d <= k} prod_{j <= d} r_j,

where r_d is the acceptance rate at draft depth d given that depth d - 1 was accepted, and
cost(k) is the wall time of one step of the k-variant at this batch size. AR has to be beaten
by `margin` (default 10%): a win inside the noise of the measured costs is not worth the risk.
A `Calibration` holds costs and rates for one batch size, measured once on the host by
`Adaptive.calibrate`: the decode loop below, with the choice forced to each k in turn; where
they predict a win, the free-running loop then races AR's program on the same prompts.

    ad = sj.Adaptive(PromptLookup(), ks=(0, 1, 2, 4, 8)).calibrate(model, prompts)
    out = sj.generate(model, prompts, drafter=ad)      # out.stats: an AdaptiveStats

A call is prepared and finished by `specjax.decoding` as every decode is (prompt buckets,
constraints, a sharded model, decoding time apart from compiling).

The choice is made at two levels:
- per run: when no k > 0 wins at the calibrated rates, or the loop lost the race, the call
  runs plain AR's own compiled program (`sj.generate` without a drafter). At the batch sizes
  where speculation does not pay, the adaptive mode therefore costs what AR costs, not AR plus
  a loop around it.
- per segment (`specjax.adaptive_loop`): otherwise an outer `lax.while_loop` picks k and
  `lax.switch`es to that variant (`engine.step` with a chain truncated to k, or the empty
  drafter for k = 0, each compiled once), which runs `segment` steps (default 8) in its own
  inner while_loop. The switch carries the whole decode state, which on CPU costs about a small
  model's step, hence segments. The rates are per-depth counts, seeded by the calibration and
  decayed by `decay` per step that drafts the depth (a depth no step drafts keeps its estimate).
  While k = 0 wins nothing is observed, so AR runs until a probe: after `probe_every` AR steps
  one step of the smallest k > 0 refreshes r_1; the gap doubles after each probe (up to 256
  steps) and resets when speculation wins again. A draft model's cache, not fed during k = 0
  steps, catches up in chunks at the next k > 0 step (`DraftModel.chunk`).

Greedy output equals plain AR token for token (every variant is lossless); with sampling, each
variant uses its drafter's exact rule, so the output law is the target's.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax import adaptive_loop, decoding, sharding
from specjax.adaptive_loop import goodput
from specjax.decoding import GenerateOutput, Policy, Prepared, Request
from specjax.drafters.base import Drafter, NoDrafter
from specjax.models import Model
from specjax.stats import Clock, Stats


class Calibration(NamedTuple):
    """What the goodput rule needs at one batch size."""

    costs: np.ndarray  # float32[len(ks)]: seconds per step of each k
    rates: np.ndarray  # float32[max(ks)]: P(depth d accepted | depth d - 1 accepted), d = 1..
    speedup: float = float("nan")  # AR time / the loop's time, raced by `calibrate` (nan: not raced)

    def checked(self, ad: Adaptive) -> Calibration:
        costs, rates = np.asarray(self.costs, np.float32), np.asarray(self.rates, np.float32)
        if costs.shape != (len(ad.ks),) or not np.all(costs > 0):
            raise ValueError(f"costs must be {len(ad.ks)} positive step times (one per k in {ad.ks}), got {costs}")
        if rates.shape != (ad.ks[-1],) or not np.all((rates >= 0) & (rates <= 1)):
            raise ValueError(f"rates must be {ad.ks[-1]} acceptance rates in [0, 1] (one per depth), got {rates}")
        return Calibration(costs, rates, float(self.speedup))

    def predicts_win(self, ad: Adaptive) -> bool:
        """Whether some k > 0 beats AR by the margin at these rates and costs."""
        return int(np.argmax(goodput(self.rates, ad.ks, self.costs, ad.margin))) > 0

    def speculates(self, ad: Adaptive) -> bool:
        """Predicted to win, and not slower than AR where the race was run."""
        return self.predicts_win(ad) and not self.speedup <= 1.0


@dataclasses.dataclass(frozen=True)
class AdaptiveStats(Stats):
    """`Stats` of an adaptive decode; acceptance_per_depth[d-1] is over the steps that drafted depth d
    and accepted d - 1."""

    k_counts: dict[int, int]  # loop steps per k
    costs: tuple[float, ...]  # the calibration's seconds per step of each k
    rates: tuple[float, ...]  # and acceptance rates per depth
    calibrated_speedup: float  # AR time / the loop's, raced by `calibrate` (nan: not raced)
    speculated: bool  # False: plain AR's program ran


@dataclasses.dataclass(frozen=True, eq=False)
class Adaptive(Policy):
    """Goodput-driven choice among chain lengths `ks` of `base` (0 = AR), for `sj.generate`'s
    drafter. `calibration`: costs and rates at the batch size decoded (None: measured per call)."""

    base: Drafter
    ks: tuple[int, ...] = (0, 1, 2, 4)
    decay: float = 0.9
    probe_every: int = 16
    margin: float = 0.1
    segment: int = 8
    calibration: Calibration | None = None

    def __post_init__(self):
        ks = tuple(int(k) for k in self.ks)
        if not ks or ks[0] != 0 or any(b <= a for a, b in zip(ks, ks[1:])):
            raise ValueError(f"ks must start at 0 and increase, got {self.ks}")
        if len(ks) < 2:
            raise ValueError("ks needs at least one speculation length > 0")
        if self.segment < 1 or self.probe_every < 0:
            raise ValueError(f"segment must be >= 1 and probe_every >= 0, got {self.segment}, {self.probe_every}")
        if not 0.0 <= self.decay < 1.0 or self.margin < 0.0:
            raise ValueError(f"decay must lie in [0, 1) and margin be >= 0, got {self.decay}, {self.margin}")
        if not isinstance(self.base, Drafter) or not self.base.supports_chain:
            raise ValueError(f"adaptive speculation needs a chain drafter (DraftModel mode='chain' or "
                             f"PromptLookup or QuantizedSelf), got {getattr(self.base, 'name', type(self.base).__name__)}")
        if self.calibration is not None:
            object.__setattr__(self, "calibration", self.calibration.checked(self))

    @property
    def name(self) -> str:
        return f"adaptive-{self.base.name}"

    @property
    def policy(self) -> adaptive_loop.LoopPolicy:
        """The hashable settings of the loop (a static jit argument; `base` holds arrays)."""
        return adaptive_loop.LoopPolicy(tuple(int(k) for k in self.ks), float(self.decay), int(self.probe_every),
                       float(self.margin), int(self.segment))

    def calibrate(self, model: Model, prompts, *, batch_size: int | None = None, repeats: int = 2,
                  **options) -> Adaptive:
        """This policy with its costs, rates and race with AR measured at one batch size.
        `prompts` are decoded `batch_size` rows at a time (None: all at once), so the costs are
        those of that batch size and the rates those of every prompt; `options` as `sj.generate`
        takes them (max_new_tokens, temperature, top_k, top_p, eos_token_id, constraint).

        Costs and rates: the adaptive loop itself decodes every batch with the choice forced to
        each k in turn. cost = decoding time / loop steps, the least of `repeats` rounds; the
        prefill is in the time, which charges variants with fewer steps (longer k) a little more,
        so the error leans towards AR. rate_d = accepted / drafted at depth d, over all runs.

        Race: if the costs and rates predict a win, the free-running loop and AR's own program
        decode the batches `repeats` times, interleaved, after a warm-up; speedup = AR's least
        time / the loop's. The costs miss what the loop pays to switch between variants and to
        catch a draft model up, which at large batch sizes can eat a predicted win."""
        return dataclasses.replace(self, calibration=self._calibrate(model, prompts, Request(**options),
                                                                     batch_size, repeats))

    def _calibrate(self, model, prompts, request: Request, batch_size, repeats) -> Calibration:
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats}")
        batches = _batches(prompts, batch_size)
        prepared = [decoding.prepare(model, b, self.base.chain(self.ks[-1]), request) for b in batches]
        kmax = self.ks[-1]
        unit_costs, no_rates = np.ones(len(self.ks)), np.zeros(kmax)  # unread: the choice is forced

        def forced(prep, i):
            clock = Clock()
            carry = self._run(model, prep, jax.random.key(0), unit_costs, no_rates, i)
            steps, d, r = jax.device_get((carry.state.target_calls.max(), carry.drafted, carry.reached))
            return clock.read()[0], int(steps), d, r

        forced(prepared[0], 0)  # compile
        best = np.full(len(self.ks), np.inf)
        drafted, reached = np.zeros(kmax), np.zeros(kmax)
        for _ in range(repeats):
            for i in range(len(self.ks)):
                runs = [forced(prep, i) for prep in prepared]
                best[i] = min(best[i], sum(w for w, *_ in runs) / max(sum(n for _, n, *_ in runs), 1))
                drafted = drafted + sum(d for *_, d, _ in runs)
                reached = reached + sum(r for *_, r in runs)
        cal = Calibration(best.astype(np.float32), (reached / np.maximum(drafted, 1)).astype(np.float32))
        if not cal.predicts_win(self):
            return cal
        key = jax.random.key(0)
        racers = (lambda b: decoding.run(model, b, None, request, key),
                  lambda b: self._speculate(model, b, cal, request, key))
        times = [[sum(race(b).stats.wall_time_s for b in batches) for race in racers] for _ in range(repeats + 1)]
        ar, loop = np.min(times[1:], axis=0)
        return cal._replace(speedup=float(ar / loop))

    def generate(self, model: Model, prompts, request: Request, key: jax.Array) -> GenerateOutput:
        """`sj.generate(model, prompts, drafter=self, ...)`: the speculation length chosen by
        goodput, or AR's own program where the calibration says speculation does not pay. Each
        chain length is verified with its drafter's exact rule. Stats: `AdaptiveStats`."""
        if request.verifier is not None:
            raise ValueError("sj.Adaptive verifies each chain length with its drafter's exact rule; "
                             "pass verifier=None")
        cal = self.calibration or self._calibrate(model, prompts, request, None, 2)
        if cal.speculates(self):
            return self._speculate(model, prompts, cal, request, key)
        out = decoding.run(model, prompts, None, request, key)
        k_counts = {k: out.stats.target_calls if k == 0 else 0 for k in self.ks}
        return dataclasses.replace(out, stats=self._stats(out.stats, cal, k_counts, False))

    def _speculate(self, model, prompts, cal: Calibration, request: Request, key) -> GenerateOutput:
        """The device-side loop over the variants, whatever the calibration predicts."""
        prepared = decoding.prepare(model, prompts, self.base.chain(self.ks[-1]), request)
        clock = Clock()
        carry = self._run(model, prepared, key, cal.costs, cal.rates, -1)
        out = decoding.finish(prepared, carry.state, clock)
        k_counts, drafted, reached = jax.device_get((carry.k_counts, carry.drafted, carry.reached))
        # acceptance at depth d among the steps that drafted depth d (AR steps and shorter
        # chains are not counted as rejections, as Stats.count would count them)
        acceptance = tuple(float(r / d) if d else 0.0 for r, d in zip(reached, drafted))
        return dataclasses.replace(out, stats=self._stats(
            out.stats, cal, {int(k): int(n) for k, n in zip(self.ks, k_counts)}, True, acceptance_per_depth=acceptance))

    def _stats(self, stats: Stats, cal: Calibration, k_counts, speculated: bool, **changes) -> AdaptiveStats:
        fields = {f.name: getattr(stats, f.name) for f in dataclasses.fields(Stats)}
        return AdaptiveStats(**{**fields, "method": self.name, **changes}, k_counts=k_counts,
                             costs=tuple(float(c) for c in cal.costs), rates=tuple(float(r) for r in cal.rates),
                             calibrated_speedup=cal.speedup, speculated=speculated)

    def _run(self, model, prepared: Prepared, key, costs, rates, force: int) -> adaptive_loop.Carry:
        """The compiled loop on one prepared batch (force >= 0: every segment runs that variant)."""
        p, widest = prepared.plan, prepared.drafter  # laid out on the model's mesh
        variants = (NoDrafter(), *(widest.chain(k) for k in self.ks[1:]))
        verifiers = tuple(d.default_verifier(p.settings.sampling) for d in variants)
        with sharding.use_mesh(prepared.mesh):
            return adaptive_loop.decode(model, variants, prepared.rows, key, p.constraint,
                                        jnp.asarray(costs, jnp.float32), jnp.asarray(rates, jnp.float32),
                                        jnp.int32(force), ad=self.policy, settings=p.settings,
                                        verifiers=verifiers, cache_len=p.cache_len)


def _batches(prompts, batch_size: int | None) -> list:
    """`prompts` in batches of `batch_size` rows (None: one batch), the last filled from the first rows."""
    rows = list(prompts)
    size = batch_size or len(rows)
    if not rows or size < 1:
        raise ValueError(f"need at least one prompt and batch_size >= 1, got {len(rows)} prompts, {batch_size}")
    return [[rows[j % len(rows)] for j in range(i, i + size)] for i in range(0, len(rows), size)]
