"""benchmarks/jsonschemabench.py's own parts that define its numbers: the seeded sample (the
same files on every machine, a smaller sample a prefix of a larger) and the compliance check."""

import json
import runpy
from pathlib import Path

import pytest

bench = runpy.run_path(str(Path(__file__).parents[1] / "benchmarks" / "jsonschemabench.py"), run_name="bench")


@pytest.fixture
def data(tmp_path):
    for category in ("Github_easy", "Kubernetes"):
        (tmp_path / "data" / category).mkdir(parents=True)
        for i in range(12):
            (tmp_path / "data" / category / f"s{i}.json").write_text(json.dumps({"type": "integer", "maximum": i}))
    return bench["Dataset"](str(tmp_path))  # the checkout: its data/ folder is found


def test_sample_is_seeded_and_a_prefix(data):
    small, large = bench["sample"](data, 3), bench["sample"](data, 5)
    assert small == bench["sample"](data, 3)
    assert [c for c, _ in small] == ["Github_easy"] * 3 + ["Kubernetes"] * 3
    assert small[:3] == large[:3] and small[3:] == large[5:8]
    assert [n for _, n in small[:3]] != ["s0.json", "s1.json", "s10.json"]  # shuffled, not the sorted order
    assert json.loads(data.text("Kubernetes", "s4.json")) == {"type": "integer", "maximum": 4}


def test_validity():
    validity = bench["validity"]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert validity('{"a": 1}', schema) == ("valid", "")
    assert validity('{"a": "x"}', schema)[0] == "invalid"
    assert validity('{"a": 1', schema)[0] == "invalid"
    assert validity('{"a": 1}', {"$ref": "https://example.com/unreachable.json"})[0] == "unchecked"
