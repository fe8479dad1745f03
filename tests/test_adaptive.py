"""Adaptive speculation length (SmartSpec goodput): greedy output equals AR token for token
whatever lengths the goodput rule picks, and the rule picks what the costs say."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

import specjax as sj
from specjax import adaptive, adaptive_loop, decoding, engine
from specjax.constraints import Unconstrained
from specjax.drafters import DraftModel, PromptLookup
from specjax.drafters.draft_model import DraftModelState
from specjax.models import KVCache


def _config(vocab, hidden=32, layers=2):
    return sj.ModelConfig(model_type="llama", vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                          num_layers=layers, num_heads=4, num_kv_heads=2, head_dim=hidden // 4,
                          max_position_embeddings=256)


@pytest.fixture(scope="module")
def models():
    return (sj.Model.init(_config(64), jax.random.key(0)), sj.Model.init(_config(64, 16, 1), jax.random.key(1)))


PROMPTS = np.array([[5, 17, 33, 9, 60, 5, 17, 33, 9, 60, 5, 17], [40, 3, 8, 8, 50, 14, 22, 8, 8, 50, 14, 22]],
                   np.int32)


def _cal(costs, rate):
    return adaptive.Calibration(np.asarray(costs, np.float32), np.full(4, rate, np.float32))


@pytest.mark.parametrize("costs, rate, expect", [
    ([1.0, 1e3, 1e3, 1e3], 0.5, "ar"),       # speculation cannot pay: AR's own program runs
    ([1e3, 1.0, 1.0, 1.0], 0.5, "spec"),     # AR is dear: never AR
    ([1.0, 1.5, 1.9, 2.8], 0.9, "probes"),   # calibrated rates win, the random draft's lose: AR + probes
])
def test_greedy_equals_ar(models, costs, rate, expect):
    target, draft = models
    ref = sj.generate(target, PROMPTS, max_new_tokens=40)
    ad = sj.Adaptive(DraftModel(draft, mode="chain", k=4), ks=(0, 1, 2, 4), probe_every=4,
                     calibration=_cal(costs, rate))
    out = sj.generate(target, PROMPTS, max_new_tokens=40, drafter=ad)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    k = out.stats.k_counts
    assert sum(k.values()) == out.stats.target_calls  # one choice per loop step
    assert out.stats.speculated == (expect != "ar")
    if expect == "ar":
        assert k[0] == out.stats.target_calls and out.stats.tau == 1.0
    elif expect == "spec":
        assert k[0] == 0
    else:  # the first segment speculates at k = 4, then AR with probes of k = 1 every 4, 8, ... steps
        assert k[4] == 8 and k[2] == 0 and k[0] > 0 and k[1] > 0
        assert k[0] >= 3 * k[1]


def test_self_draft_picks_longest_and_tau(models):
    """Drafting with the target itself: every draft is accepted, so the observed rates climb
    to 1 depth by depth and the loop lengthens the chain as they do."""
    target, _ = models
    ad = sj.Adaptive(DraftModel(target, mode="chain", k=4), ks=(0, 1, 2, 4),
                     calibration=_cal([1.0, 1.3, 1.6, 1.9], 0.5))
    out = sj.generate(target, PROMPTS, max_new_tokens=60, drafter=ad)
    np.testing.assert_array_equal(out.tokens, sj.generate(target, PROMPTS, max_new_tokens=60).tokens)
    # the calibrated rates 0.5 pick k = 1 for the first segment (8 steps); then r_1 -> 1 picks k = 2,
    # then r_2 -> 1 picks k = 4 (E = 3.75 at r_3 = r_4 = 0.5) for the last 20 tokens
    assert out.stats.k_counts == {0: 0, 1: 8, 2: 8, 4: 4}
    assert out.stats.acceptance_per_depth == (1.0,) * 4


def test_prompt_lookup_and_calibrate(models):
    target, _ = models
    ad = sj.Adaptive(PromptLookup(max_ngram=3, num_tokens=4), ks=(0, 2, 4))
    cal = ad.calibrate(target, PROMPTS, batch_size=1, max_new_tokens=24, repeats=1).calibration
    assert cal.costs.shape == (3,) and np.all(cal.costs > 0)
    assert cal.rates.shape == (4,) and np.all((cal.rates >= 0) & (cal.rates <= 1)) and cal.rates[0] > 0
    assert np.isnan(cal.speedup) != cal.predicts_win(ad)  # raced exactly when a win was predicted
    assert np.isnan(cal.speedup) or cal.speedup > 0
    forced = cal._replace(costs=np.array([1.0, 1.1, 1.2], np.float32), speedup=float("nan"))  # no lost race
    for c in (cal, forced):  # as measured (timing-dependent: speculates or not); forced to speculate
        out = sj.generate(target, PROMPTS, max_new_tokens=24, drafter=dataclasses.replace(ad, calibration=c))
        np.testing.assert_array_equal(out.tokens, sj.generate(target, PROMPTS, max_new_tokens=24).tokens)
    # forced: the calibrated rates pick k = 4 for the first segment; its lookups miss (the output
    # repeats only later), r_1 -> 0 and AR runs the rest
    assert out.stats.speculated and out.stats.k_counts[4] == 8


def test_goodput_rule_and_errors(models):
    np.testing.assert_allclose(adaptive_loop.expected_tokens([0.5, 0.5], (0, 1, 2)), [1.0, 1.5, 1.75])
    np.testing.assert_allclose(adaptive_loop.expected_tokens([1.0, 0.5, 0.0], (0, 1, 2, 3)), [1.0, 2.0, 2.5, 2.5])
    np.testing.assert_allclose(adaptive_loop.goodput([0.5], (0, 1), [1.0, 1.25], 0.1), [1.1, 1.2])
    target, draft = models
    ad = sj.Adaptive(PromptLookup(), ks=(0, 1))
    # k = 1 makes 1.5 tokens per step: at cost 1.36 it beats AR by 10.3%, at 1.37 by only 9.5%
    assert adaptive.Calibration(np.array([1.0, 1.36]), np.array([0.5])).speculates(ad)
    assert not adaptive.Calibration(np.array([1.0, 1.37]), np.array([0.5])).speculates(ad)
    assert not adaptive.Calibration(np.array([1.0, 1.0]), np.array([0.5]), speedup=0.98).speculates(ad)  # lost the race
    assert adaptive.Calibration(np.array([1.0, 1.0]), np.array([0.5]), speedup=1.02).speculates(ad)
    assert [len(b) for b in adaptive._batches([[1], [2], [3]], 2)] == [2, 2]  # the last filled from the first
    with pytest.raises(ValueError, match="start at 0"):
        sj.Adaptive(PromptLookup(), ks=(1, 2))
    with pytest.raises(ValueError, match="chain drafter"):
        sj.Adaptive(DraftModel(draft, mode="iid", k=2, depth=2))
    with pytest.raises(ValueError, match="positive step times"):
        dataclasses.replace(ad, calibration=adaptive.Calibration([1.0], [0.5]))
    with pytest.raises(ValueError, match="acceptance rates"):
        dataclasses.replace(ad, calibration=adaptive.Calibration([1.0, 1.0], [1.5]))
    calibrated = dataclasses.replace(ad, calibration=adaptive.Calibration([1.0, 1.0], [0.5]))
    with pytest.raises(ValueError, match="pass verifier=None"):
        sj.generate(target, PROMPTS, max_new_tokens=4, drafter=calibrated, verifier=sj.verify.Greedy())


def test_draft_cache_catches_up_from_behind(models):
    """Self-draft whose cache starts empty, the whole prompt behind (as after AR steps, whose
    tokens the draft never sees): every draft can only match the target's greedy token, and
    be accepted, if DraftModel fed the missing tokens correctly, chunk by chunk."""
    target, _ = models
    drafter = DraftModel(target, mode="chain", k=4, chunk=4)
    padded, lengths = decoding.pad_prompts(PROMPTS, target.config.vocab_size)
    plan = decoding.plan(target.config, target, padded.shape[1], drafter, decoding.Request(24))

    @jax.jit
    def run(prompts, lengths):
        state = engine.prefill(target, drafter, prompts, lengths, jax.random.key(0), settings=plan.settings,
                               cache_len=plan.cache_len, constraint=Unconstrained())
        empty = KVCache.init(target.config, len(prompts), plan.cache_len)
        state = state._replace(drafter_state=DraftModelState(empty))
        for _ in range(3):
            state, _ = engine.step(target, drafter, state, settings=plan.settings, verifier=plan.verifier)
        return state.accepted_hist

    hist = np.asarray(run(padded, lengths))
    np.testing.assert_array_equal(hist[:, 4], 3)  # 3 steps, each accepting all 4 drafts
