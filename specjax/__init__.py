"""specjax: lossless speculative and parallel decoding for LLMs in JAX.

    import specjax as sj
    model = sj.load("tiny")
    out = sj.generate(model, [[1, 2, 3]], max_new_tokens=32)
"""

import jax

from specjax import constraints, diffusion, drafters, sampling, sharding, verify
from specjax.adaptive import Adaptive
from specjax.convert import load, load_gguf, save
from specjax.decoding import GenerateOutput, generate, make_generate, stream
from pallas_kernels import QuantizedWeight
from specjax.models import KVCache, Model, ModelConfig
from specjax.quantize import quantize, quantize_activations
from specjax.sharding import shard
from specjax.stats import Stats
from specjax.tokenizer import TextTokenizer, load_tokenizer
from specjax.tree import DraftTree, Verdict
from specjax.decoding import check_tokens as _check_tokens
from specjax.models import forward as _forward

__version__ = "0.1.0"


def forward(model: Model, tokens):
    """Plain causal forward: int [B, T] -> float32 logits [B, T, V]. Concrete tokens are checked
    (ids in [0, vocab), T <= max_position_embeddings); traced ones (inside your jit) are not."""
    if not isinstance(tokens, jax.core.Tracer):
        tokens = _check_tokens(tokens, model.config.vocab_size)
        if tokens.shape[1] > model.config.max_position_embeddings:
            raise ValueError(f"{tokens.shape[1]} tokens exceed the model's max_position_embeddings "
                             f"{model.config.max_position_embeddings}")
    return _forward(model.config, model.params, tokens).logits


__all__ = ["Model", "ModelConfig", "KVCache", "Adaptive", "GenerateOutput", "Stats", "load", "load_gguf", "save", "forward",
           "generate", "make_generate", "stream", "sampling", "sharding", "shard", "constraints", "diffusion", "drafters", "verify", "DraftTree", "Verdict", "quantize", "quantize_activations",
           "QuantizedWeight", "load_tokenizer", "TextTokenizer"]
