"""DraftTree: derived fields against a plain numpy reference, validity, jit, errors; Verdict."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.tree import DraftTree, Verdict, chain


def random_parents(rng, b, n):
    """int[B, N] random valid parent arrays (parents[i] < i)."""
    parents = np.full((b, n), -1)
    for i in range(1, n):
        parents[:, i] = rng.integers(0, i, size=b)
    return parents


def reference(parents):
    """(depth, ancestors, root-first path list) of one row, the obvious way."""
    n = len(parents)
    paths = []
    for i in range(n):
        path, j = [], i
        while j != -1:
            path.append(j)
            j = parents[j]
        paths.append(path[::-1])
    depth = np.array([len(p) - 1 for p in paths])
    anc = np.zeros((n, n), bool)
    for i, p in enumerate(paths):
        anc[i, p] = True
    return depth, anc, paths


def test_build_matches_reference():
    rng = np.random.default_rng(0)
    parents = random_parents(rng, 3, 12)
    tree = DraftTree.build(rng.integers(0, 50, (3, 12)), parents)
    assert tree.max_depth == max(reference(p)[0].max() for p in parents)
    assert tree.paths.shape == (3, 12, tree.max_depth + 1)
    for b in range(3):
        depth, anc, paths = reference(parents[b])
        np.testing.assert_array_equal(tree.depth[b], depth)
        np.testing.assert_array_equal(tree.ancestors[b], anc)
        for i, path in enumerate(paths):
            padded = path + [i] * (tree.max_depth + 1 - len(path))
            np.testing.assert_array_equal(tree.paths[b, i], padded)
    assert tree.valid.all() and tree.q is None
    lengths = jnp.array([5, 0, 7])
    np.testing.assert_array_equal(tree.positions(lengths), tree.depth + lengths[:, None])


def test_chain():
    tree = chain(jnp.arange(10).reshape(2, 5), q=jnp.full((2, 5, 3), 1 / 3))
    assert tree.max_depth == 4 and tree.q.shape == (2, 5, 3)
    np.testing.assert_array_equal(tree.parents[0], [-1, 0, 1, 2, 3])
    np.testing.assert_array_equal(tree.depth[1], np.arange(5))
    np.testing.assert_array_equal(tree.ancestors[0], np.tril(np.ones((5, 5), bool)))
    np.testing.assert_array_equal(tree.paths[0, 2], [0, 1, 2, 2, 2])


def test_shared_parents_broadcast():
    tree = DraftTree.build(np.zeros((2, 4), np.int32), np.array([-1, 0, 0, 1]))
    assert tree.parents.shape == (2, 4) and tree.max_depth == 2


def test_invalid_nodes_invalidate_their_subtrees():
    parents = np.array([-1, 0, 1, 2, 0, 4])
    valid = np.array([[True, True, False, True, True, True]])
    tree = DraftTree.build(np.zeros((1, 6), np.int32), parents, valid=valid)
    np.testing.assert_array_equal(tree.valid[0], [True, True, False, False, True, True])


@jax.jit
def _build_traced(tokens, parents):
    return DraftTree.build(tokens, parents, max_depth=2)


def test_build_under_jit():
    """Traced parents need a static max_depth; nodes deeper than it become invalid."""
    parents = np.array([[-1, 0, 1, 2, 0]])
    tree = _build_traced(jnp.zeros((1, 5), jnp.int32), parents)
    assert tree.max_depth == 2 and tree.paths.shape == (1, 5, 3)
    np.testing.assert_array_equal(tree.valid[0], [True, True, True, False, True])
    np.testing.assert_array_equal(tree.depth[0], [0, 1, 2, 3, 1])
    with pytest.raises(ValueError, match="static max_depth"):
        jax.jit(DraftTree.build)(jnp.zeros((1, 5), jnp.int32), parents)


def test_tree_is_a_pytree():
    tree = chain(jnp.zeros((2, 3), jnp.int32))
    leaves, treedef = jax.tree.flatten(tree)
    again = jax.tree.unflatten(treedef, leaves)
    assert again.max_depth == 2 and again.q is None
    assert jax.jit(lambda t: t.depth.sum())(tree) == 6


ONE = np.zeros((1, 3), int)
CHAIN3 = [-1, 0, 1]


@pytest.mark.parametrize("kwargs,match", [
    ({"tokens": np.zeros((2, 3)), "parents": CHAIN3}, "tokens must be an int"),
    ({"tokens": np.zeros(3, int), "parents": CHAIN3}, r"tokens must be an int array \[B, N\]"),
    ({"tokens": np.zeros((2, 3), int), "parents": np.zeros((2, 4), int) - 1}, "parents must be"),
    ({"tokens": ONE, "parents": [0, 0, 1]}, r"parents\[:, 0\] must be -1"),
    ({"tokens": ONE, "parents": [-1, 0, 2]}, r"parents\[0, 2\] = 2"),
    ({"tokens": ONE, "parents": [-1, -1, 0]}, r"parents\[0, 1\] = -1"),
    ({"tokens": ONE, "parents": CHAIN3, "max_depth": 1}, "depth 2 > max_depth=1"),
    ({"tokens": ONE, "parents": CHAIN3, "max_depth": 3}, "max_depth must be"),
    ({"tokens": ONE, "parents": CHAIN3, "q": np.ones((1, 2, 4))}, "q must be"),
    ({"tokens": ONE, "parents": CHAIN3, "valid": np.array([[False, True, True]])},
     r"valid\[:, 0\] must be True"),
    ({"tokens": ONE, "parents": CHAIN3, "valid": np.ones((1, 3))}, "valid must be"),
])
def test_build_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DraftTree.build(**kwargs)


def test_verdict_emitted():
    tree = DraftTree.build(np.array([[9, 10, 11, 12]]), np.array([-1, 0, 0, 2]))
    v = Verdict(path=jnp.array([[0, 2, 3]]), num_accepted=jnp.array([2]), next_token=jnp.array([7]))
    np.testing.assert_array_equal(v.emitted(tree), [[11, 12, 7]])
    v = Verdict(path=jnp.array([[0, 2, 2]]), num_accepted=jnp.array([1]), next_token=jnp.array([7]))
    np.testing.assert_array_equal(v.emitted(tree), [[11, 7, -1]])
