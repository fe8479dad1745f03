"""Memory you can predict: a row's bytes known before anything is allocated, and a batch that
cannot fit refused in one line, under a real memory cap."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# In a child capped at what it uses plus a margin (RLIMIT_AS: the kernel refuses an allocation past
# it instead of killing the process): 20,000 rows with every --drafter name on the tiny model
# are refused with one line before anything is allocated; then, under a 768 MiB cap, the batch
# the refusal names runs (Token Recycling: a successor table over the vocabulary a row).
CAPPED = textwrap.dedent("""
    import re, resource, sys
    import numpy as np
    import specjax as sj
    from specjax import methods
    from specjax.__main__ import _generate_methods
    from specjax.memory import BatchTooLarge

    def cap(extra):
        used = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (used + extra, resource.RLIM_INFINITY))

    def peak():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    tiny, draft = sj.load("tiny"), sj.load("tiny-draft")
    drafters = {name: methods.make(name, tiny, draft) for name in _generate_methods()}
    rows = np.random.default_rng(0).integers(0, tiny.config.vocab_size, (20_000, 8))
    cap(8 << 30)
    for name, drafter in drafters.items():
        before = peak()
        try:
            sj.generate(tiny, rows, max_new_tokens=2, drafter=drafter, temperature=1.0)
            sys.exit(f"{name}: 20,000 rows ran")
        except BatchTooLarge as e:
            print(name, (peak() - before) >> 20, "MiB:", e)
    cap(768 << 20)
    try:
        sj.generate(tiny, rows, max_new_tokens=2, drafter=drafters["recycling"], temperature=1.0)
        sys.exit("20,000 rows ran under the 768 MiB cap")
    except BatchTooLarge as e:
        fit = int(re.search(r"at most (\\d+) rows fit", str(e)).group(1))
    out = sj.generate(tiny, rows[:fit], max_new_tokens=2, drafter=drafters["recycling"], temperature=1.0)
    print("ran", fit, "rows:", int(out.num_tokens.sum()), "tokens")
""")


def test_large_batches_are_refused_before_allocating_and_the_batch_named_runs():
    from specjax.__main__ import _generate_methods

    r = subprocess.run([sys.executable, "-c", CAPPED], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    *refused, ran = r.stdout.splitlines()
    assert [line.split()[0] for line in refused] == list(_generate_methods())
    for line in refused:  # one line each, and nothing allocated for the batch
        grew = int(line.split()[1])
        assert grew < 100 and re.search(r"MiB: a batch of 20000 rows needs about .* [KM]iB a row: KV cache .* "
                                        r"at most \d+ rows fit; split the batch$", line), line
    fit = int(ran.split()[1])
    assert fit >= 64 and ran == f"ran {fit} rows: {2 * fit} tokens"


def test_row_bytes_count_the_drafter_state():
    import specjax as sj
    from specjax import decoding, memory, methods

    tiny = sj.load("tiny")
    sizes = {}
    for name in ("ar", "recycling", "lookahead"):
        p = decoding.plan(tiny.config, tiny, 16, methods.make(name, tiny), decoding.Request(16), bucketed=True)
        sizes[name] = memory.row_bytes(tiny, p.drafter, prompt_len=p.prompt_len, max_new_tokens=16,
                                       cache_len=p.cache_len)
    assert sizes["ar"].drafter_state == 0 < min(sizes["recycling"].drafter_state, sizes["lookahead"].drafter_state)
    assert all(s.kv_cache > 0 and s.total > s.kv_cache + s.drafter_state for s in sizes.values())
    with pytest.raises(memory.BatchTooLarge, match=r"at most \d+ rows fit"):
        sj.generate(tiny, [[1, 2, 3]] * 1_000_000, max_new_tokens=2)


def test_the_rows_that_fit_a_power_of_two_split_over_the_mesh(monkeypatch):
    import specjax as sj
    from specjax import decoding, memory

    tiny = sj.load("tiny")
    p = decoding.plan(tiny.config, tiny, 16, None, decoding.Request(16), bucketed=True)
    row = memory.row_bytes(tiny, p.drafter, prompt_len=p.prompt_len, max_new_tokens=16, cache_len=p.cache_len)
    free = int(row.total * 100.5 / memory._USABLE) + memory._RESERVED  # 100 rows a device
    monkeypatch.setattr(memory, "available_bytes", lambda device=None: free)
    memory.check(tiny, p, 100, compiled_rows=128, devices=2)  # 64 rows a device
    with pytest.raises(memory.BatchTooLarge, match="on each of 2 devices.* at most 128 rows fit"):
        memory.check(tiny, p, 200, compiled_rows=256, devices=2)
    with pytest.raises(memory.BatchTooLarge, match="at most 64 rows fit"):  # a power of two: its bucket fits
        memory.check(tiny, p, 100, compiled_rows=128)
    monkeypatch.setattr(memory, "available_bytes", lambda device=None: memory._RESERVED)
    with pytest.raises(memory.BatchTooLarge, match="available: not one row fits$"):
        memory.check(tiny, p, 1, compiled_rows=1)


@functools.cache
def _models():
    import specjax as sj

    return sj.load("tiny"), sj.load("tiny-draft")


def memory_line(names) -> str:
    """A method page's memory paragraph: each named setting's bytes a row on the tiny model."""
    from specjax import decoding, memory, methods

    tiny, draft = _models()
    parts = []
    for name in names:
        p = decoding.plan(tiny.config, tiny, 32, methods.make(name, tiny, draft), decoding.Request(128), bucketed=True)
        r = memory.row_bytes(tiny, p.drafter, prompt_len=p.prompt_len, max_new_tokens=p.settings.max_new_tokens,
                             cache_len=p.cache_len)
        parts.append(f"`{name}` keeps {memory._size(r.drafter_state)} of drafter state a row and needs "
                     f"{memory._size(r.total)} a row in all")
    return (f"**Memory.** On the tiny model (a 32-token prompt, 128 new tokens), {'; '.join(parts)} "
            f"(`sj.memory.row_bytes`; a batch that would not fit is refused before anything is allocated).")


def _pages() -> dict:
    """docs/methods page -> the --drafter names it describes (from docs/methods/README.md's table)."""
    from specjax.__main__ import _generate_methods

    root = ROOT / "docs" / "methods"
    pages = {}
    for page, names in re.findall(r"\| \[[^]]+\]\((\S+\.md)\) \| ([^|]+) \|", (root / "README.md").read_text()):
        named = [n for n in re.findall(r"`([\w-]+)`", names) if n in _generate_methods()]
        if named:
            pages[root / page] = named
    return pages


def test_method_pages_state_their_memory_a_row():
    from specjax.__main__ import _generate_methods

    pages = _pages()
    assert {n for names in pages.values() for n in names} == set(_generate_methods()) - {"ar"}
    for page, names in pages.items():
        assert memory_line(names) in " ".join(page.read_text().split()), f"{page.name}: {memory_line(names)}"



def test_the_bench_refuses_a_batch_that_cannot_fit_before_measuring(tmp_path, capsys):
    from specjax.__main__ import main

    out = tmp_path / "bench"
    assert main(["bench", "--quick", "--methods", "ar", "--batch", "1", "1000000", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: a batch of 1000000 rows needs about") and err.count("\n") == 1, err
    assert "rows fit; split the batch" in err and not out.exists()
