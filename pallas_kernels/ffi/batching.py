"""Wrap an FFI kernel for use inside a model: vmap folds the batch into the kernel's rows,
and gradients are the pure-JAX reference's (the kernels serve decoding, not training)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def inference_only(kernel, reference, fold, name: str):
    """kernel(*args) with `jax.vmap` and `jax.grad` rules.

    vmap over the first argument only calls `fold(axis_size, *args)` (the first argument with
    its leading batch axis), which folds the batch into rows and calls the kernel once; any
    other vmap (or any vmap, when `fold` is None) runs the reference, vmapped. The gradient is the reference's (recomputed).
    """

    @jax.custom_batching.custom_vmap
    def batched(*args):
        return kernel(*args)

    @batched.def_vmap
    def rule(axis_size, in_batched, *args):
        flags = [any(jax.tree.leaves(b)) for b in in_batched]
        if fold is not None and flags[0] and not any(flags[1:]):
            return fold(axis_size, *args), True
        grow = lambda a: jnp.broadcast_to(a, (axis_size, *jnp.shape(a)))
        args = [a if f else jax.tree.map(grow, a) for a, f in zip(args, flags)]
        return jax.vmap(reference)(*args), True

    @jax.custom_vjp
    def call(*args):
        return batched(*args)

    def fwd(*args):
        return batched(*args), args

    def bwd(args, g):
        return jax.vjp(reference, *args)[1](g)

    call.defvjp(fwd, bwd)
    call.__name__ = name
    return call
