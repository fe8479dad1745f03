"""Adaptive speculation length (SmartSpec goodput): greedy output equals AR token for token
whatever lengths the goodput rule picks, and the rule picks what the costs say."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import specjax as sj
from specjax import adaptive
from specjax.drafters import DraftModel, PromptLookup


def _config(vocab, hidden=32, layers=2):
    return sj.ModelConfig(model_type="llama", vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                          num_layers=layers, num_heads=4, num_kv_heads=2, head_dim=hidden // 4,
                          max_position_embeddings=256)


@pytest.fixture(scope="module")
def models():
    return (sj.Model.init(_config(64), jax.random.key(0)), sj.Model.init(_config(64, 16, 1), jax.random.key(1)))


PROMPTS = np.array([[5, 17, 33, 9, 60, 5, 17, 33, 9, 60, 5, 17], [40, 3, 8, 8, 50, 14, 22, 8, 8, 50, 14, 22]],
                   np.int32)


@pytest.mark.parametrize("costs, expect", [
    ([1.0, 1e3, 1e3, 1e3], "ar"),        # speculation never pays: k = 0 (and probes of k = 1)
    ([1e3, 1.0, 1.0, 1.0], "spec"),      # AR is dear: never AR
    ([1.0, 1.2, 1.5, 2.2], "mixed"),     # in between: whatever goodput says, output unchanged
])
def test_greedy_equals_ar(models, costs, expect):
    target, draft = models
    ref = sj.generate(target, PROMPTS, max_new_tokens=24)
    ad = adaptive.Adaptive(DraftModel(draft, mode="chain", k=4), ks=(0, 1, 2, 4), probe_every=4)
    out = adaptive.generate(target, PROMPTS, ad, max_new_tokens=24, costs=costs)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    k = out.stats["k_counts"]
    assert sum(k.values()) == out.stats["target_calls"]  # one choice per loop step
    if expect == "ar":
        assert k[2] == k[4] == 0 and k[0] > 0 and k[1] > 0  # probes refresh alpha every 4 AR steps
        assert k[0] >= 3 * k[1]
    elif expect == "spec":
        assert k[0] == 0


def test_self_draft_picks_longest_and_tau(models):
    """Drafting with the target itself: every draft is accepted, alpha -> 1, so the longest
    chain wins at moderate costs and tau approaches k + 1."""
    target, _ = models
    ad = adaptive.Adaptive(DraftModel(target, mode="chain", k=4), ks=(0, 1, 2, 4))
    out = adaptive.generate(target, PROMPTS, ad, max_new_tokens=60, costs=[1.0, 1.3, 1.6, 2.2])
    np.testing.assert_array_equal(out.tokens, sj.generate(target, PROMPTS, max_new_tokens=60).tokens)
    # the prior alpha = 0.5 picks k = 1 for the first segment (8 steps); then alpha -> 1 and k = 4
    assert out.stats["k_counts"][4] >= 6 and out.stats["tau"] > 3.0


def test_prompt_lookup_and_profile(models):
    target, _ = models
    ad = adaptive.Adaptive(PromptLookup(max_ngram=3, num_tokens=4), ks=(0, 2, 4))
    costs = adaptive.profile_costs(target, PROMPTS, ad, max_new_tokens=24, repeats=1)
    assert costs.shape == (3,) and np.all(costs > 0)
    out = adaptive.generate(target, PROMPTS, ad, max_new_tokens=24, costs=costs)
    np.testing.assert_array_equal(out.tokens, sj.generate(target, PROMPTS, max_new_tokens=24).tokens)


def test_expected_tokens_and_errors(models):
    np.testing.assert_allclose(adaptive.expected_tokens(0.5, np.array([0.0, 1.0, 2.0])), [1.0, 1.5, 1.75])
    target, draft = models
    with pytest.raises(ValueError, match="start at 0"):
        adaptive.Adaptive(PromptLookup(), ks=(1, 2))
    with pytest.raises(ValueError, match="chain drafter"):
        adaptive.Adaptive(DraftModel(draft, mode="iid", k=2, depth=2))
    ad = adaptive.Adaptive(PromptLookup(), ks=(0, 2))
    with pytest.raises(ValueError, match="positive step times"):
        adaptive.generate(target, PROMPTS, ad, max_new_tokens=4, costs=[1.0])


def test_draft_cache_catches_up_after_ar_steps(models):
    """Self-draft starting from alpha = 0: the first 8 steps are AR (the draft's cache falls
    8 tokens behind), then a probe and speculation. The draft can only agree with the target
    on every token if CatchUpDraftModel fed the skipped tokens correctly."""
    target, _ = models
    ad = adaptive.Adaptive(DraftModel(target, mode="chain", k=4), ks=(0, 1, 2, 4), probe_every=8,
                           prior_alpha=0.0)
    out = adaptive.generate(target, PROMPTS, ad, max_new_tokens=60, costs=[1.0, 1.3, 1.6, 2.2])
    np.testing.assert_array_equal(out.tokens, sj.generate(target, PROMPTS, max_new_tokens=60).tokens)
    k = out.stats["k_counts"]
    assert k[0] >= 8 and k[4] > 0
    assert out.stats["acceptance_per_depth"] == [1.0] * 4  # AR steps are not rejections
