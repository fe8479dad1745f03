"""Self-speculation with the target's own layers (Swift, DEL): the skipped forward is the target's
forward where nothing is skipped and an early exit where the top is, skipped sublayers are not
computed, greedy output equals AR, and sampling keeps the target's law."""

from __future__ import annotations

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax as sj
from specjax.drafters import DEL, Swift
from specjax.models import KVCache, forward, init_params, lm_head
from specjax.models.layer_skip import empty_block, exit_logits, skip_forward
from specjax.sampling import SamplingParams
from tests.conftest import tiny_llama_config
from tests.exactness import V, chi_square_pvalue, exact_joint, sampled_joint

RAGGED = [[5, 17, 33, 9, 60, 5, 17, 33], [40, 3], [8, 8, 50, 14, 22, 8, 8], [11]]
LAYERS = 4


@pytest.fixture(scope="module")
def target():
    cfg = dataclasses.replace(tiny_llama_config(), num_layers=LAYERS)
    return sj.Model.init(cfg, jax.random.key(0))


def _drafted_logits(model, seq, prefix, keep_attn, keep_mlp):
    """Feed seq[:, prefix:] one token at a time through skip_forward after the target's cache of
    seq[:, :prefix]; logits [B, T - prefix, V]."""
    cfg, (b, t) = model.config, seq.shape
    cache = forward(cfg, model.params, seq[:, :prefix], cache=KVCache.init(cfg, b, t)).cache
    cache = cache._replace(lengths=jnp.full((b,), prefix, jnp.int32))
    step = jax.jit(functools.partial(skip_forward, cfg))
    block, out = empty_block(cfg, b, t - prefix), []
    for j in range(t - prefix):
        hidden, block = step(model.params, seq[:, prefix + j: prefix + j + 1], cache, block, j, keep_attn, keep_mlp)
        out.append(lm_head(cfg, model.params, hidden))
    return jnp.concatenate(out, axis=1)


def test_nothing_skipped_is_the_full_forward_and_a_top_cut_is_an_early_exit(target):
    seq = jnp.array([[5, 17, 33, 9, 60, 5, 17], [40, 3, 8, 8, 50, 14, 22]])
    full = forward(target.config, target.params, seq, return_layers=(1,))
    every = jnp.ones((2, LAYERS), bool)
    np.testing.assert_allclose(_drafted_logits(target, seq, 4, every, every), full.logits[:, 4:], atol=1e-5)
    first_two = jnp.broadcast_to(jnp.arange(LAYERS) < 2, (2, LAYERS))  # DEL's exit after 2 layers
    np.testing.assert_allclose(_drafted_logits(target, seq, 4, first_two, first_two),
                               exit_logits(target.config, target.params, full.layer_hidden[0])[:, 4:], atol=1e-5)
    some = every.at[:, 1].set(False)  # a skipped sublayer changes the output
    assert not np.allclose(_drafted_logits(target, seq, 4, some, every), full.logits[:, 4:], atol=1e-3)


def test_skipped_sublayers_are_not_computed(target):
    """Every matmul of the compiled skipped forward (XLA's dots or the CPU kernels' calls, which
    read the stacked weights in place), weights read included, sits inside the branch of a
    per-sublayer conditional, so a skipped sublayer costs a branch, not its work."""
    cfg, b = target.config, 2
    keep = jnp.ones((b, LAYERS), bool)
    run = jax.jit(lambda p, tok, cache, ka, km: skip_forward(cfg, p, tok, cache, empty_block(cfg, b, 4), 0, ka, km)[0])
    hlo = run.lower(target.params, jnp.zeros((b, 1), jnp.int32), KVCache.init(cfg, b, 16), keep, keep).compile().as_text()
    dots = [line for line in hlo.splitlines() if " dot(" in line or 'custom_call_target="specjax_matmul"' in line]
    weight_reads = [line for line in hlo.splitlines() if "dynamic_slice" in line and f"f32[{cfg.hidden_size}," in line]
    assert len(dots) >= 7  # q, k, v, o, gate, up, down: once in the body of the scan over layers
    for line in dots + weight_reads:
        assert re.search(r"/cond/branch_\d+_fun/", line), line
    assert hlo.count(" conditional(") == 2  # attention and MLP, in the scan over layers


@pytest.mark.parametrize("drafter", [Swift(window=4, search_steps=4), DEL(exits=(1, 2, 3), decay=0.5)],
                         ids=["swift", "del"])
def test_greedy_equals_autoregressive(drafter, target):
    want = sj.generate(target, RAGGED, max_new_tokens=24)
    got = sj.generate(target, RAGGED, max_new_tokens=24, drafter=drafter)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    assert got.stats.tau > 1.1, got.stats


def test_bad_settings_fail_clearly(target):
    with pytest.raises(ValueError, match="needs a target of 3 or more layers"):
        sj.generate(sj.Model.init(tiny_llama_config(), jax.random.key(0)), [[1, 2]], drafter=Swift())
    with pytest.raises(ValueError, match="exits must be below the target's 4 layers"):
        sj.generate(target, [[1, 2]], drafter=DEL(exits=(2, 4)))
    with pytest.raises(ValueError, match="exits must be ascending"):
        DEL(exits=(3, 2))


@pytest.fixture(scope="module")
def sharp_target():
    """Tiny vocabulary, peaked distributions, 4 layers: skipping one changes the draft a lot."""
    cfg = dataclasses.replace(tiny_llama_config(V, max_pos=32), num_layers=LAYERS)
    return sj.Model(init_params(cfg, jax.random.key(3), std=0.6), cfg)


@pytest.mark.parametrize("verifier, exact", [(None, True), (sj.verify.Typical(), False)],
                         ids=["speculative-sampling", "typical-negative-control"])
def test_sampling_keeps_the_autoregressive_law(verifier, exact, sharp_target):
    """Swift's sampled chain under its rule (speculative sampling; DEL drafts by the same code)
    keeps the law of the first two tokens; typical acceptance (lossy) on the same drafts
    fails the same test, so the skipped draft differs enough from the target to be seen."""
    params = SamplingParams(temperature=0.9, top_p=0.95)
    counts = sampled_joint(sharp_target, Swift(depth=2, threshold=0.0), verifier, params)
    pvalue = chi_square_pvalue(counts, exact_joint(sharp_target, params))
    assert (pvalue > 1e-4) if exact else (pvalue < 1e-6), pvalue
