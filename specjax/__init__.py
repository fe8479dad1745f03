"""specjax: lossless speculative and parallel decoding for LLMs in JAX.

    import specjax as sj
    model = sj.load("tiny")
    out = sj.generate(model, [[1, 2, 3]], max_new_tokens=32)
"""

from specjax import drafters, sampling, sharding, verify
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
    """Plain causal forward: int [B, T] -> float32 logits [B, T, V]."""
    return _forward(model.config, model.params, tokens).logits


__all__ = ["Model", "ModelConfig", "KVCache", "GenerateOutput", "load", "load_gguf", "save", "forward",
           "generate", "make_generate", "stream", "sampling", "sharding", "shard", "drafters", "verify", "DraftTree", "Verdict", "quantize",
           "QuantizedWeight", "load_tokenizer", "TextTokenizer"]
