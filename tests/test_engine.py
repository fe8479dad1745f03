"""The speculative engine: greedy equality for every drafter, sampling exactness for every
(drafter, exact verifier) pair, and the invariants of the stats."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax as sj
from specjax.drafters import DraftModel, Lookahead, PromptLookup, TokenRecycling
from specjax.sampling import SamplingParams
from tests.conftest import tiny_llama_config
from tests.exactness import chi_square_pvalue, exact_joint, sampled_joint, sharp_model

RAGGED = [[5, 17, 33, 9, 60, 5, 17, 33], [40, 3], [8, 8, 50, 14, 22, 8, 8], [11]]


@pytest.fixture(scope="module")
def target(random_target):
    return random_target


@pytest.fixture(scope="module")
def near_draft(target):
    """The target with noise on its weights: agrees often, not always."""
    leaves, tree = jax.tree.flatten(target.params)
    keys = jax.random.split(jax.random.key(7), len(leaves))
    noisy = [w + 0.3 * jnp.std(w) * jax.random.normal(k, w.shape) for w, k in zip(leaves, keys)]
    return sj.Model(jax.tree.unflatten(tree, noisy), target.config)


def drafters(draft):
    return {
        "chain": DraftModel(draft, mode="chain", k=3),
        "iid": DraftModel(draft, mode="iid", k=3, depth=2),
        "gumbel": DraftModel(draft, mode="gumbel", branching=(3, 2)),
        "beam": DraftModel(draft, mode="beam", width=3, depth=2),
        "topk": DraftModel(draft, mode="topk", template=(-1, 0, 0, 1, 1, 2, 3)),
        "dyspec": DraftModel(draft, mode="dyspec", width=3, depth=2),
        "prompt-lookup": PromptLookup(max_ngram=2, num_tokens=4),
    }


@pytest.mark.parametrize("name", list(drafters(None)))
def test_greedy_equals_autoregressive(name, target, near_draft):
    drafter = drafters(near_draft)[name]
    for prompts in (RAGGED[:1], RAGGED):
        want = sj.generate(target, prompts, max_new_tokens=24)
        got = sj.generate(target, prompts, max_new_tokens=24, drafter=drafter)
        np.testing.assert_array_equal(got.tokens, want.tokens, err_msg=name)
        assert got.stats.target_calls <= want.stats.target_calls
    assert got.stats.tau > 1.1, (name, got.stats)  # drafts were accepted, not just corrected


def test_self_draft_accepts_everything(target):
    for temperature in (0.0, 1.0):
        out = sj.generate(target, RAGGED, max_new_tokens=20, temperature=temperature,
                          drafter=DraftModel(target, mode="chain", k=4))
        assert out.stats.tau == pytest.approx(5.0)
        assert out.stats.acceptance_per_depth == (1.0,) * 4


def test_stats_are_consistent(target, near_draft):
    out = sj.generate(target, RAGGED, max_new_tokens=21, drafter=DraftModel(near_draft, k=3))
    s = out.stats
    assert s.committed_tokens == pytest.approx(s.tau * s.steps)
    assert out.num_tokens.sum() == s.new_tokens == 4 * 21
    # every step commits accepted + 1 tokens; the last step of a row may overshoot the limit
    assert 4 * 21 <= s.committed_tokens <= 4 * 21 + 4 * 3
    assert json.loads(json.dumps(s.to_dict()))["tau"] == s.tau


def test_bad_drafter_pairings_fail_clearly(target):
    other = sj.Model.init(tiny_llama_config(32), jax.random.key(1))
    with pytest.raises(ValueError, match=r"draft vocabulary \(32\) differs from the target's \(64\)"):
        sj.generate(target, [[1, 2]], drafter=DraftModel(other))
    with pytest.raises(ValueError, match="needs the draft distributions"):
        sj.generate(target, [[1, 2]], temperature=1.0, drafter=PromptLookup(),
                    verifier=sj.verify.SpeculativeSampling())
    with pytest.raises(ValueError, match="unknown DraftModel mode"):
        DraftModel(target, mode="bogus")


# ---- sampling exactness -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sharp_pair():
    """A target and a different draft with a tiny vocabulary and peaked distributions."""
    return sharp_model(3), sharp_model(4)


EXACT_PAIRS = {
    "ar": (lambda d: None, None),
    "chain/speculative-sampling": (lambda d: DraftModel(d, mode="chain", k=2), sj.verify.SpeculativeSampling()),
    "chain/specinfer": (lambda d: DraftModel(d, mode="chain", k=2), sj.verify.SpecInfer()),
    "iid/spectr": (lambda d: DraftModel(d, mode="iid", k=3, depth=2), sj.verify.SpecTr()),
    "iid/specinfer": (lambda d: DraftModel(d, mode="iid", k=3, depth=2), sj.verify.SpecInfer()),
    "gumbel/rsd": (lambda d: DraftModel(d, mode="gumbel", branching=(3, 2)), sj.verify.RSD()),
    "beam/rsd": (lambda d: DraftModel(d, mode="beam", width=3, depth=2), sj.verify.RSD()),
    "topk/topk": (lambda d: DraftModel(d, mode="topk", template=(-1, 0, 0, 1, 2)), sj.verify.TopK()),
    "dyspec/rsd": (lambda d: DraftModel(d, mode="dyspec", width=2, depth=2), sj.verify.RSD()),
    "prompt-lookup/topk": (lambda d: PromptLookup(max_ngram=1, num_tokens=2), sj.verify.TopK()),
    "lookahead/topk": (lambda d: Lookahead(decoding_length=6, branch_length=2, max_nodes=64), sj.verify.TopK()),
    "recycling/topk": (lambda d: TokenRecycling(topk=3, template=(-1, 0, 0, 0, 1, 2)), sj.verify.TopK()),
}


@pytest.mark.parametrize("name", list(EXACT_PAIRS))
def test_sampling_keeps_the_autoregressive_law(name, sharp_pair):
    target, draft = sharp_pair
    make, verifier = EXACT_PAIRS[name]
    params = SamplingParams(temperature=0.9, top_p=0.95)
    counts = sampled_joint(target, make(draft), verifier, params)
    assert chi_square_pvalue(counts, exact_joint(target, params)) > 1e-4, name


def test_a_wrong_pairing_is_detected(sharp_pair):
    """Negative control: SpecInfer on siblings drawn without replacement is not exact, and the
    test above has the power to see it."""
    target, draft = sharp_pair
    params = SamplingParams(temperature=1.0)
    counts = sampled_joint(target, DraftModel(draft, mode="gumbel", branching=(4, 1)), sj.verify.SpecInfer(),
                            params)
    assert chi_square_pvalue(counts, exact_joint(target, params)) < 1e-6


def test_dyspec_needs_slots_scored_before_their_draw(sharp_pair, monkeypatch):
    """Negative control for DySpec: scoring a sampled slot by its own child's draft probability
    (EAGLE-2's key) lets a child's token decide whether it is drafted, and RSD is no longer
    exact; the test above has the power to see it."""
    from specjax.tree import growth
    target, draft = sharp_pair
    monkeypatch.setattr(growth, "_slot_gain", lambda child_q, greedy: child_q)
    jax.clear_caches()  # programs are traced with the wrong score here, and only here
    params = SamplingParams(temperature=1.0)
    counts = sampled_joint(target, DraftModel(draft, mode="dyspec", width=3, depth=1), sj.verify.RSD(), params)
    jax.clear_caches()
    assert chi_square_pvalue(counts, exact_joint(target, params)) < 1e-6


# ---- the shipped tiny model ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_prompts():
    from tokenizers import Tokenizer

    from specjax.data.prompts import heldout_prompts
    from specjax.convert import resolve
    tok = Tokenizer.from_file(str(resolve("tiny") / "tokenizer.json"))
    ids = [tok.encode(p).ids for p in heldout_prompts(4)]
    return [ids[0][-40:], ids[1][-25:], ids[2][-33:], ids[3][-12:]]  # ragged


@pytest.mark.parametrize("name", ["draft-chain", "draft-iid", "draft-gumbel", "draft-beam", "draft-topk", "draft-dyspec",
                                  "prompt-lookup", "lookahead", "recycling", "sam", "sam-recycling", "rasd",
                                  "aded"])
def test_greedy_equals_autoregressive_on_the_shipped_model(name, tiny_prompts):
    from specjax import methods
    tiny = sj.load("tiny")
    batches = (tiny_prompts[:1], tiny_prompts) if name == "draft-chain" else (tiny_prompts,)
    for prompts in batches:
        want = sj.generate(tiny, prompts, max_new_tokens=20)
        got = sj.generate(tiny, prompts, max_new_tokens=20, drafter=methods.make(name, tiny))
        np.testing.assert_array_equal(got.tokens, want.tokens, err_msg=name)


# ---- compiled shapes and timing -----------------------------------------------------------------

def test_varied_requests_reuse_bucketed_programs(target):
    """Prompt length, output length and batch size are padded to buckets (powers of two), so 9
    requests of varied shapes compile 5 programs (one per bucket triple), not 9."""
    from specjax import decoding
    requests = [(RAGGED[:1], 5), (RAGGED[1:2], 9), (RAGGED[:3], 12), (RAGGED[3:], 16), (RAGGED, 7),
                ([list(range(1, 20))], 6), ([list(range(1, 30)), [3]], 17), (RAGGED[2:], 10), ([[9] * 16], 3)]
    eos = 63  # a setting no other test uses: every program below is compiled here
    before = decoding._decode_jit._cache_size()
    buckets = set()
    for prompts, new in requests:
        out = sj.generate(target, prompts, max_new_tokens=new, eos_token_id=eos)
        assert out.tokens.shape == (len(prompts), new)
        width = decoding.prompt_bucket(max(map(len, prompts)))
        buckets.add((width, decoding.bucket(new), decoding.batch_bucket(len(prompts))))
    assert decoding._decode_jit._cache_size() - before == len(buckets) == 5
    short = sj.generate(target, RAGGED, max_new_tokens=5, eos_token_id=eos)  # a budget, not a new program
    np.testing.assert_array_equal(short.tokens, sj.generate(target, RAGGED, max_new_tokens=16,
                                                           eos_token_id=eos).tokens[:, :5])


def test_large_batches_and_long_prompts_pad_by_at_most_a_quarter():
    from specjax import decoding
    assert [decoding.batch_bucket(n) for n in (1, 3, 64, 65, 81, 100, 6000, 8192)] == [1, 4, 64, 80, 96, 112, 6144, 8192]
    assert [decoding.prompt_bucket(n) for n in (3, 17, 1024, 1025, 1300, 2000)] == [16, 32, 1024, 1280, 1536, 2048]
    assert all(n <= decoding.batch_bucket(n) <= 1.25 * n for n in range(65, 5000))


def test_stats_time_decoding_apart_from_compiling(target):
    first = sj.generate(target, [[1, 2, 3]], max_new_tokens=8, eos_token_id=62)
    again = sj.generate(target, [[1, 2, 3]], max_new_tokens=8, eos_token_id=62)
    assert first.stats.compile_s > first.stats.wall_time_s > 0
    assert again.stats.compile_s == 0
    assert again.stats.tokens_per_s == pytest.approx(8 / again.stats.wall_time_s)
    steps = sj.stream(target, [1, 2, 3], max_new_tokens=8, eos_token_id=61)
    with pytest.raises(StopIteration) as stop:
        while True:
            next(steps)
    stats = stop.value.value  # the generator's return value
    assert stats.compile_s > 0 and stats.new_tokens == 8


def test_stats_name_what_ran(target):
    assert sj.generate(target, [[1, 2]], max_new_tokens=2).stats.verifier == "none (greedy)"
    sampled = sj.generate(target, [[1, 2]], max_new_tokens=2, temperature=1.0)
    assert sampled.stats.method == "ar" and sampled.stats.verifier == "none (sampling)"


def test_a_tree_is_verified_at_the_smallest_size_that_holds_it(target):
    """A drafter with tree_sizes (1, 3, 5): the step's forward covers the smallest size holding
    every active row's valid nodes (zeros past it), and equals the full forward on them."""
    import dataclasses

    from specjax import engine
    from specjax.models import KVCache, forward
    from specjax.pytrees import register_dataclass
    from specjax.tree import chain

    @register_dataclass  # jax's own would give it PromptLookup's structure (specjax/pytrees.py)
    @dataclasses.dataclass(frozen=True)
    class Sized(PromptLookup):
        tree_sizes = (1, 3, 5)

    drafter = Sized(num_tokens=4)
    cache = forward(target.config, target.params, jnp.array([[4, 5, 6, 7]] * 2),
                    cache=KVCache.init(target.config, 2, 16)).cache.advance(jnp.array([4, 4]))
    tokens = jnp.array([[8, 9, 10, 11, 12], [13, 14, 15, 16, 17]])
    for valid_nodes, active, size in ([1, 1], [True, True], 1), ([2, 3], [True, True], 3), \
                                     ([2, 5], [True, False], 3), ([4, 1], [True, True], 5):
        valid = jnp.arange(5)[None, :] < jnp.array(valid_nodes)[:, None]
        tree = chain(tokens, valid=valid)
        positions = tree.positions(cache.lengths)
        got = jax.jit(engine._verify_forward, static_argnums=1)(target, drafter, tree, positions, cache, None,
                                                                jnp.array(active))
        full = forward(target.config, target.params, tokens, positions=positions, cache=cache)
        assert not np.any(got.logits[:, size:]), (valid_nodes, size)
        np.testing.assert_allclose(got.logits[:, :size], full.logits[:, :size], atol=1e-5)
        np.testing.assert_allclose(got.cache.k[:, :, 4: 4 + size], full.cache.k[:, :, 4: 4 + size], atol=1e-6)
    with pytest.raises(ValueError, match="tree_sizes must ascend"):
        sj.generate(target, [[1, 2]], drafter=dataclasses.replace(drafter, num_tokens=6))
