"""GGUF files (llama.cpp) -> specjax Model: the llama, qwen2, qwen3, gemma, gemma2 and gemma3 arches.

Q8_0 and Q4_0 matmul weights load straight into int8 / int4 QuantizedWeight (group size 32, the
block's one scale per 32 input weights); every other quantized type is dequantized to `dtype`.
The token embedding is gathered, not multiplied, so it is always dequantized; a model with tied
embeddings also keeps a Q8_0 / Q4_0 embedding as a QuantizedWeight `lm_head` for the head's
matmul (as llama.cpp reads it). llama.cpp stores
Gemma's norm weights with the 1 of its (1 + w) scale added: it is taken off again here.
"""

from __future__ import annotations

import os

import gguf
import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import QuantizedWeight, kernel_layout
from specjax.convert import gguf_file
from specjax.convert.gguf_file import GGUFFile
from specjax.models import Model, ModelConfig, RopeScaling, param_shapes
from specjax.models.config import GEMMA, gemma_layer_types
from specjax.models.params import LAYER, LLAMA, Param

Q = gguf.GGMLQuantizationType
ARCHITECTURES = ("llama", "qwen2", "qwen3", *GEMMA)  # GGUF general.architecture == specjax model_type
DIRECT_TYPES = {Q.Q8_0: 8, Q.Q4_0: 4}  # types read into QuantizedWeight bits without dequantizing
# Tensor names are the declared `gguf` names (specjax.models.params): per layer under blk.N.
_LAYER_TENSORS = {p.gguf: name for name, p in LAYER.items()}
_TOP_TENSORS = {p.gguf: name for name, p in LLAMA.items() if isinstance(p, Param)}


def read_gguf(path: str | os.PathLike) -> GGUFFile:
    """Open a GGUF file (memory-mapped), with one-line errors for a wrong or truncated file."""
    try:
        return gguf_file.read(path)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def metadata(reader: GGUFFile, key: str, default=None):
    """The value of metadata `key` (a list for an array), or `default`."""
    return reader.fields.get(key, default)


def gguf_config(reader: GGUFFile, dtype: str | None = None) -> ModelConfig:
    """The ModelConfig a GGUF's `<arch>.*` metadata and tensor list describe."""
    arch = metadata(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"unsupported GGUF architecture {arch!r}; supported: {', '.join(ARCHITECTURES)}")
    names = {t.name for t in reader.tensors}

    def key(name, default=None):
        value = metadata(reader, f"{arch}.{name}", default)
        if value is None:
            raise ValueError(f"GGUF metadata lacks {arch}.{name}")
        return value

    num_heads = key("attention.head_count")
    hidden = key("embedding_length")
    head_dim = key("attention.key_length", hidden // num_heads)
    vocab = (metadata(reader, f"{arch}.vocab_size") or len(metadata(reader, "tokenizer.ggml.tokens", ()))
             or _tensor_rows(reader, "token_embd.weight"))
    num_layers = key("block_count")
    gemma = _gemma_fields(reader, arch, num_layers, hidden // num_heads, head_dim) if arch in GEMMA else {}
    return ModelConfig(
        model_type=arch,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=key("feed_forward_length"),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=key("attention.head_count_kv", num_heads),
        head_dim=head_dim,
        max_position_embeddings=key("context_length", 2048),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        rope_scaling=_rope_scaling(reader, arch, head_dim),
        rms_norm_eps=float(str(np.float32(key("attention.layer_norm_rms_epsilon")))),  # 1e-5, not 9.99e-6
        tie_word_embeddings="output.weight" not in names,
        attention_bias=arch == "qwen2",
        qk_norm=arch in ("qwen3", "gemma3"),
        dtype=dtype or "float32",
        bos_token_id=metadata(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=metadata(reader, "tokenizer.ggml.eos_token_id"),
        **gemma,
    )


def _gemma_fields(reader, arch: str, num_layers: int, hidden_per_head: int, head_dim: int) -> dict:
    """The Gemma fields of ModelConfig, as llama.cpp writes or hard-codes them: Gemma 2/3's
    window and local/global pattern, Gemma 3's local RoPE base (`rope.freq_base_swa`, else
    llama.cpp's 10000), soft-caps, and the attention scale: 1/sqrt(head_dim), 1/sqrt(hidden /
    heads) for the 27B models (46 layers in Gemma 2, 62 in Gemma 3)."""
    fields = dict(hidden_act="gelu_pytorch_tanh", norm_offset=1.0, scale_embeddings=True)
    if arch == "gemma":
        return fields
    big = num_layers == {"gemma2": 46, "gemma3": 62}[arch]
    window = metadata(reader, f"{arch}.attention.sliding_window")
    pattern = metadata(reader, f"{arch}.attention.sliding_window_pattern")
    caps = {name: metadata(reader, f"{arch}.{name}") for name in ("attn_logit_softcapping",
                                                                  "final_logit_softcapping")}
    fields.update(sandwich_norms=True, query_pre_attn_scalar=hidden_per_head if big else head_dim,
                  **{name: None if cap is None else float(str(np.float32(cap))) for name, cap in caps.items()})
    if window is not None:
        fields.update(sliding_window=int(window), layer_types=gemma_layer_types(arch, num_layers, pattern))
    if arch == "gemma3":
        fields["rope_local_theta"] = float(metadata(reader, f"{arch}.rope.freq_base_swa", 10000.0))
    return fields


def load_gguf(path: str | os.PathLike, dtype: str | None = None) -> Model:
    """Read a GGUF file into a Model (float tensors cast to `dtype`, default float32; Q8_0 and
    Q4_0 matmuls as int8 / int4 QuantizedWeight, other quantized types dequantized)."""
    reader = read_gguf(path)
    config = gguf_config(reader, dtype)
    shapes = param_shapes(config)
    layers: dict[str, list] = {name: [None] * config.num_layers for name in shapes["layers"]}
    top, unexpected = {}, []
    for t in reader.tensors:
        name = t.name
        if name == "rope_freqs.weight":
            continue  # read by gguf_config as rope scaling
        if name.startswith("blk."):
            index, _, rest = name[4:].partition(".")
            target = _LAYER_TENSORS.get(rest)
            if target not in layers or not index.isdigit() or int(index) >= config.num_layers:
                unexpected.append(name)
                continue
            layers[target][int(index)] = t
        elif _TOP_TENSORS.get(name) in shapes:
            top[_TOP_TENSORS[name]] = t
        else:
            unexpected.append(name)
    missing = [f"blk.{i}.{_gguf_name(n)}" for n, ts in layers.items() for i, t in enumerate(ts) if t is None]
    missing += [_gguf_name(n) for n in shapes if n != "layers" and n not in top]
    if missing or unexpected:
        raise ValueError(f"{path}: tensors do not match the metadata (missing: {missing[:8]}; "
                         f"unexpected: {unexpected[:8]})")
    dt = config.jnp_dtype
    params = {}
    for name, t in top.items():
        matmul = LLAMA[name].matmul
        qw = _quantized([t], config, shapes[name]) if matmul else None
        params[name] = (jax.tree.map(lambda a: a[0], qw) if qw is not None
                        else jnp.asarray(_float(t, config, shapes[name], matmul), dt))
    if config.tie_word_embeddings:  # the head's matmul reads the Q8_0 / Q4_0 embedding as it is
        head = _quantized([top["embed"]], config, shapes["embed"][::-1])
        if head is not None:
            params["lm_head"] = jax.tree.map(lambda a: a[0], head)
    params["layers"] = {}
    for name, ts in layers.items():
        want, matmul = shapes["layers"][name][1:], LAYER[name].matmul
        qw = _quantized(ts, config, want) if matmul else None
        params["layers"][name] = qw if qw is not None else jnp.asarray(
            np.stack([_float(t, config, want, matmul) for t in ts]), dt)
    return Model(params, config)


# ---- tensors -------------------------------------------------------------------------------------

def _float(t, config: ModelConfig, want, matmul: bool) -> np.ndarray:
    """One tensor as float32 in specjax's layout ([in, out] for matmuls), Q/K unpermuted."""
    try:  # float32 as it is; float16, bfloat16 and the quantized types widened
        w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
    except NotImplementedError:
        raise ValueError(f"tensor {t.name}: unsupported GGUF quant type {t.tensor_type.name}") from None
    w = _unpermute(w, t.name, config)
    if t.name.endswith("norm.weight"):
        w = w - config.norm_offset
    if matmul:
        w = w.T
    if tuple(w.shape) != tuple(want):
        raise ValueError(f"tensor {t.name}: expected shape {tuple(want)}, got {tuple(w.shape)}")
    return w


def _quantized(tensors, config, want) -> QuantizedWeight | None:
    """Matmul tensors (one per layer) stacked as one QuantizedWeight, when all hold the same
    Q8_0 / Q4_0 type and K fits the kernel's layout (P planes of 32-row groups); else None."""
    types = {t.tensor_type for t in tensors}
    bits = DIRECT_TYPES.get(types.pop()) if len(types) == 1 else None
    k, n = want
    if bits is None or k % ((8 // bits) * 32):
        return None
    parts = [_direct(t, config, bits, k, n) for t in tensors]
    return kernel_layout(QuantizedWeight(jnp.asarray(np.stack([d for d, _ in parts])),
                                         jnp.asarray(np.stack([s for _, s in parts])), bits, 32, k, n))


def _direct(t, config, bits: int, k: int, n: int):
    """A Q8_0 / Q4_0 tensor [n, k] as QuantizedWeight (data [k/P, n], scales [P, k/(32P), n])."""
    block = 34 if bits == 8 else 18  # float16 scale + 32 int8 / 16 bytes of offset-8 nibbles
    raw = np.asarray(t.data, np.uint8)
    if raw.shape != (n, k // 32 * block):
        raise ValueError(f"tensor {t.name}: expected {n} rows of {k} weights, got bytes {raw.shape}")
    raw = _unpermute(raw, t.name, config).reshape(n, k // 32, block)
    scales = raw[..., :2].copy().view(np.float16)[..., 0].astype(np.float32).T  # [k/32, n]
    if bits == 8:
        return raw[..., 2:].copy().view(np.int8).reshape(n, k).T, scales[None]
    nibbles = raw[..., 2:]  # low nibbles hold a block's weights 0..15, high nibbles 16..31
    q = np.concatenate([nibbles & 0xF, nibbles >> 4], axis=-1).reshape(n, k).T ^ 8  # signed int4
    data = (q[: k // 2] | (q[k // 2:] << 4)).astype(np.uint8).view(np.int8)  # two planes of rows
    return data, scales.reshape(2, k // 64, n)


def _unpermute(w, name: str, config: ModelConfig):
    """Undo llama.cpp's reordering of Q/K rows (per head, interleaved rotary pairs -> halves);
    llama.cpp permutes only for the llama arch."""
    if config.model_type != "llama" or not name.endswith(("attn_q.weight", "attn_k.weight")):
        return w
    heads = config.num_heads if "attn_q" in name else config.num_kv_heads
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tensor_rows(reader, name):
    t = next((t for t in reader.tensors if t.name == name), None)
    if t is None:
        raise ValueError(f"GGUF has neither a vocab_size nor a {name} tensor")
    return int(t.shape[-1])


def _gguf_name(param: str) -> str:
    return (LAYER.get(param) or LLAMA[param]).gguf


# ---- rope scaling --------------------------------------------------------------------------------

def _rope_scaling(reader, arch: str, head_dim: int) -> RopeScaling | None:
    """Linear scaling from `<arch>.rope.scaling.*` metadata (Gemma 3), or Llama 3 scaling from the
    `rope_freqs.weight` factors llama.cpp writes in its place (low_freq_factor 1 and
    high_freq_factor 4, as every Llama 3.x uses, checked to reproduce the factors)."""
    kind = metadata(reader, f"{arch}.rope.scaling.type")
    if kind == "linear":
        return RopeScaling(float(metadata(reader, f"{arch}.rope.scaling.factor")), rope_type="linear")
    if kind not in (None, "none"):
        raise ValueError(f"unsupported GGUF rope scaling type {kind!r}")
    t = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if t is None:
        return None
    factors = np.asarray(t.data, np.float64).reshape(-1)
    theta = float(metadata(reader, f"{arch}.rope.freq_base", 10000.0))
    dim = int(metadata(reader, f"{arch}.rope.dimension_count", head_dim))
    x = theta ** -(np.arange(0, dim, 2) / dim) / (2 * np.pi)  # 1 / wavelength
    factor = float(factors.max())
    smooth = (factors > 1) & (factors < factor)
    # in the smooth band 1/f = (1-s)/factor + s with s = (orig x - low) / (high - low)
    s = (1 / factors[smooth] - 1 / factor) / (1 - 1 / factor)
    candidates = list((3 * s + 1) / x[smooth]) + [float(metadata(reader, f"{arch}.context_length", 8192))]
    candidates += [2.0 ** p for p in range(4, 21)]
    for orig in candidates:
        scaling = RopeScaling(factor, 1.0, 4.0, int(round(orig)))
        if np.allclose(_llama3_factors(scaling, x), factors, rtol=1e-4):
            return scaling
    raise ValueError("rope_freqs.weight: frequency factors that do not follow Llama 3's rule")


def _llama3_factors(s: RopeScaling, x):
    t = np.clip((s.original_max_position_embeddings * x - s.low_freq_factor)
                / (s.high_freq_factor - s.low_freq_factor), 0, 1)
    return 1 / ((1 - t) / s.factor + t)
