"""The shipped tiny model quantized: int8 keeps greedy output, int4 keeps logits close, and
speculative decoding stays exact with respect to the quantized target."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from tokenizers import Tokenizer

import specjax as sj
from specjax.convert import resolve
from specjax.data.prompts import heldout_prompts

# int4, group 32, on held-out code (measured: mean 0.024, p99 0.097, argmax agreement 0.96):
INT4_MEAN_ERR, INT4_P99_ERR, INT4_ARGMAX_AGREEMENT = 0.05, 0.15, 0.9  # errors in logit std units


@pytest.fixture(scope="module")
def tiny():
    return sj.load("tiny")


@pytest.fixture(scope="module")
def prompts():
    tok = Tokenizer.from_file(str(resolve("tiny") / "tokenizer.json"))
    return np.array([tok.encode(p).ids[-48:] for p in heldout_prompts(8)], np.int32)


def test_int8_greedy_agrees_with_float(tiny, prompts):
    """Teacher-forced on the float model's greedy continuation, the int8 model picks the same
    next token at >= 98% of the generated positions."""
    q8 = sj.quantize(tiny, "int8", group_size=32)
    cont = sj.generate(tiny, prompts, max_new_tokens=32).tokens
    seq = jnp.asarray(np.concatenate([prompts, cont], axis=1))
    n = prompts.shape[1]
    picks = jnp.argmax(sj.forward(q8, seq)[:, n - 1: -1], axis=-1)
    agreement = float(jnp.mean(picks == jnp.asarray(cont)))
    assert agreement >= 0.98, agreement


def test_int4_logits_stay_within_the_stated_error(tiny, prompts):
    q4 = sj.quantize(tiny, "int4", group_size=32)
    ref = sj.forward(tiny, jnp.asarray(prompts))
    got = sj.forward(q4, jnp.asarray(prompts))
    err = jnp.abs(got - ref) / ref.std()
    assert float(err.mean()) < INT4_MEAN_ERR
    assert float(jnp.percentile(err, 99)) < INT4_P99_ERR
    assert float(jnp.mean(jnp.argmax(got, -1) == jnp.argmax(ref, -1))) > INT4_ARGMAX_AGREEMENT


def test_speculative_decoding_is_exact_for_the_quantized_target(tiny, prompts):
    q4 = sj.quantize(tiny, "int4", group_size=32)
    want = sj.generate(q4, prompts[:4], max_new_tokens=24)
    for drafter in (sj.drafters.PromptLookup(max_ngram=3, num_tokens=6),
                    sj.drafters.DraftModel(sj.load("tiny-draft"), mode="chain", k=3)):
        got = sj.generate(q4, prompts[:4], max_new_tokens=24, drafter=drafter)
        np.testing.assert_array_equal(got.tokens, want.tokens)
