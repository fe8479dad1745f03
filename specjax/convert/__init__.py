"""Loading and saving models: HF folders, specjax checkpoints, and the shipped assets by name."""

from __future__ import annotations

import os
from pathlib import Path

from specjax.convert.checkpoint import is_checkpoint, load_checkpoint, save_checkpoint
from specjax.convert.hf import load_hf, save_hf
from specjax.models import Model
from specjax.sharding import shard

ASSETS = Path(__file__).resolve().parent.parent / "assets"


def resolve(path: str | os.PathLike) -> Path:
    """A shipped model name ('tiny', 'tiny-draft') or a folder -> the folder."""
    p = Path(path)
    if not p.exists() and isinstance(path, str) and (ASSETS / path).is_dir():
        return ASSETS / path
    if not p.exists():
        shipped = sorted(d.name for d in ASSETS.iterdir() if d.is_dir()) if ASSETS.is_dir() else []
        raise FileNotFoundError(f"no model at {str(path)!r}: not a folder, nor a shipped model {shipped}")
    if not p.is_dir():
        raise NotADirectoryError(f"{path}: a model is a folder (HF config.json + safetensors, "
                                 f"or a specjax checkpoint)")
    return p


def load(path: str | os.PathLike, dtype: str | None = None, mesh=None) -> Model:
    """Load an HF folder, a specjax checkpoint, or a shipped model by name ('tiny'); with a
    `mesh` (jax.sharding.Mesh, axes 'data'/'model'), laid out on it as `sj.shard` does (a
    specjax checkpoint is read straight into its shards)."""
    folder = resolve(path)
    if is_checkpoint(folder):
        return load_checkpoint(folder, mesh)
    model = load_hf(folder, dtype=dtype)
    return model if mesh is None else shard(model, mesh)


def save(model: Model, path: str | os.PathLike, format: str = "specjax") -> None:
    """Save as a specjax (orbax) checkpoint, or with format='hf' as an HF folder."""
    if format == "specjax":
        save_checkpoint(model, path)
    elif format == "hf":
        save_hf(model, path)
    else:
        raise ValueError(f"unknown format {format!r}; use 'specjax' or 'hf'")


__all__ = ["load", "save", "load_hf", "save_hf", "resolve"]
