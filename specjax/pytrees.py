"""Frozen dataclasses as pytrees whose structure includes their class.

jaxlib 0.10's `jax.tree_util.register_dataclass` nodes of two classes compare equal when their
static fields do (their hashes differ), so a cache keyed by a pytree's structure can hand one
class the program compiled for another: through one `jax.jit`, 200 one-field classes with equal
fields ran another class's program 33 times (tests/test_pytrees.py). Two of the dLLM rules,
`TopK(1)` and `Factor(1.0)`, were such a pair. `register_dataclass` here keeps jax's interface
and fields but registers a custom node, whose equality includes the class.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax


def register_dataclass(nodetype, data_fields: Sequence[str] | None = None,
                       meta_fields: Sequence[str] | None = None):
    """As `jax.tree_util.register_dataclass` (usable as a bare decorator): `data_fields` are
    the children, `meta_fields` static; by default the fields marked
    `dataclasses.field(metadata=dict(static=True))` are static and the others data."""
    names = [f.name for f in dataclasses.fields(nodetype) if f.init]
    if data_fields is None and meta_fields is None:
        static = {f.name for f in dataclasses.fields(nodetype) if f.metadata.get("static", False)}
        meta_fields = [n for n in names if n in static]
    if meta_fields is None:
        meta_fields = [n for n in names if n not in data_fields]
    if data_fields is None:
        data_fields = [n for n in names if n not in meta_fields]
    data_fields, meta_fields = tuple(data_fields), tuple(meta_fields)
    if sorted(data_fields + meta_fields) != sorted(names):
        raise ValueError(f"{nodetype.__name__}: data_fields {data_fields} and meta_fields {meta_fields} "
                         f"must split its fields {tuple(names)}")

    def flatten_with_keys(x):
        return [(jax.tree_util.GetAttrKey(n), getattr(x, n)) for n in data_fields], tuple(getattr(x, n) for n in meta_fields)

    def flatten(x):
        return [getattr(x, n) for n in data_fields], tuple(getattr(x, n) for n in meta_fields)

    def unflatten(meta, children):
        return nodetype(**dict(zip(meta_fields, meta)), **dict(zip(data_fields, children)))

    jax.tree_util.register_pytree_with_keys(nodetype, flatten_with_keys, unflatten, flatten)
    return nodetype
