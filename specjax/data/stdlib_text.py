"""Code and prose mined from the running interpreter's standard library for training prompts:
its functions and methods (source and docstring), prose passages (the Python reference topics
in `pydoc_data` and the modules' docstrings) and their sentences. The modules held out of the
corpus (`corpus.HELD_OUT`) are not read."""

from __future__ import annotations

import functools
import re
import textwrap

from specjax.data.corpus import list_files, read_text, resolve_root


@functools.lru_cache(maxsize=1)
def _source_files() -> tuple:
    train, _ = list_files(resolve_root("stdlib"))  # held-out modules stay out
    return tuple(train)


_DEF = re.compile(r"^([ \t]*)(?:async[ \t]+)?def[ \t]+(\w+)[ \t]*\(", re.M)
_DOC = re.compile(r'\A(?:[ \t]*(?:#[^\n]*)?\n)*[ \t]*[rRuU]?("""|\'\'\')(.*?)\1', re.S)


@functools.lru_cache(maxsize=None)
def _functions(index: int) -> tuple:
    """(module, name, source, docstring) of the file's functions and methods of 150-1400 chars
    (a block is the `def` line and the lines indented deeper; a regex, not a parse: fast)."""
    path = _source_files()[index]
    text = read_text(path)
    module = path.relative_to(resolve_root("stdlib")).with_suffix("").as_posix().replace("/", ".")
    out = []
    for m in _DEF.finditer(text):
        indent, name = len(m.group(1).expandtabs()), m.group(2)
        if name.startswith("__"):
            continue
        lines = text[m.start():].split("\n")
        end = 1
        while end < len(lines) and (not lines[end].strip() or
                                    len(lines[end]) - len(lines[end].lstrip()) > indent):
            end += 1
        src = "\n".join(lines[:end]).rstrip()
        if 150 <= len(src) <= 1400:
            body = src.split(":\n", 1)[-1]
            doc = _DOC.match(body)
            out.append((module, name, textwrap.dedent(src), _clean_doc(doc.group(2)) if doc else ""))
    return tuple(out)


def _clean_doc(doc: str) -> str:
    return "\n\n".join(" ".join(p.split()) for p in re.split(r"\n\s*\n", doc.strip()))


@functools.lru_cache(maxsize=1)
def _passages() -> tuple:
    """Prose passages of 300-1300 chars: the Python reference topics split at paragraphs,
    and the stdlib's module docstrings."""
    import pydoc_data.topics

    out = []
    for _, text in sorted(pydoc_data.topics.topics.items()):
        out += _chunks(text)
    for path in _source_files():
        doc = _DOC.match(read_text(path))
        if doc:
            out += _chunks(doc.group(2))
    return tuple(out)


def _chunks(text: str, lo: int = 300, hi: int = 1300) -> list[str]:
    """Consecutive prose paragraphs (no code, tables or headings) merged into passages."""
    paras = [p.strip() for p in re.split(r"\n\s*\n", text)]
    prose = [" ".join(p.split()) for p in paras
             if len(p) > 80 and not re.search(r"^\s|>>>|[=*-]{4}|[{};]\s*$", p, re.M)]
    out, cur = [], ""
    for p in prose:
        if len(cur) + len(p) > hi:
            if len(cur) >= lo:
                out.append(cur)
            cur = p if len(p) <= hi else ""
        else:
            cur = f"{cur}\n\n{p}" if cur else p
    if len(cur) >= lo:
        out.append(cur)
    return out


def sentences(text: str) -> list[str]:
    """The text's sentences of 40-220 chars."""
    return [s for s in re.split(r"(?<=[.!?])\s+", " ".join(text.split())) if 40 <= len(s) <= 220]


def stdlib_function(rng, with_doc=False):
    """A random (module, name, source, docstring) of a standard-library function (`with_doc`:
    one whose docstring has at least 30 chars)."""
    files = _source_files()
    for _ in range(50):
        fns = _functions(rng.randrange(len(files)))
        fns = [f for f in fns if len(f[3]) >= 30] if with_doc else fns
        if fns:
            return rng.choice(fns)
    raise ValueError("no standard-library functions found to build code prompts from")


def passage(rng):
    """A random prose passage of 300-1300 chars."""
    return rng.choice(_passages())
