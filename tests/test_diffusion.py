"""Masked-diffusion decoding: each selection rule against a slow reference, the sampler against a
slow LLaDA loop, the block caches against the full forward, FreeDave against static decoding."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

import specjax as sj
from specjax import diffusion as dd
from specjax.diffusion.learn2pd import false_positive_rate, load_filter, oracle_traces, save_filter, train_filter
from specjax.diffusion.rules import Context, Prediction
from specjax.diffusion.sampler import window_cache, window_logits
from tests.conftest import tiny_llama_config

MASK = 63


@pytest.fixture(scope="module")
def model():
    return sj.Model.init(dataclasses.replace(tiny_llama_config(), mask_token_id=MASK), jax.random.PRNGKey(3))


def _prompts(seed=0, rows=3):
    rng = np.random.default_rng(seed)
    return [list(rng.integers(0, MASK, rng.integers(1, 6))) for _ in range(rows)]


def _canvas(gen_length=8, seed=0, rows=3):
    return dd.make_canvas(_prompts(seed, rows), gen_length, MASK)


# ---- the rules, on random confidences --------------------------------------------------------------

def _random_step(seed, b=256, t=12):
    rng = np.random.default_rng(seed)
    conf = rng.choice([0.3, 0.5, 0.75, 0.8, 0.9, 0.95, 0.99], size=(b, t)) * rng.uniform(0.97, 1.0, (b, t))
    conf[rng.random((b, t)) < 0.1] = 0.9  # exact ties and values on the thresholds
    eligible = rng.random((b, t)) < 0.6
    entropy = rng.uniform(0, 2, (b, t))
    pred = Prediction(jnp.asarray(rng.integers(0, 9, (b, t)), jnp.int32), jnp.asarray(conf, jnp.float32),
                      jnp.asarray(entropy, jnp.float32))
    return pred, Context(jnp.asarray(eligible), jnp.zeros(b, jnp.int32), jnp.array(True)), conf.astype(np.float32), eligible, entropy.astype(np.float32)


def _slow(conf, eligible, accept_extra, score=None):
    """The most confident eligible position (lowest index on ties) plus where accept_extra."""
    score = conf if score is None else score
    out = np.zeros_like(eligible)
    for r in range(len(conf)):
        idx = [i for i in range(conf.shape[1]) if eligible[r, i]]
        if idx:
            best = max(idx, key=lambda i: (score[r, i], -i))
            out[r, best] = True
            for i in idx:
                out[r, i] |= accept_extra(r, i)
    return out


def test_topk_threshold_entropy_and_localleap_match_slow_references():
    pred, ctx, conf, eligible, entropy = _random_step(0)
    for k in (1, 2, 5):
        got = np.asarray(dd.TopK(k).select(pred, ctx, ()))
        for r in range(len(conf)):
            idx = sorted((i for i in range(conf.shape[1]) if eligible[r, i]), key=lambda i: (-conf[r, i], i))
            assert set(np.flatnonzero(got[r])) == set(idx[:k])
    got = np.asarray(dd.Threshold(0.9).select(pred, ctx, ()))
    np.testing.assert_array_equal(got, _slow(conf, eligible, lambda r, i: conf[r, i] >= np.float32(0.9)))
    got = np.asarray(dd.Entropy(0.5).select(pred, ctx, ()))
    np.testing.assert_array_equal(got, _slow(conf, eligible, lambda r, i: entropy[r, i] < 0.5, score=-entropy))
    rule = dd.LocalLeap(0.9, 0.75, 2)

    def relaxed(r, i):
        anchors = [a for a in range(conf.shape[1]) if eligible[r, a] and conf[r, a] >= np.float32(0.9)]
        tau = 0.75 if any(abs(a - i) <= 2 for a in anchors) else 0.9
        return conf[r, i] >= np.float32(tau)
    np.testing.assert_array_equal(np.asarray(rule.select(pred, ctx, ())), _slow(conf, eligible, relaxed))
    assert np.asarray(rule.select(pred, ctx, ())).sum() > np.asarray(dd.Threshold(0.9).select(pred, ctx, ())).sum()


def test_random_k_draws_k_eligible_positions_uniformly_whatever_the_confidences():
    """One row with 6 eligible of 12 positions (confidences all different), 3000 keys: RandomK(2)
    takes exactly 2 eligible positions, each eligible one 1/3 of the time (chi-square, 5 degrees
    of freedom, p > 1e-4); TopK(2) on the same keys (the negative control) always takes the same
    two, which the statistic rejects."""
    rng = np.random.default_rng(5)
    eligible = np.zeros((1, 12), bool)
    eligible[0, rng.choice(12, 6, replace=False)] = True
    pred = Prediction(jnp.zeros((1, 12), jnp.int32), jnp.asarray(rng.permutation(12)[None] / 12, jnp.float32),
                      jnp.zeros((1, 12), jnp.float32))
    pick = jax.jit(jax.vmap(lambda rule, key: rule.select(pred, Context(jnp.asarray(eligible), jnp.zeros(1, jnp.int32),
                                                                      jnp.array(True), key), ())[0],
                            in_axes=(None, 0)), static_argnums=0)
    keys = jax.random.split(jax.random.key(0), 3000)

    def pvalue(chosen):
        assert (chosen.sum(-1) == 2).all() and not chosen[:, ~eligible[0]].any()
        counts = chosen[:, eligible[0]].sum(0)
        return scipy.stats.chisquare(counts, np.full(6, counts.sum() / 6)).pvalue

    assert pvalue(np.asarray(pick(dd.RandomK(2), keys))) > 1e-4
    assert pvalue(np.asarray(pick(dd.TopK(2), keys))) < 1e-10
    with pytest.raises(ValueError, match="needs a key"):
        dd.RandomK(2).select(pred, Context(jnp.asarray(eligible), jnp.zeros(1, jnp.int32), jnp.array(True)), ())


def test_factor_rule_matches_the_reference_loop_but_its_last_index_quirk():
    pred, ctx, conf, eligible, _ = _random_step(1)
    got = np.asarray(dd.Factor(1.0).select(pred, ctx, ()))
    quirks = 0
    for r in range(len(conf)):
        idx = sorted((i for i in range(conf.shape[1]) if eligible[r, i]), key=lambda i: (-conf[r, i], i))
        n = 0  # Fast-dLLM's get_transfer_index_dynamic, without the quirk
        for m, i in enumerate(idx, start=1):
            if m > 1 and conf[r, i] < 1 - 1.0 / (m + 1):
                break
            n = m
        quirks += n == len(idx) - 1 and len(idx) > 1  # the reference would also take the failing last one
        assert set(np.flatnonzero(got[r])) == set(idx[:n])
    assert quirks > 0  # the case the docstring names does occur here, and is left out on purpose


def test_credit_fuses_decayed_top1_credits_like_a_slow_loop():
    rng = np.random.default_rng(2)
    b, t, v = 2, 5, 7
    rule = dd.Credit(tau=0.9, alpha=0.7, gamma=0.2, beta=0.8)
    state = rule.init(b, t, v)
    slow = np.zeros((b, t, v))
    for first in (True, False, False):
        logits = rng.normal(size=(b, t, v)).astype(np.float32)
        eligible = rng.random((b, t)) < 0.7
        ctx = Context(jnp.asarray(eligible), jnp.zeros(b, jnp.int32), jnp.array(first))
        fused, state = rule.fuse(jnp.asarray(logits), state, ctx)
        slow = 0 * slow if first else 0.8 * slow
        p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
        for r in range(b):
            for i in range(t):
                if eligible[r, i]:
                    slow[r, i, p[r, i].argmax()] += p[r, i].max() ** 0.2
        np.testing.assert_allclose(np.asarray(fused), logits + 0.7 * np.log1p(slow), rtol=1e-5, atol=1e-6)


def test_learn2pd_filter_learns_a_separable_rule_and_round_trips(tmp_path):
    rng = np.random.default_rng(4)
    features = rng.uniform(0, 1, (4000, 8)).astype(np.float32)
    labels = features > 0.7
    params = train_filter(features, labels, steps=600)
    assert false_positive_rate(params, features, labels, accept=0.9) < 0.02
    assert false_positive_rate(params, features, ~labels, accept=0.9) > 0.9  # negative control
    save_filter(params, tmp_path / "f.npz")
    restored = load_filter(tmp_path / "f.npz")
    assert all(np.array_equal(a, c) for layer, back in zip(params, restored) for a, c in zip(layer, back))


# ---- the sampler -----------------------------------------------------------------------------------

def _slow_static(model, prompt, gen_length, block, k, eos=None):
    """LLaDA's low-confidence remasking for one prompt: a full forward per step, k per step;
    with `eos`, every MASK after a committed EOS becomes EOS."""
    tokens = list(prompt) + [MASK] * gen_length
    nfe = 0
    for start in range(len(prompt), len(tokens), block):
        while MASK in tokens[start:start + block]:
            logits = np.asarray(sj.forward(model, jnp.asarray([tokens]))[0], np.float64)
            logits[:, MASK] = -np.inf
            p = np.exp(logits - logits.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            open_ = [i for i in range(start, min(start + block, len(tokens))) if tokens[i] == MASK]
            for i in sorted(open_, key=lambda i: (-p[i].max(), i))[:k]:
                tokens[i] = int(p[i].argmax())
            if eos in tokens[len(prompt):]:
                first = tokens.index(eos, len(prompt))
                tokens[first:] = [eos if x == MASK else x for x in tokens[first:]]
            nfe += 1
    return tokens[len(prompt):], nfe


@pytest.mark.parametrize("k", [1, 3])
def test_static_decoding_equals_a_slow_llada_loop_per_row(model, k):
    rng = np.random.default_rng(5)
    prompts = [list(rng.integers(0, MASK, n)) for n in (1, 4, 6)]
    out = dd.generate(model, dd.make_canvas(prompts, 8, MASK), gen_length=8, blocks=4, rule=dd.TopK(k))
    for row, prompt in enumerate(prompts):
        tokens, nfe = _slow_static(model, prompt, 8, 4, k)
        assert list(np.asarray(out.tokens[row])) == tokens
        assert int(out.nfe[row]) == nfe
    assert int(out.forwards) == max(int(n) for n in out.nfe)


@pytest.mark.parametrize("shift", [False, True])
def test_a_window_forward_over_an_unchanged_canvas_equals_the_full_forward(model, shift):
    model = sj.Model(model.params, dataclasses.replace(model.config, shift_logits=shift))
    canvas = _canvas(gen_length=8, rows=3)
    t = canvas.tokens.shape[1]
    tokens = canvas.tokens.at[:, -8:-5].set(jnp.array([4, 5, 6]))  # a committed block
    out = sj.models.forward(model.config, model.params, tokens, tree_mask=dd.key_mask(canvas.valid, t))
    full = np.asarray(out.logits)
    full = np.concatenate([full[:, :1], full[:, :-1]], 1) if shift else full
    for width, start in ((4, t - 5), (8, t - 8)):  # a dual-cache block; the prefix cache's tail
        start = jnp.full((3,), start, jnp.int32)
        kv = window_cache(out.new_kv, canvas.valid, start, width, int(shift))
        pad = ((0, 0), (0, width + 1))
        got = window_logits(model, jnp.pad(tokens, pad, constant_values=MASK), jnp.pad(canvas.valid, pad),
                            start, kv, width)
        inside = min(width, t - int(start[0]))
        np.testing.assert_allclose(np.asarray(got)[:, :inside], full[:, int(start[0]):int(start[0]) + inside],
                                   atol=2e-5)


def test_threshold_rules_span_static_decoding_to_one_forward_per_block(model):
    canvas = _canvas()
    static = dd.generate(model, canvas, gen_length=8, blocks=4, rule=dd.TopK(1))
    never = dd.generate(model, canvas, gen_length=8, blocks=4, rule=dd.Threshold(1.01))
    np.testing.assert_array_equal(never.tokens, static.tokens)
    for cache in dd.CACHES:
        always = dd.generate(model, canvas, gen_length=8, blocks=4, rule=dd.Threshold(0.0), cache=cache)
        np.testing.assert_array_equal(always.nfe, [2, 2, 2])


def test_caches_and_adaptive_blocks_fill_every_slot(model):
    canvas = _canvas(gen_length=12)
    adaptive = dd.AdaBlock(init_length=4, delimiters=(7, 9), threshold=0.0)
    for cache, blocks in ((None, adaptive), ("prefix", 4), ("dual", adaptive)):
        out = dd.generate(model, canvas, gen_length=12, blocks=blocks, rule=dd.Credit(0.5), cache=cache)
        assert not np.any(np.asarray(out.tokens) == MASK)
        assert np.all((out.nfe >= 1) & (out.nfe <= 12))


def test_fill_after_eos_ends_each_row_at_its_first_eos(model):
    canvas = _canvas(gen_length=8, rows=4)
    eos = int(np.bincount(np.asarray(dd.generate(model, canvas, gen_length=8, blocks=4,
                                                  rule=dd.TopK(1)).tokens).ravel()).argmax())
    out = dd.generate(model, canvas, gen_length=8, blocks=4, rule=dd.TopK(1), fill_after_eos=eos)
    ended = 0
    for row, prompt in enumerate(_prompts(rows=4)):
        tokens, nfe = _slow_static(model, prompt, 8, 4, 1, eos=eos)
        assert list(np.asarray(out.tokens[row])) == tokens and int(out.nfe[row]) == nfe
        ended += nfe < 8
    assert ended  # the fill saved forwards somewhere


def test_sampling_follows_its_key(model):
    canvas = _canvas()
    run = lambda seed: np.asarray(dd.generate(model, canvas, gen_length=8, blocks=8, rule=dd.TopK(2),
                                              temperature=1.0, key=jax.random.PRNGKey(seed)).tokens)
    np.testing.assert_array_equal(run(0), run(0))
    assert any(not np.array_equal(run(0), run(s)) for s in (1, 2, 3))


@pytest.mark.parametrize("drafts", [1, 4])
def test_freedave_is_static_decoding_in_fewer_forwards(model, drafts):
    canvas = _canvas(gen_length=12, rows=6, seed=7)
    static = dd.generate(model, canvas, gen_length=12, blocks=4, rule=dd.TopK(1))
    fast = dd.freedave(model, canvas, gen_length=12, block_length=4, drafts=drafts)
    np.testing.assert_array_equal(fast.tokens, static.tokens)
    assert np.all(fast.nfe <= static.nfe + 1)  # + the first forward, which only predicts
    if drafts == 1:
        np.testing.assert_array_equal(fast.nfe, static.nfe + 1)


def test_the_oracle_reaches_the_reference_and_labels_its_own_matches(model):
    canvas = _canvas(gen_length=8, rows=4)
    reference = dd.generate(model, canvas, gen_length=8, blocks=4, rule=dd.TopK(1)).tokens
    features, labels = oracle_traces(model, canvas, reference, gen_length=8, block_length=4)
    assert features.shape[1] == labels.shape[1] == 4 and len(features) >= 4  # >= 1 forward a block a row
    assert np.all((features >= 0) & (features <= 1)) and labels.any()


def test_a_causal_model_is_refused(model):
    causal = sj.Model(model.params, tiny_llama_config())
    with pytest.raises(ValueError, match="masked-diffusion"):
        dd.generate(causal, _canvas(), gen_length=8, rule=dd.TopK(1))
    with pytest.raises(ValueError, match="cache"):
        dd.generate(model, _canvas(), gen_length=8, rule=dd.TopK(1), cache="full")


def test_a_canvas_pads_prompts_to_a_given_width():
    canvas = dd.make_canvas([[5, 6], [7]], 3, MASK, pad_id=0, prompt_width=4)
    np.testing.assert_array_equal(canvas.tokens, [[0, 0, 5, 6, MASK, MASK, MASK], [0, 0, 0, 7, MASK, MASK, MASK]])
    np.testing.assert_array_equal(canvas.valid[:, :4], [[False, False, True, True], [False, False, False, True]])
    with pytest.raises(ValueError, match="does not fit"):
        dd.make_canvas([[5, 6, 7]], 3, MASK, prompt_width=2)
