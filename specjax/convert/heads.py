"""Draft-head checkpoints: the specjax format (a folder with `head.json` — kind, shapes,
settings — and `head.safetensors`) and the published layouts the head drafters also read:
Medusa's `medusa_lm_head.safetensors` and EAGLE-1 / EAGLE-3 folders (`config.json` +
`model.safetensors`). Pickles (`.pt`/`.bin`/`.pth`) only with `allow_pickle=True`. A shipped
target's name ('tiny', 'smollm2') names the heads shipped for it (`specjax/assets/<name>-<kind>`),
and a head records the shape of the target it was trained for (`target` in head.json).

`read_medusa`, `read_eagle`, `read_clover` and `read_guesses` read a checkpoint into (params,
[config,] stored settings): the drafters' `load` classmethods build themselves from those."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specjax.convert.model_paths import ASSETS
from specjax.heads import eagle as eagle_head
from specjax.heads.clover import CloverConfig
from specjax.heads.eagle import EagleConfig
from specjax.models import Model

HEAD_JSON, HEAD_WEIGHTS = "head.json", "head.safetensors"
PICKLES = (".pt", ".bin", ".pth")


# ---- the specjax format --------------------------------------------------------------------------

def flatten(params: dict, prefix: str = "") -> dict:
    """Nested params -> {"a.b.c": numpy array}."""
    out = {}
    for k, v in params.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = np.asarray(v)
    return out


def unflatten(flat: dict) -> dict:
    """{"a.b.c": array} -> nested params of jax arrays."""
    out: dict = {}
    for k, v in flat.items():
        *path, leaf = k.split(".")
        d = out
        for p in path:
            d = d.setdefault(p, {})
        d[leaf] = jnp.asarray(v)
    return out


def save_head(folder, kind: str, params: dict, meta: dict) -> None:
    """Write a head in the specjax format: head.json ({"kind": kind, **meta}) + head.safetensors."""
    from safetensors.numpy import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    flat = {k: np.ascontiguousarray(v) for k, v in flatten(params).items()}
    save_file(flat, str(folder / HEAD_WEIGHTS))
    (folder / HEAD_JSON).write_text(json.dumps({"kind": kind, **meta}, indent=2) + "\n")


def cast_head(folder, dtype: str) -> None:
    """Store a head folder's floating tensors as `dtype` ('bfloat16', 'float16': half the bytes,
    for shipping); they load as float32 again (`read_tensors`)."""
    import ml_dtypes
    from safetensors.numpy import load_file, save_file

    path = Path(folder) / HEAD_WEIGHTS
    to = np.dtype(getattr(ml_dtypes, dtype, None) or dtype)
    flat = {k: v.astype(to) if v.dtype.kind == "f" or v.dtype.name == "bfloat16" else v
            for k, v in load_file(str(path)).items()}
    save_file(flat, str(path))


def is_head_folder(path: Path) -> bool:
    """Whether `path` is a specjax-format head folder."""
    return path.is_dir() and (path / HEAD_JSON).is_file()


def read_head(folder: Path, kind: str, what: str) -> tuple[dict, dict]:
    """(params, settings) of the specjax-format head of `kind` in `folder` (`what` names it in
    errors): head.json less its `kind` and `target` records."""
    if not is_head_folder(folder):
        raise FileNotFoundError(f"{folder}: not a {what} head folder (no {HEAD_JSON}; a head folder "
                                f"holds {HEAD_JSON} and {HEAD_WEIGHTS})")
    meta = json.loads((folder / HEAD_JSON).read_text())
    if meta.get("kind") != kind:
        raise ValueError(f"{folder} holds a {meta.get('kind')!r} head, not {what}")
    settings = {k: v for k, v in meta.items() if k not in ("kind", "target")}
    return unflatten(read_tensors(folder / HEAD_WEIGHTS, False)), settings


def accuracy_table(meta: dict) -> tuple | None:
    """A saved per-depth per-rank accuracy table as nested tuples (None when absent)."""
    return tuple(map(tuple, meta["accuracy"])) if meta.get("accuracy") else None


def shipped_heads(kind: str) -> dict[str, Path]:
    """The heads of `kind` shipped with specjax, by target name (`specjax/assets/<name>-<kind>`)."""
    return {d.name[: -len(kind) - 1]: d for d in sorted(ASSETS.glob(f"*-{kind}")) if d.is_dir()}


def resolve_head(path: str | os.PathLike, kind: str) -> Path:
    """A shipped target's name ('tiny', 'smollm2') -> its shipped head of `kind`; an existing
    file or folder -> itself."""
    shipped = shipped_heads(kind)
    if isinstance(path, str) and "/" not in path and not Path(path).exists() and path in shipped:
        if not (shipped[path] / HEAD_JSON).is_file():
            raise FileNotFoundError(f"the shipped heads {shipped[path]} are not there (not built yet? see "
                                    f"recipes/README.md)")
        return shipped[path]
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no head checkpoint at {str(path)!r} (shipped {kind} heads: {sorted(shipped)})")
    return p


def target_signature(config) -> dict:
    """What a head records of the target it was trained for (its shape, not its weights)."""
    return {k: getattr(config, k) for k in ("model_type", "vocab_size", "hidden_size", "intermediate_size",
                                           "num_layers", "num_heads", "num_kv_heads")}


def shipped_target(config, kind: str) -> str:
    """The name of the shipped target whose `kind` head was trained for a target of this shape."""
    want = target_signature(config)
    for name, folder in shipped_heads(kind).items():
        meta = folder / HEAD_JSON  # a folder without it is not built (resolve_head says so)
        if meta.is_file() and json.loads(meta.read_text()).get("target") == want:
            return name
    raise ValueError(f"no {kind} head is shipped for this target ({want})")


# ---- reading a head ------------------------------------------------------------------------------

def read_medusa(path, allow_pickle: bool = False) -> tuple[dict, dict]:
    """(params, stored settings) of a specjax Medusa folder, 'tiny', or Medusa's published
    `medusa_lm_head.safetensors` (a file or a folder holding it; head count and layers inferred
    from the keys)."""
    p = resolve_head(path, "medusa")
    if is_head_folder(p):
        params, meta = read_head(p, "medusa", "Medusa")
        return params, dict(num_layers=meta.get("num_layers", 1), tree_size=meta.get("tree_size", 16),
                            accuracy=accuracy_table(meta))
    if p.is_dir():
        p = pick(p, ("medusa_lm_head.safetensors", "model.safetensors", "medusa_lm_head.pt"), allow_pickle)
    params, layers = medusa_from_state_dict(read_tensors(p, allow_pickle))
    return params, {"num_layers": layers}


def read_eagle(path, target: Model | None = None, target_layers=None,
               allow_pickle: bool = False) -> tuple[dict, EagleConfig, dict]:
    """(params, config, stored settings) of a specjax EAGLE folder, 'tiny', or a published
    EAGLE-1 / EAGLE-3 folder (`config.json` + `model.safetensors`, or `pytorch_model.bin` with
    allow_pickle=True), which stores no settings. EAGLE-3 checkpoints do not record which target
    layers they fuse: `target_layers`, else the `target`'s default taps."""
    p = resolve_head(path, "eagle")
    if is_head_folder(p):
        params, meta = read_head(p, "eagle", "EAGLE")
        keys = ("top_k", "depth", "total_tokens", "min_prob", "verify_sizes", "tree", "weights")
        stored = {k: meta[k] for k in keys if k in meta}
        return params, EagleConfig.from_dict(meta["config"]), stored
    folder = p if p.is_dir() else p.parent
    file = pick(p, ("model.safetensors", "pytorch_model.bin"), allow_pickle) if p.is_dir() else p
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder}: a published EAGLE head needs its config.json")
    hf = json.loads((folder / "config.json").read_text())
    params, cfg = eagle_from_state_dict(read_tensors(file, allow_pickle), hf, target, target_layers)
    return params, cfg, {}


def read_clover(path) -> tuple[dict, CloverConfig, dict]:
    """(params, config, stored settings) of a specjax Clover folder or 'tiny'."""
    params, meta = read_head(resolve_head(path, "clover"), "clover", "Clover")
    stored = {"tree_size": meta.get("tree_size", 16), "accuracy": accuracy_table(meta)}
    return params, CloverConfig.from_dict(meta["config"]), stored


def read_guesses(path, kind: str) -> tuple[dict, dict]:
    """(params, stored settings) of a specjax PPD or Hidden Transfer folder (`kind` "ppd" or
    "hidden-transfer") or 'tiny'."""
    params, meta = read_head(resolve_head(path, kind), kind, kind)
    return params, {**meta, "accuracy": accuracy_table(meta)}


# ---- tensors -------------------------------------------------------------------------------------

def read_tensors(path: Path, allow_pickle: bool) -> dict:
    """{name: float32/int numpy array} from a safetensors file, or a torch pickle if allowed
    (float16/bfloat16 heads, stored small, are cast to float32: the CPU's fast path)."""
    if path.suffix == ".safetensors":
        from safetensors.numpy import load_file
        try:
            return {k: v.astype(np.float32) if v.dtype.name in ("float16", "bfloat16") else v
                    for k, v in load_file(str(path)).items()}
        except Exception:  # an older safetensors without bfloat16 in numpy: read through torch
            from safetensors.torch import load_file as load_torch
            return {k: v.float().numpy() if v.is_floating_point() else v.numpy()
                    for k, v in load_torch(str(path)).items()}
    if path.suffix in PICKLES:
        if not allow_pickle:
            raise ValueError(f"{path} is a pickle, which can run arbitrary code when loaded; pass "
                             f"allow_pickle=True if you trust it (or convert it to safetensors)")
        import torch
        sd = torch.load(str(path), map_location="cpu", weights_only=False)
        return {k: v.float().numpy() if v.is_floating_point() else v.numpy() for k, v in sd.items()}
    raise ValueError(f"{path}: unknown checkpoint format (expected .safetensors, or .pt/.bin with "
                     f"allow_pickle=True)")


def pick(folder: Path, names: tuple[str, ...], allow_pickle: bool) -> Path:
    """The first of `names` in `folder`; pickles only with `allow_pickle` (a folder holding only
    a pickle is an error that says how to opt in)."""
    skipped = []
    for n in names:
        if (folder / n).is_file():
            if Path(n).suffix in PICKLES and not allow_pickle:
                skipped.append(n)
                continue
            return folder / n
    if skipped:
        read_tensors(folder / skipped[0], allow_pickle)  # raises: a pickle, not allowed
    raise FileNotFoundError(f"{folder}: no head checkpoint found (looked for {HEAD_JSON} and "
                            f"{', '.join(names)})")


def _require(sd: dict, keys, what: str) -> None:
    missing = [k for k in keys if k not in sd]
    if missing:
        raise KeyError(f"{what} checkpoint is missing key(s): {', '.join(missing)}")


# ---- published layouts ---------------------------------------------------------------------------

def medusa_from_state_dict(sd: dict) -> tuple[dict, int]:
    """Medusa's published keys `{i}.{j}.linear.weight/bias` (j < L) and `{i}.{L}.weight` (torch
    [out, in]) -> (params, L)."""
    heads = sorted({int(m.group(1)) for k in sd if (m := re.match(r"(\d+)\.\d+\.", k))})
    if not heads:
        raise KeyError(f"no Medusa head keys ('{{i}}.0.linear.weight', ...) among: {sorted(sd)[:8]}")
    layers = len({int(m.group(1)) for k in sd if (m := re.match(r"0\.(\d+)\.linear\.weight$", k))})
    if layers == 0:
        raise KeyError("Medusa checkpoint is missing key(s): 0.0.linear.weight")
    k = max(heads) + 1
    need = [f"{i}.{j}.linear.{w}" for i in range(k) for j in range(layers) for w in ("weight", "bias")]
    need += [f"{i}.{layers}.weight" for i in range(k)]
    _require(sd, need, "Medusa")
    w1, b1, w2 = [], [], []
    for i in range(k):
        for j in range(1, layers):
            if not np.array_equal(sd[f"{i}.{j}.linear.weight"], sd[f"{i}.0.linear.weight"]):
                raise ValueError("Medusa ResBlocks with distinct weights per layer are not supported "
                                 "(Medusa's own heads share one ResBlock across layers)")
        w1.append(np.asarray(sd[f"{i}.0.linear.weight"], np.float32).T)
        b1.append(np.asarray(sd[f"{i}.0.linear.bias"], np.float32))
        w2.append(np.asarray(sd[f"{i}.{layers}.weight"], np.float32).T)
    e = w1[0].shape[0]
    for i in range(k):
        if w1[i].shape != (e, e) or b1[i].shape != (e,) or w2[i].shape[0] != e or w2[i].shape != w2[0].shape:
            raise ValueError(f"Medusa head {i} has inconsistent shapes: linear {w1[i].shape[::-1]}, "
                             f"bias {b1[i].shape}, lm head {w2[i].shape[::-1]} (hidden size {e})")
    return {"w1": jnp.asarray(np.stack(w1)), "b1": jnp.asarray(np.stack(b1)),
            "w2": jnp.asarray(np.stack(w2))}, layers



_EAGLE_MATMULS = tuple(name for name, p in eagle_head.LAYER.items() if p.matmul)


def eagle_from_state_dict(sd: dict, hf: dict, target: Model | None = None,
                          target_layers=None) -> tuple[dict, EagleConfig]:
    """EAGLE-1 keys (`fc.weight`, `fc.bias`, `layers.0.*` without input_layernorm,
    `embed_tokens.weight`) or EAGLE-3 keys (`fc.weight`, `midlayer.*`, `norm.weight`,
    `lm_head.weight`, optional `d2t` offsets) + the head's HF config -> (params, EagleConfig).
    Tensor names are the declared `hf` names of `specjax.heads.eagle.PARAMS`."""
    version = 3 if any(k.startswith("midlayer.") for k in sd) else 1
    pre = "midlayer." if version == 3 else "layers.0."
    top = {name: p.hf for name, p in eagle_head.PARAMS.items() if name != "layer"}
    names = {name: pre + p.hf for name, p in eagle_head.LAYER.items()}  # the layer's
    need = [top["fc_w"], *(names[n] for n in _EAGLE_MATMULS), names["mlp_norm"]]
    need += [top["fc_b"]] if version == 1 else [names["attn_norm"], names["hidden_norm"], top["norm"],
                                                  top["lm_head"]]
    _require(sd, need, f"EAGLE-{version}")
    f32 = lambda k: np.asarray(sd[k], np.float32)
    e = f32(top["fc_w"]).shape[0]
    heads = hf.get("num_attention_heads")
    if heads is None:
        raise KeyError("the EAGLE config.json has no num_attention_heads")
    hd = hf.get("head_dim") or e // heads
    vocab = int(hf.get("vocab_size", sd.get("embed_tokens.weight", np.zeros((0, 0))).shape[0]))
    if version == 3:
        layers = target_layers
        if layers is None and target is not None:
            layers = EagleConfig.for_target(target.config, 3).target_layers
        if layers is None:
            raise ValueError("EAGLE-3 checkpoints do not say which target layers they fuse: pass "
                             "target_layers=(low, mid, high) or target=... to Eagle.load")
    else:
        layers = ()
    cfg = EagleConfig(version=version, hidden_size=e, intermediate_size=f32(names["w_gate"]).shape[0],
                      num_heads=heads, num_kv_heads=hf.get("num_key_value_heads") or heads, head_dim=hd,
                      vocab_size=vocab, draft_vocab_size=hf.get("draft_vocab_size") or None,
                      target_hidden_size=hf.get("target_hidden_size") or None, target_layers=tuple(layers),
                      rope_theta=float(hf.get("rope_theta", 10000.0)), rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
                      max_position_embeddings=int(hf.get("max_position_embeddings", 2048)))
    want = eagle_head.param_shapes(cfg)
    if f32(top["fc_w"]).shape != want["fc_w"][::-1]:
        raise ValueError(f"EAGLE-{version} fc.weight has shape {f32(top['fc_w']).shape}, expected "
                         f"{want['fc_w'][::-1]} (hidden size {e}, target hidden size {cfg.target_hidden_size})")
    layer = {name: f32(names[name]).T for name in _EAGLE_MATMULS}  # torch [out, in] -> [in, out]
    for name in _EAGLE_MATMULS:
        if layer[name].shape != want["layer"][name]:
            raise ValueError(f"EAGLE-{version} {names[name]} has shape {layer[name].shape[::-1]}, expected "
                             f"{want['layer'][name][::-1]} for hidden size {e}")
    layer["mlp_norm"] = f32(names["mlp_norm"])
    params = {"fc_w": f32(top["fc_w"]).T, "layer": layer}
    if version == 1:
        params["fc_b"] = f32(top["fc_b"])
    else:
        layer["attn_norm"] = f32(names["attn_norm"])
        layer["hidden_norm"] = f32(names["hidden_norm"])
        params["norm"] = f32(top["norm"])
        params["lm_head"] = f32(top["lm_head"]).T
        if params["lm_head"].shape != want["lm_head"]:
            raise ValueError(f"EAGLE-3 lm_head.weight has shape {params['lm_head'].shape[::-1]}, expected "
                             f"{want['lm_head'][::-1]}")
        if "d2t" in sd:
            ids = np.arange(cfg.draft_vocab_size) + np.asarray(sd["d2t"], np.int64)
            if cfg.draft_vocab_size != cfg.vocab_size or np.any(ids != np.arange(cfg.vocab_size)):
                if ids.min() < 0 or ids.max() >= cfg.vocab_size:
                    raise ValueError(f"d2t maps draft ids outside the target vocabulary [0, {cfg.vocab_size})")
                params["d2t"] = ids.astype(np.int32)
        elif cfg.draft_vocab_size != cfg.vocab_size:
            raise KeyError(f"EAGLE-3 checkpoint is missing key(s): d2t (draft vocabulary "
                           f"{cfg.draft_vocab_size} != target vocabulary {cfg.vocab_size})")
    if "embed_tokens.weight" in sd:
        emb = f32("embed_tokens.weight")
        if emb.shape != (vocab, e):
            raise ValueError(f"embed_tokens.weight has shape {emb.shape}, expected {(vocab, e)}")
        params["embed"] = emb
    return jax.tree.map(jnp.asarray, params), cfg
