"""docs/guide/write-a-drafter.md runs as written: its example drafter decodes the target's own
greedy text, and its registry line is one the registry takes."""

from __future__ import annotations

from pathlib import Path

from specjax import methods
from tests.markdown_blocks import python_blocks, run_blocks

PAGE = Path(__file__).resolve().parents[1] / "docs" / "guide" / "write-a-drafter.md"


def test_write_a_drafter_page_runs(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(methods, "METHODS", dict(methods.METHODS))  # the page registers "bigram"
    namespace = run_blocks(PAGE)
    assert methods.find("bigram")[0].description.startswith("each token's last successor")
    line = next(b for b in python_blocks(PAGE) if b.skip)  # the line to add to specjax/methods.py
    method = eval(line.code.strip().rstrip(","), {**vars(methods), "Bigram": namespace["Bigram"]})
    assert method.name == "bigram" and method.make(None, None) == namespace["Bigram"](k=4)
