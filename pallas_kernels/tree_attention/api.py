"""tree_attention: the kernel for the backend, or the reference where no kernel applies."""

from __future__ import annotations

import jax

from pallas_kernels.backend import pick_impl
from pallas_kernels.tree_attention import causal_blocks, cpu, gpu, reference, tpu

MAX_KERNEL_NODES = 256  # longer blocks (prefill) are not tree verification: XLA does them well


def tree_attention(q, k_cache, v_cache, lengths, k_tree, v_tree, tree_mask, *, index=None,
                   q_positions=None, window=None, scale=None, softcap=None, causal=False,
                   interpret=False, impl: str | None = None):
    """q [B,N,Hq,hd], k/v_cache [B,S,KV,hd], lengths int[B], k/v_tree [B,M,KV,hd],
    tree_mask bool[B,N,M] -> [B,N,Hq,hd] in q's dtype (contract: reference.tree_attention).
    M is N when the queries are the tree's own nodes; a block of M != N entries (a
    self-drafter's scratch, drafters/self_draft.py) runs the reference on GPU and TPU.
    With `index`, k/v_cache are the stacks [L,B,S,KV,hd] of every layer and layer `index`
    (may be traced) is used: the CPU kernel reads it in place, so does the GPU kernel for a
    Python int index (a static block offset), the others slice it first.

    Runs the CPU, GPU or TPU kernel on those backends (see backend.pick_impl for `impl` and
    `interpret`); the reference runs with a sliding `window`, a `scale` other than
    1/sqrt(hd) or a `softcap` (Gemma 2/3: the kernels have neither), with an empty cache, for
    more than MAX_KERNEL_NODES nodes (cpu.MAX_NODES on CPU) and on other backends.
    `causal` says no query sees a later key of the block (a prefill's mask): on the CPU a long
    block with an empty cache then runs causal_blocks, which skips the upper triangle.
    """
    b, n, hq, hd = q.shape
    s, kv = k_cache.shape[-3], k_cache.shape[-2]
    if hq % kv:
        raise ValueError(f"query heads ({hq}) must be a multiple of kv heads ({kv})")
    m = k_tree.shape[1]
    if k_tree.shape != (b, m, kv, hd) or tree_mask.shape != (b, n, m):
        raise ValueError(f"k_tree must be {(b, m, kv, hd)} and tree_mask {(b, n, m)}, got "
                         f"{k_tree.shape} and {tree_mask.shape}")
    on_cpu = impl == "cpu" or (impl is None and not interpret and jax.default_backend() == "cpu")
    impl = pick_impl(impl, interpret)
    if causal and on_cpu and s == 0 and m == n > causal_blocks.BLOCK:
        return causal_blocks.causal_attention(q, k_tree, v_tree, tree_mask, scale=scale, softcap=softcap)
    custom = window is not None or softcap is not None or (scale is not None and scale != hd ** -0.5)
    if impl == "cpu" and not custom and s and cpu.supports(q, k_cache):
        stack = (k_cache, v_cache) if index is not None else (k_cache[None], v_cache[None])
        return cpu.tree_attention(q, *stack, 0 if index is None else index, lengths, k_tree,
                                  v_tree, tree_mask).astype(q.dtype)
    fallback = custom or s == 0 or n > MAX_KERNEL_NODES or m != n
    on_gpu = impl == "gpu" and not fallback and gpu.supports(q, k_cache)
    if index is not None and not (on_gpu and isinstance(index, int)):  # the GPU kernel's block offset
        at = lambda c: jax.lax.dynamic_index_in_dim(c, index, keepdims=False)
        k_cache, v_cache, index = at(k_cache), at(v_cache), None
    if on_gpu:
        return gpu.tree_attention(q, k_cache, v_cache, lengths, k_tree, v_tree, tree_mask, layer=index,
                                  interpret=interpret)
    if impl == "tpu" and not fallback:
        return tpu.tree_attention(q, k_cache, v_cache, lengths, k_tree, v_tree, tree_mask,
                                  interpret=interpret)
    return reference.tree_attention(q, k_cache, v_cache, lengths, k_tree, v_tree, tree_mask,
                                    q_positions=q_positions, window=window, scale=scale,
                                    softcap=softcap)
