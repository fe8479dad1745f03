"""Lookahead (trie retrieval): the trie against n-gram counts, retrieval order, pruning under a
small capacity, and greedy equality / sampled reproducibility through sj.generate."""

from __future__ import annotations

from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax as sj
from specjax.drafters import Lookahead
from specjax.drafters.lookahead import trie_paths

RAGGED = [[5, 17, 33, 9, 60, 5, 17, 33], [40, 3], [8, 8, 50, 14, 22, 8, 8], [11]]


def _grams(seq, levels, prompt_len):
    """Reference trie: {n-gram (n <= levels): (occurrences ending in the prompt, after it)}."""
    fin, fout = Counter(), Counter()
    for i in range(len(seq)):
        for n in range(1, levels + 1):
            if i + n <= len(seq):
                (fin if i + n - 1 < prompt_len else fout)[tuple(seq[i:i + n])] += 1
    return {g: (fin[g], fout[g]) for g in fin | fout}


def _insert_in_steps(la, seq, prompt_len, steps):
    """Insert the prompt, then the rest of `seq` in increments of `steps` tokens (jitted once)."""
    tokens = jnp.asarray([seq + [0] * 4], jnp.int32)
    state = la.init(None, tokens[:, :prompt_len], jnp.array([prompt_len]), tokens.shape[1])
    insert = jax.jit(la.insert)
    length = prompt_len
    state = insert(state, tokens, jnp.array([length]))
    for k in steps:
        length += k
        state = insert(state, tokens, jnp.array([length]))
    assert length == len(seq)
    return state, tokens


def _check_structure(state, la):
    """Every used node hangs under a used parent one level up; anc agrees with the parents."""
    token, parent, depth, anc = (np.asarray(x[0]) for x in (state.token, state.parent, state.depth, state.anc))
    used = depth >= 0
    assert np.all(token[used] >= 0) and np.all(token[~used] == -1)
    for m in np.flatnonzero(used):
        if depth[m] == 0:
            assert parent[m] == -1
        else:
            assert used[parent[m]] and depth[parent[m]] == depth[m] - 1
        chain, n = [], m
        while n >= 0:
            chain.append(n)
            n = parent[n]
        chain = chain[::-1]
        for j in range(la.max_query_length):
            assert anc[m, j] == (chain[j] if j < len(chain) else -1)
    keys = [(parent[m], token[m]) for m in np.flatnonzero(used)]
    assert len(keys) == len(set(keys)), "a (parent, token) pair is stored twice"


def test_trie_counts_match_ngram_counts():
    la = Lookahead(decoding_length=4, branch_length=3, max_query_length=2, max_nodes=256)
    rng = np.random.default_rng(0)
    seq = [int(x) for x in rng.integers(1, 5, size=30)]  # small alphabet: many shared prefixes
    state, _ = _insert_in_steps(la, seq, prompt_len=11, steps=[1, 4, 2, 4, 3, 1, 4])
    assert int(state.inserted[0]) == len(seq)
    assert trie_paths(state) == _grams(seq, la.levels, prompt_len=11)
    _check_structure(state, la)


def test_the_trie_holds_what_the_text_can_fill():
    """A row's slots are the n-grams its text can hold (min(V^(d+1), S - d) at depth d), not
    max_nodes; so many never fill: every n-gram is counted exactly."""
    la = Lookahead(decoding_length=4, branch_length=3, max_query_length=2, max_nodes=4096)
    seq = [int(x) for x in np.random.default_rng(1).integers(0, 2, size=40)]  # a vocabulary of 2
    target = type("T", (), {"config": type("C", (), {"vocab_size": 2})()})()
    tokens = jnp.asarray([seq], jnp.int32)
    state = la.init(target, tokens[:, :9], jnp.array([9]), len(seq))
    assert state.token.shape[1] == la.capacity(len(seq), 2) == 2 + 4 + 8 + 16 + 32 == 62
    assert la.capacity(len(seq)) == 40 + 39 + 38 + 37 + 36 and la.capacity(10**6) == la.max_nodes
    state = jax.jit(la.insert)(state, tokens, jnp.array([len(seq)]))
    assert trie_paths(state) == _grams(seq, la.levels, prompt_len=9)


def test_retrieval_ranks_by_frequency_and_prefers_longer_queries():
    la = Lookahead(decoding_length=3, branch_length=2, max_query_length=2, max_nodes=128)
    retrieve = jax.jit(la.retrieve)
    seq = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 7, 2, 8, 9, 5, 2]
    state, tokens = _insert_in_steps(la, seq, prompt_len=len(seq), steps=[])
    # query (5, 2) is unseen, so the last token alone: 2 -> 3 (x3) -> 4 (x3), 2 -> 8 (x1) -> 9.
    # Top 3 by frequency, ties to the shallower: 3, 4, 8; laid out breadth-first.
    tree = retrieve(state, tokens, jnp.array([len(seq)]))
    np.testing.assert_array_equal(tree.tokens[0], [2, 3, 8, 4])
    np.testing.assert_array_equal(tree.parents[0], [-1, 0, 0, 1])
    assert bool(tree.valid.all())
    # query (7, 2) was seen: its own continuation 8 -> 9 wins over the more frequent 3 -> 4
    tree = retrieve(state, tokens, jnp.array([14]))
    np.testing.assert_array_equal(tree.tokens[0, :3], [2, 8, 9])
    np.testing.assert_array_equal(tree.parents[0, :3], [-1, 0, 1])
    np.testing.assert_array_equal(tree.valid[0], [True, True, True, False])
    # a root never seen: no drafts
    tree = retrieve(state, tokens.at[0, 3].set(6), jnp.array([4]))
    np.testing.assert_array_equal(tree.valid[0], [True, False, False, False])


def test_pruning_keeps_frequent_paths_within_capacity():
    la = Lookahead(decoding_length=4, branch_length=2, max_query_length=1, max_nodes=24)
    seq = []
    for noise in range(10, 30):  # a frequent motif between tokens seen once
        seq += [1, 2, 3, noise]
    state, _ = _insert_in_steps(la, seq, prompt_len=8, steps=[3] * 24)
    _check_structure(state, la)
    got, want = trie_paths(state), _grams(seq, la.levels, prompt_len=8)
    assert len(want) > 3 * la.max_nodes and len(got) <= la.max_nodes
    for motif in [(1,), (2,), (3,), (1, 2), (2, 3), (1, 2, 3)]:  # never evicted: exact counts
        assert got[motif] == want[motif], motif
    for path, (fin, fout) in got.items():
        assert fin <= want[path][0] and fout <= want[path][1]
    assert (10,) not in got and (11,) not in got  # old singletons were evicted first
    assert (29,) in got  # the newest token is in


@pytest.fixture(scope="module")
def target(random_target):
    return random_target


DRAFTER = Lookahead(decoding_length=8, branch_length=4, max_query_length=2, max_nodes=256)


def test_greedy_equals_autoregressive_on_a_repetitive_prompt(target):
    prompt = [[7, 21, 3, 44, 9] * 4 + [7, 21]]
    want = sj.generate(target, prompt, max_new_tokens=32)
    got = sj.generate(target, prompt, max_new_tokens=32, drafter=DRAFTER)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    assert got.stats.method == "lookahead" and got.stats.verifier == "Greedy"
    assert got.stats.tau > 2.0, got.stats
    assert got.stats.target_calls < want.stats.target_calls


def test_greedy_equals_autoregressive_ragged_batch(target):
    want = sj.generate(target, RAGGED, max_new_tokens=32)
    got = sj.generate(target, RAGGED, max_new_tokens=32, drafter=DRAFTER)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    assert got.stats.tau > 1.2, got.stats


def test_sampling_is_reproducible_and_valid(target):
    kw = {"max_new_tokens": 24, "drafter": DRAFTER, "temperature": 1.0, "key": jax.random.key(3)}
    a = sj.generate(target, RAGGED, **kw)
    b = sj.generate(target, RAGGED, **kw)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert a.stats.verifier == "TopK"
    np.testing.assert_array_equal(a.num_tokens, [24] * 4)
    assert a.tokens.min() >= 0 and a.tokens.max() < 64
    assert a.stats.tau >= 1.0


def test_bad_settings_fail_clearly():
    with pytest.raises(ValueError, match="decoding_length"):
        Lookahead(decoding_length=0)
    with pytest.raises(ValueError, match="max_nodes"):
        Lookahead(branch_length=4, max_query_length=2, max_nodes=5)
    with pytest.raises(ValueError, match="output_weight"):
        Lookahead(output_weight=2.0)
