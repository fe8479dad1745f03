"""SAM-Decoding: the on-device suffix automaton against a brute-force longest-suffix match, the
drafted chain and its length policy, the static corpus, and the sampled law (greedy equality on
the shipped model is in tests/test_engine.py, on SmolLM2 in tests/test_smollm2.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

import specjax as sj
from specjax.drafters import ADED, RASD, SAM, TokenRecycling
from specjax.drafters.base import Context
from specjax.sampling import SamplingParams
from tests.exactness import chi_square_pvalue, exact_joint, sampled_joint, sharp_model

S = 48  # text capacity of the automata below


def _brute_match(seq):
    """(L, e): the longest suffix of seq that also ends at an earlier position, and the first
    such end e (L = 0, e = -1 when even the last token is new)."""
    n = len(seq)
    for length in range(n - 1, 0, -1):
        for e in range(length - 1, n - 1):
            if seq[e - length + 1: e + 1] == seq[n - length:]:
                return length, e
    return 0, -1


def _texts():
    """Random texts over alphabets from 2 symbols (long repeats) to 49k (few), one per row."""
    rng = np.random.default_rng(0)
    return [[int(x) for x in rng.integers(0, a, size=S)] for a in (2, 3, 6, 49_152)]


@pytest.fixture(scope="module")
def advance():
    return jax.jit(SAM().advance)


def test_automaton_finds_the_longest_earlier_suffix(advance):
    """Fed a token at a time, every row's match is the brute-force longest earlier suffix, with
    the end of its first occurrence; the automaton stays within 2n states."""
    _check_matches(advance, _texts())


@hypothesis.settings(max_examples=20, deadline=None)
@hypothesis.given(st.lists(st.lists(st.integers(0, 3), min_size=S, max_size=S), min_size=4, max_size=4))
def test_automaton_matches_on_generated_texts(advance, texts):
    """The same on texts hypothesis searches (and shrinks, so a failure is a minimal text)."""
    _check_matches(advance, texts)


def _check_matches(advance, texts):
    tokens = jnp.asarray(texts, jnp.int32)
    state = SAM().init(None, tokens[:, :1], jnp.ones((4,), jnp.int32), S)
    for n in range(1, S + 1):
        state = advance(state, tokens, jnp.full((4,), n, jnp.int32))
        for row, text in enumerate(texts):
            s = int(state.state[row])
            got = (int(state.matched[row]), int(state.automaton.first_end[row, s]) if s else -1)
            assert got == _brute_match(text[:n]), (row, n)
    assert np.all(np.asarray(state.automaton.size) <= 2 * (S - 1))


def test_automaton_jumps_several_tokens_per_step(advance):
    """Steps that commit several tokens at once end in the same match as one token at a time."""
    texts = _texts()
    tokens = jnp.asarray(texts, jnp.int32)
    state = SAM().init(None, tokens[:, :1], jnp.ones((4,), jnp.int32), S)
    n = np.ones(4, np.int32)
    rng = np.random.default_rng(1)
    while n.min() < S:
        n = np.minimum(n + rng.integers(1, 17, size=4), S).astype(np.int32)
        state = advance(state, tokens, jnp.asarray(n))
    for row, text in enumerate(texts):
        assert int(state.matched[row]) == _brute_match(text)[0]


@jax.jit
def _chains(sam, tokens, length):
    state = sam.advance(sam.init(None, tokens[:, :1], jnp.ones_like(length), tokens.shape[1]), tokens, length)
    tree = sam.retrieve(state, Context(tokens, length, SamplingParams()))
    return tree.tokens, tree.valid


def _draft(sam, texts):
    """The chains (root first) `sam` drafts after each text (one compile per drafter)."""
    tokens = jnp.asarray([t + [0] * (16 - len(t)) for t in texts], jnp.int32)
    toks, valid = _chains(sam, tokens, jnp.asarray([len(t) for t in texts], jnp.int32))
    return [np.asarray(t)[np.asarray(v)].tolist() for t, v in zip(toks, valid)]


def test_chain_length_follows_the_match_length():
    sam = SAM(draft_lengths=((2, 2), (4, 5)))
    texts = [[9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4],  # "9 1 2 3 4" matched (5 tokens): 5 drafted
             [9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 7, 8],  # "7 8" matched: 2 drafted
             [9, 1, 2, 3, 4, 5, 6, 7, 8, 0, 3],  # "3" matched (1 token): nothing drafted
             [5, 6, 5, 6, 5, 6]]  # the continuation stops at the committed text
    assert _draft(sam, texts) == [[4, 5, 6, 7, 8, 9], [8, 9, 7], [3], [6, 5, 6]]


def test_a_static_corpus_drafts_what_the_text_has_not_seen():
    corpus = [30, 31, 32, 33, 34, 35, 36, 37, 38, 39]
    sam = SAM.with_corpus(corpus, draft_lengths=((2, 4),))
    texts = [[7, 31, 32, 33],
             [7, 38, 39],  # nothing follows the corpus's end
             [31, 32, 33, 5, 31, 32, 33]]  # the text's own match (4 tokens) beats the corpus's (3)
    assert _draft(sam, texts) == [[33, 34, 35, 36, 37], [39], [33, 5, 31, 32, 33]]
    with pytest.raises(ValueError, match="at least 2 tokens"):
        SAM.with_corpus([3])


def test_bad_settings_fail_clearly():
    with pytest.raises(ValueError, match="draft_lengths"):
        SAM(draft_lengths=((4, 3), (2, 7)))
    with pytest.raises(ValueError, match="draft_lengths"):
        SAM(draft_lengths=((0, 3),))
    with pytest.raises(TypeError, match="fallback"):
        SAM(fallback="recycling")


REPEATING = [1, 4, 2, 5, 1, 4]  # "1 4" matched at the first step: "2 5 1" drafted


@pytest.mark.parametrize("drafter", [SAM(draft_lengths=((1, 3),)),
                                     SAM(draft_lengths=((3, 3),), fallback=TokenRecycling(topk=3, template=(-1, 0, 0, 1))),
                                     RASD(TokenRecycling(topk=3, template=(-1, 0, 0, 1)), SAM(draft_lengths=((1, 3),)), budget=5),
                                     ADED(tree_nodes=5, depth=3, beam=2, top=3, table_size=64, min_score=0.05)],
                         ids=["sam", "sam+recycling", "rasd", "aded"])
def test_sampling_keeps_the_autoregressive_law(drafter):
    target = sharp_model(3)
    params = SamplingParams(temperature=0.9, top_p=0.95)
    counts = sampled_joint(target, drafter, None, params, prompt=REPEATING)
    assert chi_square_pvalue(counts, exact_joint(target, params, prompt=REPEATING)) > 1e-4
