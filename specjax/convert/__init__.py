"""Loading and saving models: HF folders, specjax checkpoints, GGUF files, and models by name."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from specjax.convert.checkpoint import CONFIG_FILE, is_checkpoint, load_checkpoint, save_checkpoint
from specjax.convert.gguf import load_gguf
from specjax.convert.gguf_cache import gguf_tokenizer_folder, load_cached_gguf
from specjax.convert.hf import load_hf, save_hf
from specjax.convert.model_paths import resolve
from specjax.layout import kernel_layout
from specjax.models import Model
from specjax.sharding import shard


def load(path: str | os.PathLike, dtype: str | None = None, mesh=None) -> Model:
    """Load an HF folder, a specjax checkpoint, a .gguf file (converted once, then read from the
    user cache: see `specjax.convert.gguf_cache`), or a model by name ('tiny', 'smollm2'); with a
    `mesh` (jax.sharding.Mesh, axes 'data'/'model'), laid out on it as `sj.shard` does (a
    specjax checkpoint is read straight into its shards)."""
    found = resolve(path)
    if is_checkpoint(found):
        return load_checkpoint(found, mesh)
    if found.suffix == ".gguf":
        model = load_cached_gguf(found, dtype)  # in the kernels' layout, as a checkpoint loads
    else:
        model = load_hf(found, dtype=dtype)
        if mesh is None:
            return Model(kernel_layout(model.params, consume=True), model.config)
    return model if mesh is None else shard(model, mesh)


def save(model: Model, path: str | os.PathLike, format: str = "specjax", *,
         tokenizer: str | os.PathLike | None = None, overwrite: bool = False) -> None:
    """Save as a specjax (orbax) checkpoint, or with format='hf' as an HF folder. `tokenizer`: a
    model folder or shipped name whose tokenizer files (TOKENIZER_FILES) are copied alongside.
    An existing `path` is an error unless `overwrite=True`, which replaces a model folder."""
    if format not in ("specjax", "hf"):
        raise ValueError(f"unknown format {format!r}; use 'specjax' or 'hf'")
    folder = Path(path)
    source = None if tokenizer is None else resolve(tokenizer)
    if source is not None and source.suffix == ".gguf":  # its tokenizer, as converted into the cache
        source = gguf_tokenizer_folder(source)
    extra = {n: (source / n).read_bytes() for n in TOKENIZER_FILES if source and (source / n).is_file()}
    _clear(folder, overwrite)  # after reading: the source may be the folder replaced
    (save_checkpoint if format == "specjax" else save_hf)(model, folder)
    for name, data in extra.items():
        (folder / name).write_bytes(data)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json")


def _clear(folder: Path, overwrite: bool) -> None:
    """Make way for a new model at `folder`: absent or an empty folder, or with `overwrite` a
    model folder (or file), removed; anything else is left alone and is an error."""
    if not folder.exists() or (folder.is_dir() and not any(folder.iterdir())):
        return
    if not overwrite:
        raise FileExistsError(f"{folder} exists; pass overwrite=True (--force) to replace it")
    if not folder.is_dir():
        folder.unlink()
    elif (folder / "config.json").is_file() or is_checkpoint(folder):
        shutil.rmtree(folder)
    else:
        raise FileExistsError(f"{folder} is not a model folder (no config.json or {CONFIG_FILE}); "
                              f"not replacing it")


__all__ = ["load", "save", "load_hf", "save_hf", "load_gguf", "resolve"]
