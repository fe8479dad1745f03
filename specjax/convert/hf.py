"""Hugging Face safetensors folders <-> specjax Model (Llama, Mistral, Qwen2/2.5, Qwen3, Gemma
1/2/3; of Gemma3ForConditionalGeneration the language model, its vision tower left out; the
masked-diffusion LMs LLaDA and Dream)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.flax import save_file

from pallas_kernels import QuantizedWeight
from specjax.layout import portable_layout
from specjax.models import Model, ModelConfig, param_shapes
from specjax.models.params import LAYER, LLAMA, Param
from specjax.quantize import is_quantized

# Tensor names are the declared `hf` names (specjax.models.params): per layer under
# model.layers.N; LLaDA's are OLMo's (below). Linear weights (`matmul`) are torch [out, in]; ours
# [in, out].
_IGNORED = re.compile(r".*rotary_emb\.inv_freq$|(model\.)?(vision_tower|multi_modal_projector)\..*")
# the language model inside Gemma3ForConditionalGeneration, as transformers 5 and 4 name it
_LANGUAGE_MODEL = re.compile(r"model\.language_model\.|language_model\.model\.")
_TOP = {p.hf: (name, p) for name, p in LLAMA.items() if isinstance(p, Param)}
# LLaDA (modeling_llada.py's LLaDAModel with LLaDALlamaBlocks): specjax name -> its tensor name,
# per layer under model.transformer.blocks.N; ff_proj is the gate, ff_out the down projection
_LLADA_TOP = {"embed": "model.transformer.wte.weight", "norm": "model.transformer.ln_f.weight",
              "lm_head": "model.transformer.ff_out.weight"}
_LLADA_LAYER = {"attn_norm": "attn_norm.weight", "wq": "q_proj.weight", "wk": "k_proj.weight",
                "wv": "v_proj.weight", "wo": "attn_out.weight", "mlp_norm": "ff_norm.weight",
                "w_gate": "ff_proj.weight", "w_up": "up_proj.weight", "w_down": "ff_out.weight"}


class _Names(NamedTuple):
    """A family's tensor names: top-level and per-layer (under `prefix`N.) HF name -> (specjax
    name, declaration), of the params `config` has (a tied model's head among the top ones)."""

    top: dict[str, tuple[str, Param]]
    layer: dict[str, tuple[str, Param]]
    prefix: str


def _names(config: ModelConfig) -> _Names:
    layer = {name: p for name, p in LAYER.items() if p.present(config)}
    if config.model_type == "llada":
        return _Names({_LLADA_TOP[name]: (name, p) for name, p in LLAMA.items() if isinstance(p, Param)},
                      {_LLADA_LAYER[name]: (name, p) for name, p in layer.items()}, "model.transformer.blocks.")
    return _Names(_TOP, {p.hf_name(config): (name, p) for name, p in layer.items()}, "model.layers.")


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        files = sorted({folder / name for name in weight_map.values()})
    elif (folder / "model.safetensors").exists():
        files = [folder / "model.safetensors"]
    else:
        found = sorted(p.name for p in folder.glob("*.safetensors"))
        if not found:
            pickles = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt"))
            hint = f" (found pickle files {pickles}; convert them to safetensors first)" if pickles else ""
            raise FileNotFoundError(f"{folder}: no model.safetensors or model.safetensors.index.json{hint}")
        files = [folder / n for n in found]
    missing = [str(p) for p in files if not p.exists()]
    if missing:
        raise FileNotFoundError(f"{folder}: weight files listed in the index are missing: {missing}")
    return files


def load_hf(path: str | os.PathLike, dtype: str | None = None) -> Model:
    """Read an HF folder (config.json + model.safetensors or a sharded index) into a Model.

    Every tensor's shape is checked; missing and unexpected tensors are errors that name them.
    """
    folder = Path(path)
    if not (folder / "config.json").exists():
        raise FileNotFoundError(f"{folder}: no config.json (not a Hugging Face model folder)")
    config = ModelConfig.from_json_file(folder / "config.json", dtype=dtype)
    shapes = param_shapes(config)
    names = _names(config)
    layer_re = re.compile(re.escape(names.prefix) + r"(\d+)\.(.+)")
    per_layer: dict[str, list] = {name: [None] * config.num_layers for name, _ in names.layer.values()}
    top: dict[str, np.ndarray] = {}
    unexpected = []
    for file in _weight_files(folder):
        with _open(file) as f:
            for key in f.keys():
                if _IGNORED.fullmatch(key):
                    continue
                plain = _LANGUAGE_MODEL.sub("model.", key, count=1)
                m = layer_re.fullmatch(plain)
                if m and m.group(2) in names.layer and int(m.group(1)) < config.num_layers:
                    name, p = names.layer[m.group(2)]
                    want = shapes["layers"][name][1:]
                    per_layer[name][int(m.group(1))] = _checked(f.get_tensor(key), key, want, p.matmul)
                elif plain in names.top:
                    name, p = names.top[plain]
                    if not p.present(config):
                        continue  # a tied model's lm_head: the head is the embedding
                    top[name] = _checked(f.get_tensor(key), key, shapes[name], p.matmul)
                else:
                    unexpected.append(key)
    missing = [f"{names.prefix}{i}.{hf}" for hf, (n, _) in names.layer.items()
               for i, w in enumerate(per_layer[n]) if w is None]
    missing += [hf for hf, (n, p) in names.top.items() if p.present(config) and n not in top]
    if missing or unexpected:
        raise ValueError(f"{folder}: checkpoint does not match config.json "
                         f"(missing tensors: {missing[:8]}{' ...' if len(missing) > 8 else ''}; "
                         f"unexpected tensors: {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''})")
    dt = config.jnp_dtype
    params = {k: v.astype(dt) for k, v in top.items()}
    params["layers"] = {n: jnp.stack(ws).astype(dt) for n, ws in per_layer.items()}
    return Model(params, config)


def _open(file: Path):
    """safe_open, with a truncated or corrupt file named in a ValueError."""
    try:
        return safe_open(file, framework="flax")
    except SafetensorError as e:
        raise ValueError(f"{file}: not a readable safetensors file ({e})") from None


def _checked(t, key, want, transpose):
    t = t.T if transpose else t
    if tuple(t.shape) != tuple(want):
        raise ValueError(f"tensor {key}: expected shape {tuple(want)} (after transpose: {transpose}), "
                         f"got {tuple(t.shape)}")
    return t


def save_hf(model: Model, path: str | os.PathLike) -> None:
    """Write an HF folder (config.json + model.safetensors) that transformers loads."""
    config, params = model.config, portable_layout(model.params)
    if is_quantized(model) or isinstance(params.get("lm_head"), QuantizedWeight):
        raise ValueError("cannot write a quantized model in HF format; save it with format='specjax'")
    hf_config = config.to_hf()  # first: it refuses a config its family's config.json cannot express
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    names, tensors = _names(config), {}
    for key, (name, p) in names.top.items():
        if name in params:
            tensors[key] = params[name].T if p.matmul else params[name]
    for hf_name, (name, p) in names.layer.items():
        for i in range(config.num_layers):
            w = params["layers"][name][i]
            tensors[f"{names.prefix}{i}.{hf_name}"] = w.T if p.matmul else w
    weights = folder / "model.safetensors"
    save_file({k: jnp.asarray(v) for k, v in tensors.items()}, str(weights), metadata={"format": "pt"})
    weights.chmod(0o644)  # safetensors writes 0600; a model folder is meant to be shared
    with open(folder / "config.json", "w") as f:
        json.dump(hf_config, f, indent=2)
