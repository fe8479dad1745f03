"""Speculative Jacobi Decoding: greedy output equal to AR on the shipped model (ragged batch),
the sampled law kept by its exact rule, and a lossy rule on the same guesses caught by the
same test (the negative control)."""

from __future__ import annotations

import numpy as np
import pytest

import specjax as sj
from specjax.drafters import SpeculativeJacobi
from specjax.sampling import SamplingParams
from tests.exactness import chi_square_pvalue, exact_joint, sampled_joint, sharp_model


def test_greedy_equals_autoregressive_on_the_shipped_model():
    tiny = sj.load("tiny")
    prompts = [[5, 17, 33, 9, 60, 5, 17, 33, 9, 60, 5], [40, 3], [8, 8, 50, 14, 22, 8, 8], [11]]
    want = sj.generate(tiny, prompts, max_new_tokens=40)
    got = sj.generate(tiny, prompts, max_new_tokens=40, drafter=SpeculativeJacobi(window=3))
    np.testing.assert_array_equal(got.tokens, want.tokens)
    assert got.stats.tau > 1.0, got.stats  # some guesses of the previous iteration held


@pytest.fixture(scope="module")
def sharp_target():
    return sharp_model(3)


@pytest.mark.parametrize("verifier, lossless", [(None, True), (sj.verify.Typical(), False)])
def test_sampled_law(verifier, lossless, sharp_target):
    """The default rule (speculative sampling with each guess's law as q) keeps the law of the
    first two tokens; Typical acceptance (lossy) on the same guesses must fail the test."""
    params = SamplingParams(temperature=0.9, top_p=0.95)
    counts = sampled_joint(sharp_target, SpeculativeJacobi(window=2), verifier, params)
    pvalue = chi_square_pvalue(counts, exact_joint(sharp_target, params))
    assert pvalue > 1e-4 if lossless else pvalue < 1e-6, pvalue


def test_bad_window_fails_clearly():
    with pytest.raises(ValueError, match="window must be an integer >= 1"):
        SpeculativeJacobi(window=0)
