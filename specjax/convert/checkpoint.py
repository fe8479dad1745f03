"""specjax checkpoints: the params pytree in orbax format plus the ModelConfig as JSON."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from pathlib import Path

import jax
import orbax.checkpoint as ocp

from pallas_kernels import QuantizedWeight
from specjax import sharding
from specjax.models import Model, ModelConfig, RopeScaling, init_params, lm_head_weight
from specjax.layout import kernel_layout, portable_layout
from specjax.quantize import quantize

CONFIG_FILE = "specjax_config.json"
FORMAT_VERSION = 1


def is_checkpoint(path: str | os.PathLike) -> bool:
    return (Path(path) / CONFIG_FILE).exists()


def save_checkpoint(model: Model, path: str | os.PathLike) -> None:
    """Write `model` to the folder `path` (created; an existing checkpoint there is replaced)."""
    folder = Path(path).absolute()
    folder.mkdir(parents=True, exist_ok=True)
    params = portable_layout(model.params)
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(folder / "params", params, force=True)
    meta = {"format_version": FORMAT_VERSION, "config": dataclasses.asdict(model.config),
            "quantization": _quantization(params)}
    with open(folder / CONFIG_FILE, "w") as f:
        json.dump(meta, f, indent=2)


def load_checkpoint(path: str | os.PathLike, mesh=None) -> Model:
    """Read a folder written by `save_checkpoint` (on any mesh), onto `mesh` by the rules of
    `specjax.sharding`, or onto one device."""
    folder = Path(path).absolute()
    with open(folder / CONFIG_FILE) as f:
        meta = json.load(f)
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{folder}: unsupported specjax checkpoint version {meta.get('format_version')}")
    cfg = dict(meta["config"])
    if cfg.get("rope_scaling"):
        cfg["rope_scaling"] = RopeScaling(**cfg["rope_scaling"])
    config = ModelConfig(**cfg)
    shapes = _abstract_params(config, meta.get("quantization"))
    target = None if mesh is None else sharding.shardings(shapes, mesh, head_dim=config.head_dim)
    with ocp.StandardCheckpointer() as ckpt:
        params = ckpt.restore(folder / "params", sharding.abstract(shapes, target))
    return Model(params if mesh is not None else kernel_layout(params, consume=True), config)


def _quantization(params) -> dict | None:
    """{leaf path ("layers/wq"): {"bits": b, "group_size": g, "act_bits": a}} of the quantized
    weights, else None."""
    leaves = jax.tree_util.tree_leaves_with_path(params, is_leaf=lambda x: isinstance(x, QuantizedWeight))
    found = {"/".join(k.key for k in path): {"bits": w.bits, "group_size": w.group_size, "act_bits": w.act_bits}
             for path, w in leaves if isinstance(w, QuantizedWeight)}
    return found or None


def _abstract_params(config: ModelConfig, quantization: dict | None):
    """The structure, shapes and dtypes to restore into (quantized weights keep their class).
    `quantization` is per leaf, or one {"mode", "group_size"} for the whole model (older files)."""
    from pallas_kernels import quantize as quantize_weight

    def build():
        model = Model(init_params(config, jax.random.key(0)), config)
        if quantization and "mode" in quantization:
            return portable_layout(quantize(model, quantization["mode"], quantization["group_size"]).params)
        params = jax.tree.map(lambda x: x, model.params)  # a copy to set leaves in
        for path, q in (quantization or {}).items():
            *parents, leaf = path.split("/")
            node = functools.reduce(dict.__getitem__, parents, params)
            if leaf not in node:  # a tied model's quantized copy of its head
                node[leaf] = lm_head_weight(config, params)
            node[leaf] = dataclasses.replace(quantize_weight(node[leaf], q["bits"], q["group_size"]),
                                             act_bits=q.get("act_bits"))
        return params

    return jax.eval_shape(build)
