"""Parameters declared once (jax-llm-examples' style): each parameter by name, with its shape (a
function of the owner's config), its logical axes, its initialisation, whether it is a matmul
weight, and its names in Hugging Face checkpoints and GGUF files. Init, sharding, quantization
and the converters read these declarations; draft heads declare theirs the same way
(`specjax.heads.DECLARED`).

Logical axes name what a dim holds (per layer: `Stacked` adds the layer axis the forward scans,
never split); `specjax.sharding` maps them onto the mesh:

    vocab     the vocabulary: split over 'model'
    q_heads   query heads x head_dim: split over 'model' in whole heads
    kv_heads  key/value heads x head_dim: the same
    mlp       the MLP width: split over 'model'
    embed     the model width of a matrix: split over 'data' with FSDP
    None      never split (norm scales, the input side of a square matrix, ...)

A parameter name means one thing wherever it appears (a head's `wq` is laid out as the
model's), which is what lets the sharding rules read any params tree, optimizer state included,
by leaf name.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

INITS = ("normal", "residual", "norm", "zeros")


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter. `shape(config)` is its shape (per layer, inside `Stacked`); `axes` its
    logical axes, one per dim; `init`: "normal" (normal(0, std)), "residual" (the same scaled by
    1/sqrt(2 num_layers), GPT-2 style: the output projections), "norm" (a norm's scale) or
    "zeros" (biases). `matmul`: an [in, out] weight that `dense` multiplies (quantizable; torch
    and GGUF store it transposed). `when(config)`: whether the config has it (default: always).
    `hf`, `gguf`: its tensor name in an HF checkpoint and a GGUF file (per layer: under
    `model.layers.N.` / `blk.N.`), `hf` a function of the config where the name depends on it."""

    shape: Callable[[Any], tuple[int, ...]]
    axes: tuple[str | None, ...]
    init: str = "normal"
    matmul: bool = False
    when: Callable[[Any], bool] | None = None
    hf: str | Callable[[Any], str] | None = None
    gguf: str | None = None

    def __post_init__(self):
        if self.init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {self.init!r}")

    def present(self, config) -> bool:
        return self.when is None or bool(self.when(config))

    def hf_name(self, config) -> str | None:
        return self.hf(config) if callable(self.hf) else self.hf


@dataclasses.dataclass(frozen=True)
class Stacked:
    """Per-layer params stacked on a leading "layers" axis of `count(config)` layers, their
    shapes read from `config_of(config)` (a head's block of the target's layers reads its own)."""

    params: dict
    count: Callable[[Any], int] = lambda c: c.num_layers
    config_of: Callable[[Any], Any] = lambda c: c


class Leaf(NamedTuple):
    """A declared parameter as a config has it: its path in the params tree, its declaration
    and its full shape (stacked ones with the layer axis first)."""

    path: tuple[str, ...]
    param: Param
    shape: tuple[int, ...]


def leaves(declared: dict, config) -> list[Leaf]:
    """The params `config` has, in the order declared."""
    out = []
    for name, d in declared.items():
        if isinstance(d, Param):
            if d.present(config):
                out.append(Leaf((name,), d, tuple(d.shape(config))))
        elif isinstance(d, Stacked):
            n = d.count(config)
            out += [Leaf((name, *leaf.path), leaf.param, (n, *leaf.shape))
                    for leaf in leaves(d.params, d.config_of(config))]
        else:
            out += [leaf._replace(path=(name, *leaf.path)) for leaf in leaves(d, config)]
    return out


def nest(pairs) -> dict:
    """{path tuple: value} pairs -> the nested dict they describe."""
    out: dict = {}
    for path, value in pairs:
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return out


def shapes(declared: dict, config) -> dict:
    """The shape of every parameter `config` has, as a nested dict mirroring the params."""
    return nest((leaf.path, leaf.shape) for leaf in leaves(declared, config))


def random_params(declared: dict, config, key: jax.Array, *, num_layers: int, std: float = 0.02,
                  dtype=jnp.float32, norm: float = 1.0) -> dict:
    """Random params by each declaration's `init`: normal(0, std) matrices (residual outputs
    scaled by 1/sqrt(2 num_layers)), norm scales all `norm`, zero biases; one key per leaf."""
    found = sorted(leaves(declared, config), key=lambda leaf: leaf.path)  # pytree order: sorted keys
    keys = jax.random.split(key, len(found))

    def make(leaf, k):
        kind = leaf.param.init
        if kind == "norm":
            return jnp.full(leaf.shape, norm, dtype)
        if kind == "zeros":
            return jnp.zeros(leaf.shape, dtype)
        scale = std / math.sqrt(2 * num_layers) if kind == "residual" else std
        return (scale * jax.random.normal(k, leaf.shape, jnp.float32)).astype(dtype)

    return nest((leaf.path, make(leaf, k)) for leaf, k in zip(found, keys))


def axes_by_name(*declared: dict) -> dict[str, tuple[str | None, ...]]:
    """Every declared name -> its logical axes (without the layer axis: stacked and single
    params read alike, counted from the last dim). A name declared with other axes elsewhere
    is an error: a name means one thing."""
    table: dict[str, tuple] = {}

    def visit(d, where):
        for name, p in d.items():
            if isinstance(p, Stacked):
                visit(p.params, f"{where}{name}/")
            elif isinstance(p, dict):
                visit(p, f"{where}{name}/")
            elif table.setdefault(name, p.axes) != p.axes:
                raise ValueError(f"parameter {where}{name} is declared with axes {p.axes}, elsewhere "
                                 f"{table[name]}: one name, one layout")

    for d in declared:
        visit(d, "")
    return table


# ---- the Llama / Gemma family --------------------------------------------------------------------

def _width(c) -> tuple[int]:
    return (c.hidden_size,)


def _q(c) -> int:
    return c.num_heads * c.head_dim


def _kv(c) -> int:
    return c.num_kv_heads * c.head_dim


LAYER = {  # one decoder layer
    "attn_norm": Param(_width, (None,), "norm", hf="input_layernorm.weight", gguf="attn_norm.weight"),
    "wq": Param(lambda c: (c.hidden_size, _q(c)), ("embed", "q_heads"), matmul=True,
                hf="self_attn.q_proj.weight", gguf="attn_q.weight"),
    "wk": Param(lambda c: (c.hidden_size, _kv(c)), ("embed", "kv_heads"), matmul=True,
                hf="self_attn.k_proj.weight", gguf="attn_k.weight"),
    "wv": Param(lambda c: (c.hidden_size, _kv(c)), ("embed", "kv_heads"), matmul=True,
                hf="self_attn.v_proj.weight", gguf="attn_v.weight"),
    "wo": Param(lambda c: (_q(c), c.hidden_size), ("q_heads", "embed"), "residual", matmul=True,
                hf="self_attn.o_proj.weight", gguf="attn_output.weight"),
    "bq": Param(lambda c: (_q(c),), ("q_heads",), "zeros", when=lambda c: c.attention_bias,
                hf="self_attn.q_proj.bias", gguf="attn_q.bias"),
    "bk": Param(lambda c: (_kv(c),), ("kv_heads",), "zeros", when=lambda c: c.attention_bias,
                hf="self_attn.k_proj.bias", gguf="attn_k.bias"),
    "bv": Param(lambda c: (_kv(c),), ("kv_heads",), "zeros", when=lambda c: c.attention_bias,
                hf="self_attn.v_proj.bias", gguf="attn_v.bias"),
    "q_norm": Param(lambda c: (c.head_dim,), (None,), "norm", when=lambda c: c.qk_norm,
                    hf="self_attn.q_norm.weight", gguf="attn_q_norm.weight"),
    "k_norm": Param(lambda c: (c.head_dim,), (None,), "norm", when=lambda c: c.qk_norm,
                    hf="self_attn.k_norm.weight", gguf="attn_k_norm.weight"),
    # Gemma 2/3 norm after attention too, and name their pre-MLP norm pre_feedforward_layernorm
    "post_attn_norm": Param(_width, (None,), "norm", when=lambda c: c.sandwich_norms,
                            hf="post_attention_layernorm.weight", gguf="post_attention_norm.weight"),
    "mlp_norm": Param(_width, (None,), "norm", gguf="ffn_norm.weight",
                      hf=lambda c: "pre_feedforward_layernorm.weight" if c.sandwich_norms
                      else "post_attention_layernorm.weight"),
    "post_mlp_norm": Param(_width, (None,), "norm", when=lambda c: c.sandwich_norms,
                           hf="post_feedforward_layernorm.weight", gguf="post_ffw_norm.weight"),
    "w_gate": Param(lambda c: (c.hidden_size, c.intermediate_size), ("embed", "mlp"), matmul=True,
                    hf="mlp.gate_proj.weight", gguf="ffn_gate.weight"),
    "w_up": Param(lambda c: (c.hidden_size, c.intermediate_size), ("embed", "mlp"), matmul=True,
                  hf="mlp.up_proj.weight", gguf="ffn_up.weight"),
    "w_down": Param(lambda c: (c.intermediate_size, c.hidden_size), ("mlp", "embed"), "residual", matmul=True,
                    hf="mlp.down_proj.weight", gguf="ffn_down.weight"),
}

LLAMA = {  # the whole model (ModelConfig)
    "embed": Param(lambda c: (c.vocab_size, c.hidden_size), ("vocab", "embed"),
                   hf="model.embed_tokens.weight", gguf="token_embd.weight"),
    "layers": Stacked(LAYER),
    "norm": Param(_width, (None,), "norm", hf="model.norm.weight", gguf="output_norm.weight"),
    "lm_head": Param(lambda c: (c.hidden_size, c.vocab_size), ("embed", "vocab"), matmul=True,
                     when=lambda c: not c.tie_word_embeddings, hf="lm_head.weight", gguf="output.weight"),
}


def param_shapes(config) -> dict:
    """The shape of every parameter of a ModelConfig's model, mirroring the params pytree."""
    return shapes(LLAMA, config)


def init_params(config, key: jax.Array, std: float = 0.02) -> dict:
    """Random init of a ModelConfig's model (normal(0, std) matrices, norms that scale by one,
    zero biases), GPT-2 style scaled residual outputs."""
    return random_params(LLAMA, config, key, num_layers=config.num_layers, std=std, dtype=config.jnp_dtype,
                         norm=1.0 - config.norm_offset)


__all__ = ["Param", "Stacked", "Leaf", "LAYER", "LLAMA", "axes_by_name", "init_params", "leaves", "nest",
           "param_shapes", "random_params", "shapes"]
