"""Models: the Llama and Gemma families as a pure forward over a params pytree."""

from __future__ import annotations

import dataclasses

import jax

from specjax.models.cache import KVCache
from specjax.models.config import SUPPORTED_MODEL_TYPES, ModelConfig, RopeScaling
from specjax.models.llama import ForwardOutput, Injection, float_lm_head, forward, lm_head, lm_head_weight
from specjax.models.params import init_params, param_shapes
from specjax.models.target import Target, TargetConfig
from specjax.pytrees import register_dataclass


@register_dataclass
@dataclasses.dataclass(frozen=True)
class Model:
    """A model: static `config` plus the `params` pytree. A pytree itself (config is static),
    so a Model can be passed through jit, vmap and sharding as is. The decode loop's `Target`."""

    params: dict
    config: ModelConfig = dataclasses.field(metadata=dict(static=True))

    @classmethod
    def init(cls, config: ModelConfig, key: jax.Array) -> "Model":
        return cls(init_params(config, key), config)

    def __call__(self, tokens, **kwargs) -> ForwardOutput:
        return forward(self.config, self.params, tokens, **kwargs)


__all__ = ["Model", "ModelConfig", "RopeScaling", "KVCache", "ForwardOutput", "Injection", "Target",
           "TargetConfig", "float_lm_head", "forward", "init_params", "lm_head", "lm_head_weight", "param_shapes",
           "SUPPORTED_MODEL_TYPES"]
