"""The speculative engine: greedy equality for every drafter, sampling exactness for every
(drafter, exact verifier) pair, and the invariants of the stats."""

from __future__ import annotations

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
        "prompt-lookup": PromptLookup(max_ngram=2, num_tokens=4),
    }


@pytest.mark.parametrize("name", list(drafters(None)))
def test_greedy_equals_autoregressive(name, target, near_draft):
    drafter = drafters(near_draft)[name]
    for prompts in (RAGGED[:1], RAGGED):
        want = sj.generate(target, prompts, max_new_tokens=24)
        got = sj.generate(target, prompts, max_new_tokens=24, drafter=drafter)
        np.testing.assert_array_equal(got.tokens, want.tokens, err_msg=name)
        assert got.stats["target_calls"] <= want.stats["target_calls"]
    assert got.stats["tau"] > 1.1, (name, got.stats)  # drafts were accepted, not just corrected


def test_self_draft_accepts_everything(target):
    for temperature in (0.0, 1.0):
        out = sj.generate(target, RAGGED, max_new_tokens=20, temperature=temperature,
                          drafter=DraftModel(target, mode="chain", k=4))
        assert out.stats["tau"] == pytest.approx(5.0)
        assert out.stats["acceptance_per_depth"] == [1.0] * 4


def test_stats_are_consistent(target, near_draft):
    out = sj.generate(target, RAGGED, max_new_tokens=21, drafter=DraftModel(near_draft, k=3))
    s = out.stats
    assert s["committed_tokens"] == pytest.approx(s["tau"] * s["steps"])
    assert out.num_tokens.sum() == s["new_tokens"] == 4 * 21
    # every step commits accepted + 1 tokens; the last step of a row may overshoot the limit
    assert 4 * 21 <= s["committed_tokens"] <= 4 * 21 + 4 * 3


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


# ---- the shipped tiny model ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_prompts():
    from tokenizers import Tokenizer

    from specjax.bench.prompts import heldout_prompts
    from specjax.convert import resolve
    tok = Tokenizer.from_file(str(resolve("tiny") / "tokenizer.json"))
    ids = [tok.encode(p).ids for p in heldout_prompts(4)]
    return [ids[0][-40:], ids[1][-25:], ids[2][-33:], ids[3][-12:]]  # ragged


@pytest.mark.parametrize("name", ["draft-chain", "draft-iid", "draft-gumbel", "draft-beam", "draft-topk",
                                  "prompt-lookup", "lookahead", "recycling"])
def test_greedy_equals_autoregressive_on_the_shipped_model(name, tiny_prompts):
    from specjax.drafters.named import named_drafter
    tiny = sj.load("tiny")
    batches = (tiny_prompts[:1], tiny_prompts) if name == "draft-chain" else (tiny_prompts,)
    for prompts in batches:
        want = sj.generate(tiny, prompts, max_new_tokens=20)
        got = sj.generate(tiny, prompts, max_new_tokens=20, drafter=named_drafter(name, tiny))
        np.testing.assert_array_equal(got.tokens, want.tokens, err_msg=name)
