"""The method registry: every name once, each method's stated rule is the one its drafter picks,
and names with an argument parse."""

from __future__ import annotations

import pytest

import specjax as sj
from specjax import methods
from specjax.sampling import SamplingParams


def test_each_method_states_the_rule_its_drafter_picks_when_sampling():
    tiny, draft = sj.load("tiny"), sj.load("tiny-draft")
    for usage, m in methods.METHODS.items():
        if m.runner == "peer" or m.argument:
            continue
        made = methods.make(usage, tiny, draft)
        drafter = made.base if m.runner == "adaptive" else made
        rule = "" if drafter is None else type(drafter.default_verifier(SamplingParams(0.7))).__name__
        assert rule == m.verifier, usage


def test_names_parse_and_unknown_ones_are_refused():
    m, arg = methods.find("eagle:runs/head")
    assert (m.usage, arg) == ("eagle:FOLDER", "runs/head")
    assert methods.find("eagle") == (methods.METHODS["eagle"], None)
    for bad in ("nope", "eagle:", "ar:x"):
        with pytest.raises(ValueError, match="unknown method"):
            methods.find(bad)
    with pytest.raises(ValueError, match="benchmark only"):
        methods.make("hf-ar", sj.load("tiny"))


def test_methods_table_has_one_row_per_method():
    rows = methods.methods_table().splitlines()[2:]
    assert [r.split("`")[1] for r in rows] == list(methods.METHODS)
