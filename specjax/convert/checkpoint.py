"""specjax checkpoints: the params pytree in orbax format plus the ModelConfig as JSON."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import jax
import orbax.checkpoint as ocp

from specjax.models import Model, ModelConfig, RopeScaling

CONFIG_FILE = "specjax_config.json"
FORMAT_VERSION = 1


def is_checkpoint(path: str | os.PathLike) -> bool:
    return (Path(path) / CONFIG_FILE).exists()


def save_checkpoint(model: Model, path: str | os.PathLike) -> None:
    """Write `model` to the folder `path` (created; an existing checkpoint there is replaced)."""
    folder = Path(path).absolute()
    folder.mkdir(parents=True, exist_ok=True)
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(folder / "params", model.params, force=True)
    meta = {"format_version": FORMAT_VERSION, "config": dataclasses.asdict(model.config)}
    with open(folder / CONFIG_FILE, "w") as f:
        json.dump(meta, f, indent=2)


def load_checkpoint(path: str | os.PathLike) -> Model:
    """Read a folder written by `save_checkpoint`."""
    folder = Path(path).absolute()
    with open(folder / CONFIG_FILE) as f:
        meta = json.load(f)
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{folder}: unsupported specjax checkpoint version {meta.get('format_version')}")
    cfg = dict(meta["config"])
    if cfg.get("rope_scaling"):
        cfg["rope_scaling"] = RopeScaling(**cfg["rope_scaling"])
    config = ModelConfig(**cfg)
    with ocp.StandardCheckpointer() as ckpt:
        params = ckpt.restore(folder / "params")
    return Model(jax.tree.map(lambda x: x, params), config)
