"""RASD (retrieval chain fused into a model tree) and ADED (tri-gram tree search): the fused and
searched trees on hand-made texts, and the sampled law under TopK (greedy equality on the shipped
model is in tests/test_engine.py, on SmolLM2 in tests/test_smollm2.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.drafters import ADED, RASD, SAM, PromptLookup, TokenRecycling
from specjax.drafters.base import Context
from specjax.sampling import SamplingParams

def _paths(tree, row=0):
    """The valid nodes of one row as token paths from the root (the root excluded)."""
    toks, par, valid = (np.asarray(x[row]) for x in (tree.tokens, tree.parents, tree.valid))
    out = set()
    for i in np.flatnonzero(valid)[1:]:
        path, n = [], i
        while n > 0:
            path.append(int(toks[n]))
            n = par[n]
        out.add(tuple(path[::-1]))
    return out

def _propose(drafter, text, vocab=64):
    tokens = jnp.asarray([text], jnp.int32)
    length = jnp.asarray([len(text)], jnp.int32)
    target = type("T", (), {"config": type("C", (), {"vocab_size": vocab})()})()
    state = drafter.init(target, tokens, length, len(text) + 8)
    ctx = Context(jnp.pad(tokens, ((0, 0), (0, 8))), length, SamplingParams())
    return drafter.propose(state, ctx, jax.random.key(0))[0]

def test_rasd_fuses_the_shared_prefix_and_keeps_the_budget():
    # recycling's prompt bigrams give the root 9 the child 1, then 1 -> 2; prompt lookup drafts 1 2 3 4
    text = [9, 1, 2, 3, 4, 7, 9]
    model = TokenRecycling(topk=2, template=(-1, 0, 1, 1))  # root -> a, a -> b (rank 0)
    fused = _propose(RASD(model, PromptLookup(max_ngram=1, num_tokens=4), budget=6), text)
    paths = _paths(fused)
    assert (1, 2, 3, 4) in paths and len(paths) <= 5
    assert len([p for p in paths if p[:1] == (1,)]) == 4  # one path 1 2 3 4, the prefix 1 2 shared
    small = _propose(RASD(model, PromptLookup(max_ngram=1, num_tokens=4), budget=3), text)
    assert _paths(small) == {(1,), (1, 2)}  # pruned to the root and its two best nodes

def test_aded_searches_the_trigram_counts():
    # after "5 6" the text had 7 twice and 8 once; after "6 7", 1; after "6 8", 2
    text = [5, 6, 7, 1, 5, 6, 7, 1, 5, 6, 8, 2, 3, 5, 6]
    tree = _propose(ADED(tree_nodes=5, depth=2, beam=2, top=2, table_size=64, min_score=0.1), text)
    assert _paths(tree) == {(7,), (8,), (7, 1), (8, 2)}
    tree = _propose(ADED(tree_nodes=5, depth=2, beam=2, top=2, table_size=64, min_score=0.5), text)
    assert _paths(tree) == {(7,), (7, 1)}  # 8 (1/3) is under min_score
    assert _paths(_propose(ADED(tree_nodes=5, table_size=64), [3, 4])) == set()  # nothing seen after 4

def test_bad_settings_fail_clearly():
    with pytest.raises(ValueError, match="chain"):
        RASD(TokenRecycling(), SAM(fallback=TokenRecycling()))
    with pytest.raises(ValueError, match="budget"):
        RASD(TokenRecycling(), budget=1)
    with pytest.raises(ValueError, match="power of two"):
        ADED(table_size=1000)

