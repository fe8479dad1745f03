"""Every ```python block of README.md runs as written: in order, in one namespace (as a reader
pasting them into one session), in an empty folder. A block right after a
`<!-- no-test: reason -->` line is skipped; keep those few."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"^(<!-- no-test: .+ -->\n)?```python\n(.*?)^```$", re.S | re.M)


def test_readme_python_blocks_run(tmp_path, monkeypatch):
    text = README.read_text()
    blocks = list(BLOCK.finditer(text))
    skipped = [b for b in blocks if b.group(1)]
    assert len(blocks) >= 6 and len(skipped) <= 2
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for b in blocks:
        if not b.group(1):  # padded so that a traceback names the README's own line numbers
            line = text.count("\n", 0, b.start(2))
            exec(compile("\n" * line + b.group(2), str(README), "exec"), namespace)
    assert (tmp_path / "ckpt" / "tokenizer.json").is_file()
