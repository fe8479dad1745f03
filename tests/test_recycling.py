"""TokenRecycling: adjacency update, template fill, prompt seeding, greedy equality, sampling."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax as sj
from specjax.drafters import Context, TokenRecycling
from specjax.drafters.recycling import TEMPLATE_222, RecyclingState
from specjax.tree.template import parse
from specjax.models import ForwardOutput
from specjax.sampling import SamplingParams
from specjax.tree import DraftTree, Verdict

RAGGED = [[5, 17, 33, 9, 60, 5, 17, 33], [40, 3], [8, 8, 50, 14, 22, 8, 8], [11]]
SMALL = ((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 0, 0))  # 9 nodes, depth 4


@pytest.fixture(scope="module")
def target(random_target):
    return random_target


def test_default_template_is_222():
    t = parse(TEMPLATE_222)
    parents, ranks = t.parents, t.rank
    assert len(parents) == 81 and np.bincount(t.depth).tolist() == [1, 8, 21, 25, 15, 8, 3]
    d = TokenRecycling()
    assert d.num_nodes == 81 and d.max_depth == 6 and d.topk == 8
    assert TokenRecycling(template=(-1, 0, 0, 1)).topk == 2  # the ranks the tree reads, no wider
    # the same tree as parent indices: node i's rank is its order among its siblings
    same = TokenRecycling(template=tuple(parents.tolist()))
    np.testing.assert_array_equal(parse(same.template).rank, ranks)


def test_template_errors(target):
    with pytest.raises(ValueError, match="rank 3"):
        TokenRecycling(topk=3, template=((0,), (3,)))
    with pytest.raises(ValueError, match="before its parent"):
        TokenRecycling(template=((0, 0), (0,)))
    with pytest.raises(ValueError, match="parents"):
        TokenRecycling(template=(-1, 1))
    with pytest.raises(ValueError, match="adj must be"):
        TokenRecycling(adj=jnp.zeros((5, 8), jnp.int32)).check(target)


def test_template_fill():
    """Tokens come from adj[parent token, rank] level by level; empty entries (-1), their
    subtrees and repeated siblings are invalid."""
    v, k = 10, 3
    adj = np.full((v, k), -1, np.int32)
    adj[4] = [7, 2, 7]  # rank 2 repeats rank 0
    adj[7] = [1, 5, -1]
    adj[2] = [9, -1, -1]
    adj[1] = [3, 3, 3]
    drafter = TokenRecycling(topk=k, template=((0,), (1,), (2,), (0, 0), (0, 1), (0, 2), (1, 0),
                                               (1, 1), (2, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0)))
    propose = jax.jit(lambda adj, tokens, length: drafter.propose(
        RecyclingState(adj), Context(tokens, length, SamplingParams()), jax.random.key(0))[0])
    tree = propose(jnp.asarray(adj)[None], jnp.array([[6, 4, 0]]), jnp.array([2]))
    want_tokens = [4, 7, 2, 7, 1, 5, 0, 9, 0, 1, 3, 3, 0]
    want_valid = [1, 1, 1, 0, 1, 1, 0, 1, 0, 0, 1, 0, 0]
    # node:       r  0  1  2 00 01 02 10 11 20 000 001 010
    np.testing.assert_array_equal(tree.tokens[0], want_tokens)
    np.testing.assert_array_equal(tree.valid[0], np.array(want_valid, bool))
    np.testing.assert_array_equal(tree.parents[0], [-1, 0, 0, 0, 1, 1, 1, 2, 2, 3, 4, 4, 5])


def test_update_writes_topk_of_every_node():
    b, n, v, k = 2, 5, 12, 3
    drafter = TokenRecycling(topk=k, template=((0,), (1,), (0, 0), (1, 0)))
    tokens = jnp.array([[3, 5, 6, 9, 6],    # token 6 twice: node 4 (later) wins
                        [1, 2, 4, 2, 8]])   # token 2 twice: node 1 is accepted, so it wins
    valid = jnp.array([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]], bool)  # row 1: node 4 invalid
    tree = DraftTree.build(tokens, np.array([-1, 0, 0, 1, 2]), valid=valid)
    verdict = Verdict(jnp.array([[0, 0, 0], [0, 1, 1]]), jnp.array([0, 1]), jnp.array([0, 0]))
    logits = jax.random.normal(jax.random.key(1), (b, n, v))
    out = ForwardOutput(logits, None, None, None)
    adj0 = jnp.full((b, v, k), -1, jnp.int32)
    adj = np.asarray(jax.jit(drafter.update)(RecyclingState(adj0), None, tree, verdict, out).adj)
    top = np.argsort(-np.asarray(logits), axis=-1)[..., :k]
    for row, writers in enumerate([{3: 0, 5: 1, 6: 4, 9: 3}, {1: 0, 2: 1, 4: 2}]):
        for tok in range(v):
            want = top[row, writers[tok]] if tok in writers else [-1] * k
            np.testing.assert_array_equal(adj[row, tok], want, err_msg=f"row {row} token {tok}")


def test_init_seeds_prompt_bigrams(target):
    prompts = jnp.array([[1, 2, 1, 3, 0], [4, 5, 0, 0, 0]])
    lengths = jnp.array([4, 2])
    hot = jnp.full((64, 3), -1, jnp.int32).at[1].set(jnp.array([7, 8, 9]))
    drafter = TokenRecycling(topk=3, template=SMALL, adj=hot)
    adj = np.asarray(jax.jit(drafter.init, static_argnums=3)(target, prompts, lengths, 16).adj)
    np.testing.assert_array_equal(adj[0, 1], [3, 7, 8])  # newest successor first, hot start shifted
    np.testing.assert_array_equal(adj[0, 2], [1, -1, -1])
    np.testing.assert_array_equal(adj[0, 3], [-1, -1, -1])  # the last token has no successor yet
    np.testing.assert_array_equal(adj[1, 4], [5, -1, -1])
    np.testing.assert_array_equal(adj[1, 1], [7, 8, 9])  # padding is not a bigram
    np.testing.assert_array_equal(adj[1, 0], [-1, -1, -1])


@pytest.mark.parametrize("template", [SMALL, TEMPLATE_222], ids=["small", "2.2.2"])
def test_greedy_equals_autoregressive(target, template):
    drafter = TokenRecycling(template=template)
    for prompts in (RAGGED[:1], RAGGED) if template == SMALL else (RAGGED,):
        want = sj.generate(target, prompts, max_new_tokens=32)
        got = sj.generate(target, prompts, max_new_tokens=32, drafter=drafter)
        np.testing.assert_array_equal(got.tokens, want.tokens)
        assert got.stats.tau > 1.2, got.stats
        assert got.stats.target_calls < want.stats.target_calls


def test_sampling_reproducible(target):
    drafter = TokenRecycling(topk=4, template=SMALL)
    kw = dict(max_new_tokens=24, drafter=drafter, temperature=0.8, key=jax.random.key(3))
    a = sj.generate(target, RAGGED, **kw)
    b = sj.generate(target, RAGGED, **kw)
    assert a.stats.verifier == "TopK"
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert np.all((a.tokens >= 0) & (a.tokens < 64)) and np.all(a.num_tokens == 24)
