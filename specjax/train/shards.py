"""Resumable shards on disk. A run folder holds `meta.json` (the settings, checked when a run
resumes) and one folder of `.npy` arrays per shard, written under a temporary name and renamed
when complete: a kill loses at most the shard in progress, and a rerun skips finished ones.
Ragged sequences are stored packed: one flat array and `offsets` [n + 1]."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np


def open_run(folder: str | Path, meta: dict) -> Path:
    """Create `folder` with `meta`, or check that an existing run there has the same meta."""
    folder = Path(folder)
    path = folder / "meta.json"
    meta = json.loads(json.dumps(meta))  # as it reads back (tuples become lists)
    if path.is_file():
        old = json.loads(path.read_text())
        diff = sorted(k for k in set(old) | set(meta) if old.get(k) != meta.get(k))
        if diff:
            k = diff[0]
            raise ValueError(f"{folder} holds a run with other settings ({k}: {old.get(k)!r} there, "
                             f"{meta.get(k)!r} now); use another folder")
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(meta, indent=2) + "\n")
    return folder


def shard_path(folder: str | Path, index: int) -> Path:
    return Path(folder) / f"{index:05d}"


def is_done(folder: str | Path, index: int) -> bool:
    return shard_path(folder, index).is_dir()


def write_shard(folder: str | Path, index: int, arrays: dict) -> None:
    """Write the arrays as one shard, atomically (a stale partial write is replaced)."""
    final = shard_path(folder, index)
    tmp = final.with_name(f".{final.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, array in arrays.items():
        np.save(tmp / f"{name}.npy", np.asarray(array))
    os.replace(tmp, final)


def read_shard(folder: str | Path, index: int, mmap: bool = True) -> dict:
    """A finished shard's arrays (memory-mapped by default)."""
    path = shard_path(folder, index)
    if not path.is_dir():
        raise FileNotFoundError(f"shard {path} is not finished")
    return {f.stem: np.load(f, mmap_mode="r" if mmap else None) for f in sorted(path.glob("*.npy"))}


def finished(folder: str | Path) -> list[int]:
    """Indices of the finished shards, ascending."""
    folder = Path(folder)
    return sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit()) if folder.is_dir() else []


def pack(seqs: list) -> tuple[np.ndarray, np.ndarray]:
    """Sequences of arrays -> (their concatenation, offsets int64[n + 1])."""
    offsets = np.zeros(len(seqs) + 1, np.int64)
    offsets[1:] = np.cumsum([len(s) for s in seqs])
    return np.concatenate([np.asarray(s) for s in seqs]), offsets


def unpack(flat: np.ndarray, offsets: np.ndarray, i: int) -> np.ndarray:
    """Sequence i of a packed array."""
    return flat[offsets[i]: offsets[i + 1]]
