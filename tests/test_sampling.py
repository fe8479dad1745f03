"""Sampling: processed distributions against a numpy reference, validation, the draw helpers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from specjax.sampling import SamplingParams, gumbel, probs, sample


def reference_probs(logits, temperature, top_k, top_p):
    """The textbook pipeline on one row: temperature, top-k, then the smallest prefix of the
    sorted distribution whose mass reaches top_p; float64."""
    x = np.asarray(logits, np.float64)
    if temperature == 0:
        return np.eye(len(x))[np.argmax(x)]
    x = x / temperature
    if top_k is not None and top_k < len(x):
        x = np.where(x < np.sort(x)[::-1][top_k - 1], -np.inf, x)
    p = np.exp(x - x.max())
    p /= p.sum()
    if top_p is not None:
        order = np.argsort(-p)
        keep = np.searchsorted(np.cumsum(p[order]), top_p) + 1  # first index reaching top_p
        mask = np.zeros_like(p, bool)
        mask[order[:keep]] = True
        p = np.where(mask, p, 0.0)
        p /= p.sum()
    return p


@pytest.mark.parametrize("temperature,top_k,top_p", [
    (1.0, None, None), (0.7, 5, None), (1.3, None, 0.8), (0.9, 10, 0.6), (1.0, 1, None),
    (1.0, None, 1e-6), (2.0, 50, 1.0), (0.5, 3, 0.99), (0.0, 4, 0.5),
])
def test_probs_match_reference(temperature, top_k, top_p):
    logits = np.random.default_rng(0).normal(size=(3, 4, 20)).astype(np.float32) * 2
    params = SamplingParams(temperature, top_k, top_p)
    got = np.asarray(jax.jit(probs, static_argnums=1)(logits, params))
    assert got.shape == logits.shape and got.dtype == np.float32
    want = np.apply_along_axis(reference_probs, -1, logits, temperature, top_k, top_p)
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_greedy_is_one_hot_with_ties_to_lowest_index():
    p = probs(jnp.array([[1.0, 3.0, 3.0, -1.0]]), SamplingParams(0.0))
    np.testing.assert_array_equal(p, [[0.0, 1.0, 0.0, 0.0]])
    assert SamplingParams(0.0).greedy and not SamplingParams(0.5).greedy


@pytest.mark.parametrize("kwargs,match", [
    ({"temperature": -0.1}, "temperature"), ({"temperature": "hot"}, "temperature"),
    ({"top_k": 0}, "top_k"), ({"top_k": 2.5}, "top_k"),
    ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"temperature": float("nan")}, "finite"), ({"temperature": float("inf")}, "finite"),
    ({"top_p": float("nan")}, "top_p"), ({"top_k": float("inf")}, "top_k"), ({"top_k": True}, "top_k"),
])
def test_invalid_params(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_sample_distribution_and_unnormalised_rows():
    p = np.array([0.1, 0.0, 0.25, 0.65])
    rows = jnp.tile(jnp.asarray(p * 3.0, jnp.float32), (100_000, 1))  # unnormalised on purpose
    draws = np.asarray(jax.jit(sample)(jax.random.key(0, impl="rbg"), rows))
    assert draws.dtype == np.int32
    counts = np.bincount(draws, minlength=4)
    assert counts[1] == 0
    keep = p > 0
    assert stats.chisquare(counts[keep], p[keep] * len(draws)).pvalue > 1e-4


def test_gumbel():
    g = np.asarray(gumbel(jax.random.PRNGKey(0), (200_000,)))
    assert g.dtype == np.float32
    assert abs(g.mean() - np.euler_gamma) < 0.01 and abs(g.var() - np.pi ** 2 / 6) < 0.03
