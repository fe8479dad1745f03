"""ModelConfig: the static description of a Llama- or Gemma-family model (or a masked-diffusion
LM of the same layout: LLaDA, Dream), read from an HF `config.json`."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax.numpy as jnp

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "llada", "dream")
GEMMA = ("gemma", "gemma2", "gemma3")
# masked-diffusion LMs and the mask ids their configs default to: LLaDA (a Llama layout under
# its own names, `specjax.convert.hf`) and Dream (Qwen2's, logits shifted)
DLLM_MASK_IDS = {"llada": 126336, "dream": 151666}
LAYER_TYPES = ("full_attention", "sliding_attention")
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling: `llama3` (Llama 3.x's band-wise correction) or `linear`
    (frequencies divided by `factor`; Gemma 3's global layers), which uses `factor` alone."""

    factor: float
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None
    rope_type: str = "llama3"

    def __post_init__(self):
        if self.rope_type not in ("llama3", "linear"):
            raise ValueError(f"unsupported rope type {self.rope_type!r}; supported: default, llama3, linear")

    def to_hf(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


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
    sliding_window: int | None = None  # a query sees the last `sliding_window` positions
    # which layers the window applies to ("sliding_attention") and which see everything
    # ("full_attention"; Gemma 2/3); None: every layer is windowed when sliding_window is set
    layer_types: tuple[str, ...] | None = None
    rope_local_theta: float | None = None  # RoPE base of the sliding layers, unscaled (Gemma 3)
    hidden_act: str = "silu"  # the gate activation of the MLP (Gemma: gelu_pytorch_tanh)
    norm_offset: float = 0.0  # RMSNorm scales by (norm_offset + w) (Gemma: 1)
    scale_embeddings: bool = False  # embeddings times sqrt(hidden_size), in dtype (Gemma)
    sandwich_norms: bool = False  # norms after attention and MLP too (Gemma 2/3)
    query_pre_attn_scalar: int | None = None  # the attention scale is its -1/2 power, else head_dim's
    attn_logit_softcapping: float | None = None  # scores -> cap * tanh(scores / cap) (Gemma 2)
    final_logit_softcapping: float | None = None  # the same on the output logits (Gemma 2)
    dtype: str = "float32"
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    # set for a masked-diffusion LM (LLaDA, Dream): attention is bidirectional and this id marks
    # the positions still to be generated (specjax.diffusion)
    mask_token_id: int | None = None
    shift_logits: bool = False  # the output at position i predicts token i + 1 (Dream)

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
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"unsupported hidden_act {self.hidden_act!r}; supported: {', '.join(ACTIVATIONS)}")
        if self.layer_types is not None:
            object.__setattr__(self, "layer_types", tuple(self.layer_types))  # hashable when read from JSON
            if len(self.layer_types) != self.num_layers or set(self.layer_types) - set(LAYER_TYPES):
                raise ValueError(f"layer_types must name {self.num_layers} layers, each one of "
                                 f"{', '.join(LAYER_TYPES)}; got {list(self.layer_types)}")

    @property
    def bidirectional(self) -> bool:
        """Whether every position attends to every other (a masked-diffusion LM)."""
        return self.mask_token_id is not None

    @property
    def sliding_layers(self) -> tuple[bool, ...]:
        """Per layer: whether the sliding window applies to it."""
        if self.sliding_window is None:
            return (False,) * self.num_layers
        if self.layer_types is None:
            return (True,) * self.num_layers
        return tuple(t == "sliding_attention" for t in self.layer_types)

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
        layer = attn + 3 * e * f + (4 if self.sandwich_norms else 2) * e + (2 * d if self.qk_norm else 0)
        head = 0 if self.tie_word_embeddings else e * self.vocab_size
        return self.num_layers * layer + self.vocab_size * e + e + head

    # ---- HF config.json <-> ModelConfig -------------------------------------------------------

    @classmethod
    def from_hf(cls, hf: dict[str, Any], dtype: str | None = None) -> "ModelConfig":
        """Build from an HF config dict (old `rope_theta`/`rope_scaling` or new `rope_parameters`;
        for Gemma 3 also `gemma3_text` and the `text_config` of Gemma3ForConditionalGeneration;
        LLaDA's own field names (`d_model`, `n_layers`, ...); Dream's `model_type` "Dream")."""
        hf = _text_config(hf)
        if hf.get("model_type") == "llada":
            hf = _llada_config(hf)
        model_type = {"Dream": "dream"}.get(hf.get("model_type"), hf.get("model_type"))
        if model_type not in SUPPORTED_MODEL_TYPES:
            archs = hf.get("architectures")
            moe = " (mixture-of-experts dLLMs are not supported)" if "moe" in f"{model_type}{archs}".lower() else ""
            raise ValueError(
                f"unsupported model_type {model_type!r} (architectures {archs}){moe}; "
                f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads")
        missing = [k for k in required if k not in hf]
        if missing:
            raise ValueError(f"config.json lacks required fields: {', '.join(missing)}")
        gemma = model_type in GEMMA
        rope, local_theta = _rope_parameters(hf, model_type)
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
        elif rope_type == "linear":
            scaling = RopeScaling(float(rope["factor"]), rope_type="linear")
        elif rope_type not in ("default", None):
            raise ValueError(f"unsupported rope type {rope_type!r}; supported: default, llama3, linear")
        num_heads = hf["num_attention_heads"]
        head_dim = hf.get("head_dim") or hf["hidden_size"] // num_heads
        sliding = hf.get("sliding_window")
        if model_type == "qwen2" and not hf.get("use_sliding_window", False):
            sliding = None  # Qwen2 configs carry a window that is off unless use_sliding_window
        if model_type == "qwen3" and not hf.get("use_sliding_window", False):
            sliding = None
        if model_type in ("gemma", "dream"):
            sliding = None  # Dream's attention (SDPA) ignores its config's window
        if hf.get("mlp_bias") or (model_type not in ("qwen2", "dream") and hf.get("attention_bias")):
            raise ValueError(f"{model_type} with mlp_bias or attention_bias (output-projection "
                             f"biases) is not supported")
        if hf.get("use_bidirectional_attention"):
            raise ValueError(f"{model_type} with use_bidirectional_attention is not a causal LM")
        act = hf.get("hidden_activation") or hf.get("hidden_act") or "silu"
        if gemma and act == "gelu":
            act = "gelu_pytorch_tanh"  # Gemma's legacy name for the tanh approximation (as HF reads it)
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
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", gemma)),
            attention_bias=model_type in ("qwen2", "dream"),
            qk_norm=model_type in ("qwen3", "gemma3"),
            sliding_window=sliding,
            layer_types=_layer_types(hf, model_type) if sliding is not None else None,
            rope_local_theta=local_theta,
            hidden_act=act,
            norm_offset=1.0 if gemma else 0.0,
            scale_embeddings=gemma,
            sandwich_norms=model_type in ("gemma2", "gemma3"),
            query_pre_attn_scalar=(int(hf.get("query_pre_attn_scalar", 256))
                                   if model_type in ("gemma2", "gemma3") else None),
            attn_logit_softcapping=hf.get("attn_logit_softcapping"),
            final_logit_softcapping=hf.get("final_logit_softcapping"),
            dtype=dtype,
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=eos,
            mask_token_id=(DLLM_MASK_IDS.get(model_type) if hf.get("mask_token_id") is None
                           else hf["mask_token_id"]),
            shift_logits=model_type == "dream" or bool(hf.get("shift_logits", False)),  # Dream's always are
        )

    def to_hf(self) -> dict[str, Any]:
        """An HF config dict that transformers loads (old-style rope keys, read by every version);
        for LLaDA and Dream, the config.json their remote code reads, which must read back as
        this config (else a ValueError names the fields it cannot express)."""
        if self.model_type == "llada":
            return _reads_back(self, _llada_hf(self))
        arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "gemma": "GemmaForCausalLM",
                "gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM", "dream": "DreamModel"}[self.model_type]
        hf: dict[str, Any] = {
            "architectures": [arch],
            "model_type": {"gemma3": "gemma3_text", "dream": "Dream"}.get(self.model_type, self.model_type),
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
            "hidden_act": self.hidden_act,
            "torch_dtype": self.dtype,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
        }
        if self.model_type in ("llama", "qwen3") or self.model_type in GEMMA:
            hf["attention_bias"] = False
        if self.model_type in ("gemma2", "gemma3"):
            hf.update(hidden_activation=self.hidden_act, query_pre_attn_scalar=self.query_pre_attn_scalar,
                      attn_logit_softcapping=self.attn_logit_softcapping,
                      final_logit_softcapping=self.final_logit_softcapping,
                      layer_types=list(self.layer_types or ["full_attention"] * self.num_layers))
        if self.mask_token_id is not None:
            hf.update(mask_token_id=self.mask_token_id, shift_logits=self.shift_logits)
        if self.rope_local_theta is not None:
            hf["rope_local_base_freq"] = self.rope_local_theta
        if self.rope_scaling is not None:
            hf["rope_scaling"] = self.rope_scaling.to_hf()
        if self.sliding_window is not None:
            hf["sliding_window"] = self.sliding_window
            if self.model_type in ("qwen2", "qwen3"):
                hf["use_sliding_window"] = True
        elif self.model_type == "mistral":
            hf["sliding_window"] = None
        return _reads_back(self, hf) if self.model_type == "dream" else hf

    @classmethod
    def from_json_file(cls, path: str | os.PathLike, dtype: str | None = None) -> "ModelConfig":
        with open(path) as f:
            try:
                hf = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: not valid JSON ({e})") from None
        return cls.from_hf(hf, dtype=dtype)


def _reads_back(config: ModelConfig, hf: dict[str, Any]) -> dict[str, Any]:
    """`hf`, after checking that from_hf reads it back as `config`."""
    back = ModelConfig.from_hf(hf)
    lost = [f.name for f in dataclasses.fields(config) if getattr(back, f.name) != getattr(config, f.name)]
    if lost:
        raise ValueError(f"a {config.model_type} config.json cannot express this config's {', '.join(lost)}")
    return hf


# LLaDA's architecture switches: (the default of its configuration_llada.py, the one value the
# llama forward runs). Its other block types, activations and norms, biases, ALiBi, q/k norms and
# embedding or logit scaling are refused.
_LLADA_SWITCHES = {
    "block_type": ("sequential", "llama"), "activation_type": ("swiglu", "silu"),
    "layer_norm_type": ("default", "rms"), "rope": (False, True), "alibi": (False, False),
    "include_bias": (False, False), "include_qkv_bias": (False, False), "bias_for_layer_norm": (False, False),
    "layer_norm_with_affine": (True, True), "attention_layer_norm": (False, False),
    "input_emb_norm": (False, False), "scale_logits": (False, False), "block_group_size": (1, 1),
}


def _llada_config(hf: dict[str, Any]) -> dict[str, Any]:
    """LLaDA's config.json (`d_model`, `n_layers`, ... of its OLMo-derived LLaDAConfig) as the HF
    Llama fields from_hf reads. The embedding and head hold `embedding_size` rows (>= vocab_size,
    the rows past the tokenizer's padding), and the reference's logits span them all: so does
    vocab_size here. What the llama forward cannot run is refused, naming the keys."""
    archs = hf.get("architectures") or ["LLaDAModelLM"]
    experts = sorted(k for k in hf if "expert" in k or "moe" in k)
    if archs != ["LLaDAModelLM"] or experts:
        raise ValueError(f"LLaDA variant {archs}{f' with {experts}' if experts else ''} is not supported: "
                         f"only the dense LLaDAModelLM (mixture-of-experts LLaDAs are not)")
    value = {k: default if hf.get(k) is None else hf[k] for k, (default, _) in _LLADA_SWITCHES.items()}
    bad = [k for k, (_, runs) in _LLADA_SWITCHES.items() if value[k] != runs]
    if bad:
        raise ValueError(f"LLaDA with {', '.join(f'{k}={value[k]!r}' for k in bad)} "
                         f"is not supported: the llama forward runs "
                         f"{', '.join(f'{k}={_LLADA_SWITCHES[k][1]!r}' for k in bad)} (a key left out "
                         f"takes the default of LLaDA's configuration_llada.py)")
    missing = [k for k in ("d_model", "n_layers", "n_heads", "vocab_size") if k not in hf]
    if missing:
        raise ValueError(f"config.json lacks required fields: {', '.join(missing)}")
    d, heads = hf["d_model"], hf["n_heads"]
    rows = hf.get("embedding_size") or hf["vocab_size"]
    if rows < hf["vocab_size"]:
        raise ValueError(f"LLaDA embedding_size {rows} is below vocab_size {hf['vocab_size']}")
    kv = hf.get("n_kv_heads") or (1 if hf.get("multi_query_attention") else heads)
    out = dict(model_type="llada", vocab_size=rows, hidden_size=d, num_hidden_layers=hf["n_layers"],
               intermediate_size=hf.get("mlp_hidden_size") or hf.get("mlp_ratio", 4) * d,
               num_attention_heads=heads, num_key_value_heads=kv, head_dim=d // heads,
               max_position_embeddings=hf.get("max_sequence_length", 1024),
               rope_theta=hf.get("rope_theta", 10000.0), rms_norm_eps=hf.get("rms_norm_eps", 1e-5),
               tie_word_embeddings=hf.get("weight_tying", True), hidden_act="silu")
    keep = ("mask_token_id", "bos_token_id", "eos_token_id", "dtype", "torch_dtype")
    return {**out, **{k: hf[k] for k in keep if k in hf}}


def _llada_hf(c: ModelConfig) -> dict[str, Any]:
    """The LLaDA config.json of a `llada` ModelConfig (the keys LLaDA-8B's carries)."""
    return {"architectures": ["LLaDAModelLM"], "model_type": "llada",
            **{k: runs for k, (_, runs) in _LLADA_SWITCHES.items()},
            "d_model": c.hidden_size, "n_layers": c.num_layers, "n_heads": c.num_heads,
            "n_kv_heads": c.num_kv_heads, "mlp_hidden_size": c.intermediate_size,
            "vocab_size": c.vocab_size, "embedding_size": c.vocab_size,
            "max_sequence_length": c.max_position_embeddings, "rope_theta": c.rope_theta,
            "rms_norm_eps": c.rms_norm_eps, "weight_tying": c.tie_word_embeddings,
            "mask_token_id": c.mask_token_id, "bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_id,
            "torch_dtype": c.dtype, "use_cache": False}


_GEMMA3_DEFAULTS = dict(vocab_size=262_208, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                        max_position_embeddings=131_072, sliding_window=4096, query_pre_attn_scalar=256)


def _text_config(hf: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config: Gemma 3's `text_config` (fields it omits take
    Gemma3TextConfig's defaults, as in the configs on the Hub), `gemma3_text` as `gemma3`."""
    if hf.get("model_type") == "gemma3" and "text_config" in hf:
        outer = {k: hf[k] for k in ("dtype", "torch_dtype", "tie_word_embeddings", "bos_token_id",
                                    "eos_token_id") if k in hf}
        return {**_GEMMA3_DEFAULTS, **outer, **hf["text_config"], "model_type": "gemma3"}
    if hf.get("model_type") == "gemma3_text":
        return {**_GEMMA3_DEFAULTS, **hf, "model_type": "gemma3"}
    return hf


def _rope_parameters(hf: dict[str, Any], model_type: str) -> tuple[dict[str, Any], float | None]:
    """(the rope parameters of the global layers, the local layers' rope base or None).
    Gemma 3 keeps one set per layer type; its local layers are never scaled."""
    params = dict(hf.get("rope_parameters") or {})
    if model_type != "gemma3":
        return {**params, **(hf.get("rope_scaling") or {})}, None
    full = {"rope_theta": hf.get("rope_theta", 1_000_000.0), **(params.get("full_attention") or {}),
            **(hf.get("rope_scaling") or {})}
    local = {"rope_theta": hf.get("rope_local_base_freq", 10_000.0), **(params.get("sliding_attention") or {})}
    if local.get("rope_type", "default") != "default":
        raise ValueError(f"unsupported rope type {local['rope_type']!r} for Gemma 3's sliding layers")
    return full, float(local["rope_theta"])


def _layer_types(hf: dict[str, Any], model_type: str) -> tuple[str, ...] | None:
    """Which layers are windowed: `layer_types`, else Gemma 2/3's pattern; None for every layer."""
    if hf.get("layer_types"):
        return tuple(hf["layer_types"])
    if model_type not in ("gemma2", "gemma3"):
        return None
    return gemma_layer_types(model_type, hf["num_hidden_layers"], hf.get("sliding_window_pattern"))


def gemma_layer_types(model_type: str, num_layers: int, pattern=None) -> tuple[str, ...]:
    """Gemma 2/3's local/global layers: `pattern` as a period (every n-th layer global; Gemma 2
    alternates, period 2, Gemma 3's default is 6) or as one bool per layer (True: sliding)."""
    if pattern is None or isinstance(pattern, int):
        period = pattern or {"gemma2": 2, "gemma3": 6}[model_type]
        pattern = [bool((i + 1) % period) for i in range(num_layers)]
    return tuple("sliding_attention" if p else "full_attention" for p in pattern)
