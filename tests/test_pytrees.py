"""specjax.pytrees.register_dataclass: a pytree's structure includes its class, so jit never runs
one class's program for another (jaxlib 0.10's own register_dataclass can)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from specjax.diffusion.named import SAMPLERS
from specjax.pytrees import register_dataclass


def one_field_classes(count: int, register) -> list[type]:
    """`count` frozen dataclasses with one static field each, tagged with their index."""
    classes = []
    for i in range(count):
        cls = dataclasses.make_dataclass(f"Rule{i}", [("k", int, dataclasses.field(default=1, metadata=dict(static=True)))],
                                         frozen=True)
        cls.tag = i
        classes.append(register(cls))
    return classes


def programs_run(classes) -> list[int]:
    """The tag each class's call of one jitted function returns (its own, if jit told them apart)."""
    f = jax.jit(lambda rule, x: x + rule.tag)
    return [int(f(cls(1), 0)) for cls in classes]


def test_jit_runs_each_class_its_own_program():
    classes = one_field_classes(200, register_dataclass)
    assert programs_run(classes) == list(range(200))


def test_negative_control_jax_register_dataclass_can_mix_classes_up():
    a, b = one_field_classes(2, jax.tree_util.register_dataclass)
    if jax.tree.structure(a(1)) != jax.tree.structure(b(1)):
        pytest.skip("this jaxlib tells dataclass nodes of two classes apart")
    classes = one_field_classes(200, jax.tree_util.register_dataclass)
    assert programs_run(classes) != list(range(200))  # measured: 33 of 200 ran another's program


def test_the_dllm_rules_have_structures_of_their_own():
    rules = [s.rule for s in SAMPLERS.values() if s.rule is not None]
    for i, a in enumerate(rules):
        for b in rules[i + 1:]:
            if type(a) is not type(b):  # e.g. TopK(1) and Factor(1.0), Threshold(0.5) and Entropy(0.5)
                assert jax.tree.structure(a) != jax.tree.structure(b), (a, b)


def test_fields_paths_and_round_trip():
    @register_dataclass
    @dataclasses.dataclass(frozen=True)
    class Node:
        w: jax.Array
        n: int = dataclasses.field(default=2, metadata=dict(static=True))

    node = Node(jnp.ones(3), 5)
    leaves, treedef = jax.tree.flatten(node)
    assert len(leaves) == 1
    rebuilt = jax.tree.unflatten(treedef, leaves)
    assert rebuilt.n == 5 and (rebuilt.w == node.w).all()
    assert [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(node)[0]] == [".w"]
    assert jax.tree.structure(Node(jnp.ones(3), 5)) != jax.tree.structure(Node(jnp.ones(3), 6))
    doubled = jax.jit(lambda node: dataclasses.replace(node, w=2 * node.w))(node)
    assert doubled.n == 5 and float(doubled.w.sum()) == 6.0

    @dataclasses.dataclass(frozen=True)
    class Pair:
        a: int
        b: int

    with pytest.raises(ValueError, match="must split its fields"):
        register_dataclass(Pair, data_fields=["a"], meta_fields=["a"])
