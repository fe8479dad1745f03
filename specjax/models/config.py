"""ModelConfig: the static description of a Llama-family model, read from an HF `config.json`."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax.numpy as jnp

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama-3 style frequency correction (`rope_type: llama3`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Static, hashable model description. Field names follow HF where they exist."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projection biases (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm on q and k before RoPE (Qwen3)
    sliding_window: int | None = None  # Mistral: a query sees the last `sliding_window` positions
    dtype: str = "float32"
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    def __post_init__(self):
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {self.model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )
        if self.dtype not in _DTYPES:
            raise ValueError(f"unsupported dtype {self.dtype!r}; supported: {', '.join(_DTYPES)}")

    @property
    def jnp_dtype(self):
        return _DTYPES[self.dtype]

    @property
    def num_params(self) -> int:
        """Parameter count (tied embeddings counted once)."""
        e, f, d = self.hidden_size, self.intermediate_size, self.head_dim
        attn = e * d * (2 * self.num_heads + 2 * self.num_kv_heads)
        if self.attention_bias:
            attn += d * (self.num_heads + 2 * self.num_kv_heads)
        layer = attn + 3 * e * f + 2 * e + (2 * d if self.qk_norm else 0)
        head = 0 if self.tie_word_embeddings else e * self.vocab_size
        return self.num_layers * layer + self.vocab_size * e + e + head

    # ---- HF config.json <-> ModelConfig -------------------------------------------------------

    @classmethod
    def from_hf(cls, hf: dict[str, Any], dtype: str | None = None) -> "ModelConfig":
        """Build from an HF config dict (old `rope_theta`/`rope_scaling` or new `rope_parameters`)."""
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            archs = hf.get("architectures")
            raise ValueError(
                f"unsupported model_type {model_type!r} (architectures {archs}); "
                f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads")
        missing = [k for k in required if k not in hf]
        if missing:
            raise ValueError(f"config.json lacks required fields: {', '.join(missing)}")
        rope = dict(hf.get("rope_parameters") or {})
        if hf.get("rope_scaling"):
            rope.update(hf["rope_scaling"])
        rope_theta = float(rope.get("rope_theta") or hf.get("rope_theta") or 10000.0)
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        scaling = None
        if rope_type == "llama3":
            scaling = RopeScaling(
                factor=float(rope["factor"]),
                low_freq_factor=float(rope["low_freq_factor"]),
                high_freq_factor=float(rope["high_freq_factor"]),
                original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
            )
        elif rope_type not in ("default", None):
            raise ValueError(f"unsupported rope type {rope_type!r}; supported: default, llama3")
        num_heads = hf["num_attention_heads"]
        head_dim = hf.get("head_dim") or hf["hidden_size"] // num_heads
        sliding = hf.get("sliding_window")
        if model_type == "qwen2" and not hf.get("use_sliding_window", False):
            sliding = None  # Qwen2 configs carry a window that is off unless use_sliding_window
        if model_type == "qwen3" and not hf.get("use_sliding_window", False):
            sliding = None
        if hf.get("mlp_bias") or (model_type != "qwen2" and hf.get("attention_bias")):
            raise ValueError(f"{model_type} with mlp_bias or attention_bias (output-projection "
                             f"biases) is not supported")
        eos = hf.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        if dtype is None:
            dtype = hf.get("dtype") or hf.get("torch_dtype") or "float32"
            dtype = dtype if dtype in _DTYPES else "float32"
        return cls(
            model_type=model_type,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            rope_theta=rope_theta,
            rope_scaling=scaling,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=model_type == "qwen2",
            qk_norm=model_type == "qwen3",
            sliding_window=sliding,
            dtype=dtype,
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=eos,
        )

    def to_hf(self) -> dict[str, Any]:
        """An HF config dict that transformers loads (old-style rope keys, read by every version)."""
        arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[self.model_type]
        hf: dict[str, Any] = {
            "architectures": [arch],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "torch_dtype": self.dtype,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
        }
        if self.model_type in ("llama", "qwen3"):
            hf["attention_bias"] = False
        if self.rope_scaling is not None:
            hf["rope_scaling"] = {"rope_type": "llama3", **dataclasses.asdict(self.rope_scaling)}
        if self.sliding_window is not None:
            hf["sliding_window"] = self.sliding_window
            if self.model_type in ("qwen2", "qwen3"):
                hf["use_sliding_window"] = True
        elif self.model_type == "mistral":
            hf["sliding_window"] = None
        return hf

    @classmethod
    def from_json_file(cls, path: str | os.PathLike, dtype: str | None = None) -> "ModelConfig":
        with open(path) as f:
            try:
                hf = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: not valid JSON ({e})") from None
        return cls.from_hf(hf, dtype=dtype)
