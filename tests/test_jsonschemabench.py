"""benchmarks/jsonschemabench.py's own parts that define its numbers: the seeded sample (the
same files on every machine, a smaller sample a prefix of a larger), the compliance check and
which schemas a round decodes."""

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


def test_batch_table_counts_rows():
    def run(compliance, same, speedup):
        rows = [{"compliance": c} for c in compliance]
        method = {"rows": rows, "tau": 2.0, "tokens_per_s": 10.0}
        return {"constrained-ar": method, "constrained-spec": method, "unconstrained-ar": method,
                "spec_equals_ar": same, "ar_equals_batch1": [True, None], "spec_speedup": speedup}

    table = bench["batch_table"]({"Kubernetes": run(["valid", "cut off"], [True, True], 2.0),
                                  "Glaiveai2K": run(["valid", "invalid"], [True, False], 1.0)}).splitlines()
    assert table[2].startswith("| Glaiveai2K | 2 | 1 / 1 / 0 / 0 | 1 / 1 / 0 | 1/2 | 1/1 |")  # the categories' order
    assert table[4].startswith("| **all** (median of batches) | 4 | 2 / 1 / 1 / 0 | 2 / 1 / 1 | 3/4 | 2/2 |")
    assert table[4].endswith("| 2.00 | 1.50x |")


def test_a_smaller_prompt_limit_keeps_earlier_decodes():
    passed_over = bench["passed_over"]
    assert passed_over(None, 5000, 4096) and passed_over({"skipped": "prompt of 5000 tokens"}, 5000, 4096)
    assert not passed_over({"constrained-ar": {}}, 5000, 4096)  # decoded at a larger limit: kept
    assert not passed_over(None, 4000, 4096)
