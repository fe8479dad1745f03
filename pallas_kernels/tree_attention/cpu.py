"""The CPU kernel (cpu.cc through the XLA FFI): reads only the used cache slots of each row,
the layer taken from the cache's stack in place."""

from __future__ import annotations

import jax
import numpy as np
import jax.numpy as jnp

from pallas_kernels import ffi
from pallas_kernels.ffi.batching import inference_only
from pallas_kernels.tree_attention import reference

MAX_NODES = 64  # decode and verify queries; prefill blocks run XLA's attention
DTYPES = (jnp.float32, jnp.bfloat16)
VECTOR_WIDTH = 16  # floats: a head dim the kernel takes on every host


def supports(q, k_cache) -> bool:
    return (q.shape[1] <= MAX_NODES and k_cache.dtype in DTYPES
            and q.shape[-1] % VECTOR_WIDTH == 0 and ffi.available())


def _ffi(q, k_cache, v_cache, index, lengths, k_tree, v_tree, tree_mask):
    f32 = lambda a: a.astype(jnp.float32)
    return jax.ffi.ffi_call("specjax_tree_attention", jax.ShapeDtypeStruct(q.shape, jnp.float32))(
        f32(q), k_cache, v_cache, jnp.asarray(index, jnp.int32).reshape(()),
        lengths.astype(jnp.int32), f32(k_tree), f32(v_tree), tree_mask.astype(bool),
        scale=np.float32(q.shape[-1] ** -0.5))


def _reference(q, k_cache, v_cache, index, lengths, k_tree, v_tree, tree_mask):
    at = lambda c: jax.lax.dynamic_index_in_dim(c, index, keepdims=False)
    out = reference.tree_attention(q, at(k_cache), at(v_cache), lengths, k_tree, v_tree, tree_mask)
    return out.astype(jnp.float32)


_kernel = inference_only(_ffi, _reference, None, name="tree_attention")


def tree_attention(q, k_cache, v_cache, index, lengths, k_tree, v_tree, tree_mask):
    """As reference.tree_attention on layer `index` of k/v_cache [L, B, S, KV, hd] (default
    scale, no window or soft-cap), in float32."""
    return _kernel(q, k_cache, v_cache, index, lengths, k_tree, v_tree, tree_mask)
