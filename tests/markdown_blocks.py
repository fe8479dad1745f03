"""The fenced code blocks of a markdown page, for tests that run a page's code as a reader would:
the ```python blocks in order, in one namespace. A block right after a `<!-- skip: reason -->`
line does not run (a fragment of a file, a package install, hours of training); keep those few."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

FENCE = re.compile(r"^(?:<!-- skip: (.+?) -->\n)?```(\w*)\n(.*?)^```$", re.S | re.M)


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced block: its language (the word after the fence), its code, the page's line its
    code starts on (0-based) and the skip reason (None: the block runs)."""

    lang: str
    code: str
    line: int
    skip: str | None


def blocks(path: str | Path) -> list[Block]:
    """Every fenced block of the page, in order."""
    text = Path(path).read_text()
    return [Block(m.group(2), m.group(3), text.count("\n", 0, m.start(3)), m.group(1)) for m in FENCE.finditer(text)]


def python_blocks(path: str | Path) -> list[Block]:
    return [b for b in blocks(path) if b.lang == "python"]


def run_python(block: Block, path: str | Path, namespace: dict) -> None:
    """Run one ```python block in `namespace` as a reader's session would (none of this module's
    `__future__` imports); a traceback names the page's own line numbers."""
    exec(compile("\n" * block.line + block.code, str(path), "exec", dont_inherit=True), namespace)


def run_blocks(path: str | Path, namespace: dict | None = None) -> dict:
    """Run the page's ```python blocks that are not skipped, in order, in one namespace (returned;
    by default a fresh `__main__`'s)."""
    namespace = {"__name__": "__main__"} if namespace is None else namespace
    for block in python_blocks(path):
        if block.skip is None:
            run_python(block, path, namespace)
    return namespace
