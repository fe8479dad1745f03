"""The ```python blocks of a markdown page, for tests that run a page's code as a reader would:
in order, in one namespace. A block right after a `<!-- no-test: reason -->` line is skipped
(a fragment of a file, say); keep those few."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

BLOCK = re.compile(r"^(<!-- no-test: (.+?) -->\n)?```python\n(.*?)^```$", re.S | re.M)


@dataclasses.dataclass(frozen=True)
class Block:
    """One ```python block: its code, the page's line its code starts on (0-based) and the
    no-test reason (None: the block runs)."""

    code: str
    line: int
    skip: str | None


def python_blocks(path: str | Path) -> list[Block]:
    text = Path(path).read_text()
    return [Block(m.group(3), text.count("\n", 0, m.start(3)), m.group(2)) for m in BLOCK.finditer(text)]


def run_blocks(path: str | Path, namespace: dict | None = None) -> dict:
    """Run the page's blocks that are not skipped, in order, in one namespace (returned); a
    traceback names the page's own line numbers."""
    namespace = {} if namespace is None else namespace
    for block in python_blocks(path):
        if block.skip is None:
            exec(compile("\n" * block.line + block.code, str(path), "exec"), namespace)
    return namespace
