"""Benchmark prompts: held-out standard-library code (never trained on), or a JSONL file."""

from __future__ import annotations

import json
import re
from pathlib import Path

from specjax.train.corpus import list_files, read_text, resolve_root

_DEF = re.compile(r"^(    )?def \w+\(.*\):\s*$", re.M)


def heldout_prompts(n: int = 16, context_chars: int = 400) -> list[str]:
    """`n` prompts, each the code before a held-out function body: up to `context_chars`
    characters ending with a `def ...:` line. Deterministic: spread over the held-out files."""
    _, files = list_files(resolve_root("stdlib"))
    per_file = [[m.end() for m in _DEF.finditer(read_text(f))] for f in files]
    prompts, i = [], 0
    while len(prompts) < n and any(per_file):
        f = i % len(files)
        if per_file[f]:
            end = per_file[f].pop(len(per_file[f]) // 2)  # from the middle of the file
            text = read_text(files[f])
            # No trailing newline: the tokenizer merges a newline with the next line's indent,
            # so a prompt ending in a bare newline ends on a split the model never saw.
            prompts.append(text[max(0, end - context_chars): end].rstrip())
        i += 1
    return prompts


def load_prompts(path: str | Path) -> list[str]:
    """Prompts from a JSONL file: a `prompt` field, or Spec-Bench's `turns` (first turn)."""
    prompts = []
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if "prompt" in row:
                prompts.append(row["prompt"])
            elif row.get("turns"):
                prompts.append(row["turns"][0])
            else:
                raise ValueError(f"{path}:{line_no}: no 'prompt' or 'turns' field")
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts
