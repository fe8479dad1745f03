"""The code corpus: Python source files (the running interpreter's standard library, or a
folder), split into train and held-out by module name. Training reads the train files; the
benchmark's held-out prompts and every validation loss come from the others."""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

# Held out of training: validation loss and benchmark prompts come from these modules.
# A name ending in "/" is a package (every file under it); otherwise a single top-level file.
HELD_OUT = (
    "json/", "tomllib/", "argparse.py", "textwrap.py", "shlex.py", "fractions.py", "heapq.py",
    "bisect.py", "calendar.py", "csv.py", "difflib.py", "fnmatch.py", "glob.py", "graphlib.py",
    "ipaddress.py", "pprint.py", "queue.py", "sched.py", "secrets.py", "statistics.py",
    "string.py", "colorsys.py", "getopt.py", "wave.py", "zipapp.py",
)
EXCLUDED_DIRS = frozenset({"test", "tests", "idlelib", "site-packages", "__pycache__",
                           "pydoc_data", "turtledemo"})


def stdlib_root() -> Path:
    """The standard library folder of the running interpreter."""
    return Path(sysconfig.get_paths()["stdlib"])


def resolve_root(source: str) -> Path:
    """`"stdlib"` or a folder path -> the folder to read `*.py` files from."""
    root = stdlib_root() if source == "stdlib" else Path(source)
    if not root.is_dir():
        raise FileNotFoundError(f"corpus folder not found: {root}")
    return root


def list_files(root: Path, held_out=HELD_OUT) -> tuple[list[Path], list[Path]]:
    """Sorted (train, held-out) `*.py` files under `root`, skipping test and tool folders,
    `test_*.py` and `config-*` folders."""
    train, val = [], []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames
                             if d not in EXCLUDED_DIRS and not d.startswith("config-"))
        for name in sorted(filenames):
            if not name.endswith(".py") or name.startswith("test_"):
                continue
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            is_held = any(rel.startswith(h) if h.endswith("/") else rel == h for h in held_out)
            (val if is_held else train).append(path)
    if not val:
        raise ValueError(f"no held-out file found under {root} for {list(held_out)}")
    return train, val


def read_text(path: Path) -> str:
    """A source file as text (undecodable bytes replaced, so any file is usable)."""
    return path.read_bytes().decode("utf-8", errors="replace")
