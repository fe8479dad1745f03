"""Writing tiny GGUF files in llama.cpp's conventions, shared by the GGUF and Gemma tests."""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")


def writer(path, arch: str, config, head_dim: int) -> "gguf.GGUFWriter":
    """A GGUFWriter with the model-shape metadata every architecture carries."""
    c = config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    return w


def add_tensor(w, name: str, a: np.ndarray, qtype) -> None:
    """1-D tensors in F32, 2-D ones in `qtype` (F16 as float16, other types quantized)."""
    q = gguf.GGMLQuantizationType
    if a.ndim == 2 and qtype not in (q.F32, q.F16):
        w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
    else:
        w.add_tensor(name, a.astype(np.float16 if a.ndim == 2 and qtype == q.F16 else np.float32))


def finish(w, path):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
