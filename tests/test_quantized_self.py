"""The quantized self-draft (`QuantizedSelf`): the target's int8 / int4 copy drafts on the
target's own KV cache; greedy output equals AR, sampling keeps the target's law, bad use fails
clearly."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

import specjax as sj
from specjax import methods
from specjax.drafters import QuantizedSelf
from specjax.models import init_params
from specjax.sampling import SamplingParams
from tests.conftest import tiny_llama_config
from tests.exactness import V, chi_square_pvalue, exact_joint, sampled_joint

RAGGED = [[5, 17, 33, 9, 60, 5, 17, 33], [40, 3], [8, 8, 50, 14, 22, 8, 8], [11]]


def _config(vocab: int = 64, max_pos: int = 256) -> sj.ModelConfig:
    """The tiny test Llama, widened so that int4 groups (64 input rows) tile every matmul."""
    return dataclasses.replace(tiny_llama_config(vocab, max_pos), hidden_size=64, intermediate_size=128,
                               head_dim=16, num_layers=3)


@pytest.fixture(scope="module")
def target():
    return sj.Model.init(_config(), jax.random.key(0))


@pytest.mark.parametrize("mode, min_tau", [("int8", 3.0), ("int4", 1.5)])
def test_greedy_equals_autoregressive(mode, min_tau, target):
    want = sj.generate(target, RAGGED, max_new_tokens=24)
    got = sj.generate(target, RAGGED, max_new_tokens=24, drafter=QuantizedSelf.of(target, mode, depth=4,
                                                                                 threshold=0.0))
    np.testing.assert_array_equal(got.tokens, want.tokens)
    assert got.stats.tau > min_tau, got.stats  # the copy agrees with its target on most tokens


def test_adaptive_lengths_keep_greedy_output(target):
    """Its chain form: `sj.Adaptive` choosing the length by goodput decodes AR's tokens."""
    want = sj.generate(target, RAGGED, max_new_tokens=24)
    got = sj.generate(target, RAGGED, max_new_tokens=24, drafter=sj.Adaptive(QuantizedSelf.of(target), ks=(0, 2, 4)))
    np.testing.assert_array_equal(got.tokens, want.tokens)


def test_bad_use_fails_clearly(target):
    with pytest.raises(ValueError, match="^quantized-self needs a target with float weights to quantize, and "
                                         "this one is already quantized"):
        methods.make("quantized-self", sj.quantize(target, "int8"))  # as --drafter reports it
    with pytest.raises(ValueError, match="quantizes an sj.Model's weights; got dict"):
        QuantizedSelf.of(target.params)
    with pytest.raises(ValueError, match="mode must be one of"):
        QuantizedSelf.of(target, "int3")
    with pytest.raises(ValueError, match="threshold must be in"):
        QuantizedSelf.of(target, threshold=1.5)
    other = sj.Model.init(dataclasses.replace(target.config, num_layers=2), jax.random.key(1))
    with pytest.raises(ValueError, match="built from another model"):
        sj.generate(target, [[1, 2]], drafter=QuantizedSelf.of(other))


@pytest.fixture(scope="module")
def sharp_target():
    """Tiny vocabulary, peaked distributions: int4 rounding moves the draft's law visibly."""
    cfg = _config(V, max_pos=32)
    return sj.Model(init_params(cfg, jax.random.key(3), std=0.6), cfg)


@pytest.mark.parametrize("verifier, exact", [(None, True), (sj.verify.Typical(), False)],
                         ids=["speculative-sampling", "typical-negative-control"])
def test_sampling_keeps_the_autoregressive_law(verifier, exact, sharp_target):
    """The int4 copy's sampled chain under its rule (speculative sampling) keeps the law of the
    first two tokens; typical acceptance (lossy) on the same drafts fails the same test."""
    params = SamplingParams(temperature=0.9, top_p=0.95)
    drafter = QuantizedSelf.of(sharp_target, "int4", depth=2, threshold=0.0)
    counts = sampled_joint(sharp_target, drafter, verifier, params)
    pvalue = chi_square_pvalue(counts, exact_joint(sharp_target, params))
    assert (pvalue > 1e-4) if exact else (pvalue < 1e-6), pvalue
