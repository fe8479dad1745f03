"""The user cache of converted GGUFs, so a GGUF is parsed and dequantized once.

Per GGUF (keyed by its path, size and mtime): a specjax checkpoint per dtype and an HF tokenizer
folder, under `$SPECJAX_CACHE`, else `$XDG_CACHE_HOME/specjax`, else `~/.cache/specjax`. Each is
written to a temporary folder and renamed into place, so a crash leaves nothing half-written, and
the temporary folder of a writer killed on the way is removed by the next write.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path

from specjax.convert.checkpoint import is_checkpoint, load_checkpoint, save_checkpoint
from specjax.convert.gguf import load_gguf, read_gguf
from specjax.convert.gguf_tokenizer import gguf_tokenizer
from specjax.layout import kernel_layout
from specjax.models import Model


FORMAT = 2  # what load_gguf writes; a new value converts every GGUF anew (2: a tied Q8_0 / Q4_0 head)


def cache_root() -> Path:
    if os.environ.get("SPECJAX_CACHE"):
        return Path(os.environ["SPECJAX_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specjax"


def cache_folder(gguf_path: Path) -> Path:
    """Where the conversions of this GGUF (as it is now: same path, size and mtime) live."""
    path = Path(gguf_path).resolve()
    stat = path.stat()
    key = hashlib.sha256(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\0{FORMAT}".encode()).hexdigest()[:16]
    return cache_root() / "gguf" / f"{path.stem}-{key}"


def load_cached_gguf(gguf_path: Path, dtype: str | None = None) -> Model:
    """The GGUF's Model from the cache, converted and cached on the first call."""
    folder = cache_folder(gguf_path) / (dtype or "float32")
    if is_checkpoint(folder):
        return load_checkpoint(folder)
    model = load_gguf(gguf_path, dtype)
    _write_atomically(folder, lambda tmp: save_checkpoint(model, tmp))
    return Model(kernel_layout(model.params, consume=True), model.config)  # as load_checkpoint lays it out


def gguf_tokenizer_folder(gguf_path: Path) -> Path:
    """An HF tokenizer folder (tokenizer.json, tokenizer_config.json) built from the GGUF, cached."""
    folder = cache_folder(gguf_path) / "tokenizer"
    if (folder / "tokenizer.json").is_file():
        return folder
    tok, config = gguf_tokenizer(read_gguf(gguf_path))

    def write(tmp: Path):
        tok.save(str(tmp / "tokenizer.json"))
        (tmp / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")

    if not _write_atomically(folder, write):  # no cache (read-only): a temporary folder will do
        folder = Path(tempfile.mkdtemp(prefix="specjax-tokenizer-"))
        write(folder)
    return folder


def _write_atomically(folder: Path, write) -> bool:
    """write(tmp) into a fresh temporary sibling of `folder`, locked while it is written, then
    rename it to `folder`. False (with a warning) when the cache cannot be written; a concurrent
    writer's copy wins. Temporary siblings left by a killed writer (unlocked) are removed first."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        _remove_abandoned(folder)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
        lock = os.open(tmp, os.O_RDONLY)
    except OSError as e:
        warnings.warn(f"specjax cache not written ({e}); set SPECJAX_CACHE to a writable folder")
        return False
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when this process ends, however it ends
        write(tmp)
        tmp.rename(folder)
    except OSError:
        if not folder.exists():
            raise
    finally:
        os.close(lock)
        shutil.rmtree(tmp, ignore_errors=True)
    return True


def _remove_abandoned(folder: Path, grace_s: float = 2.0) -> None:
    """Remove the temporary siblings of `folder` whose writer is gone: no process holds their
    lock (a writer that was just starting, younger than `grace_s`, is left alone)."""
    for tmp in folder.parent.glob(f".{folder.name}-*"):
        try:
            if time.time() - tmp.stat().st_mtime < grace_s:
                continue
            fd = os.open(tmp, os.O_RDONLY)
        except OSError:  # gone meanwhile
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a live writer holds it
            continue
        finally:
            os.close(fd)
        shutil.rmtree(tmp, ignore_errors=True)
