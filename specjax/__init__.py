"""specjax: lossless speculative and parallel decoding for LLMs in JAX."""

from specjax.models import KVCache, Model, ModelConfig

__version__ = "0.1.0"
__all__ = ["Model", "ModelConfig", "KVCache"]
