"""specjax: lossless speculative and parallel decoding for LLMs in JAX.

    import specjax as sj
    model = sj.load("tiny")
    out = sj.generate(model, [[1, 2, 3]], max_new_tokens=32)
"""

import jax
import numpy as np

from specjax import constraints, drafters, sampling, sharding, verify
from specjax.convert import load, load_gguf, save
from specjax.engine import GenerateOutput, generate, make_generate, stream
from pallas_kernels import QuantizedWeight
from specjax.models import KVCache, Model, ModelConfig
from specjax.quantize import quantize
from specjax.sharding import shard
from specjax.tokenizer import TextTokenizer, load_tokenizer
from specjax.tree import DraftTree, Verdict
from specjax.models import forward as _forward

__version__ = "0.1.0"


def forward(model: Model, tokens):
    """Plain causal forward: int [B, T] -> float32 logits [B, T, V]. Concrete tokens are checked
    (ids in [0, vocab), T <= max_position_embeddings); traced ones (inside your jit) are not."""
    if not isinstance(tokens, jax.core.Tracer):
        tokens = np.asarray(tokens)
        _check_tokens(model.config, tokens)
    return _forward(model.config, model.params, tokens).logits


def _check_tokens(config: ModelConfig, tokens: np.ndarray) -> None:
    if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"tokens must be integer ids [B, T], got {tokens.dtype} {tokens.shape}")
    if tokens.shape[1] > config.max_position_embeddings:
        raise ValueError(f"{tokens.shape[1]} tokens exceed the model's max_position_embeddings "
                         f"{config.max_position_embeddings}")
    bad = tokens[(tokens < 0) | (tokens >= config.vocab_size)]
    if bad.size:
        raise ValueError(f"token ids outside the vocabulary [0, {config.vocab_size}): {bad[:5].tolist()}")


__all__ = ["Model", "ModelConfig", "KVCache", "GenerateOutput", "load", "load_gguf", "save", "forward",
           "generate", "make_generate", "stream", "sampling", "sharding", "shard", "constraints", "drafters", "verify", "DraftTree", "Verdict", "quantize",
           "QuantizedWeight", "load_tokenizer", "TextTokenizer"]
