"""The CPU kernel (cpu.cc through the XLA FFI): each weight read once for all M rows."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels import ffi
from pallas_kernels.ffi.batching import inference_only
from pallas_kernels.matmul import reference

MAX_ROWS = 64  # decode and verify rows; beyond, XLA's GEMM is compute-efficient
DTYPES = (jnp.float32, jnp.bfloat16)


def supports(x, w) -> bool:
    return x.shape[0] <= MAX_ROWS and w.dtype in DTYPES and ffi.available()


def _ffi(x, w, index, *, transposed):
    stack = w if w.ndim == 3 else w[None]
    n = stack.shape[1] if transposed else stack.shape[2]
    return jax.ffi.ffi_call("specjax_matmul", jax.ShapeDtypeStruct((x.shape[0], n), jnp.float32))(
        x.astype(jnp.float32), stack, jnp.asarray(index, jnp.int32).reshape(()), nk=transposed)


@functools.cache
def _kernel(transposed: bool):
    def ref(x, w, index):
        return reference.matmul(x, w, index=None if w.ndim == 2 else index, transposed=transposed)

    def fold(axis_size, x, w, index):  # vmap over x only: the batch becomes rows
        out = matmul(x.reshape(-1, x.shape[-1]), w, index if w.ndim == 3 else None, transposed)
        return out.reshape(axis_size, x.shape[1], -1)

    return inference_only(functools.partial(_ffi, transposed=transposed), ref, fold, name="matmul")


def matmul(x, w, index=None, transposed=False):
    """As reference.matmul; x [M <= MAX_ROWS, K] float, w float32 or bfloat16."""
    if x.shape[0] > MAX_ROWS:
        return reference.matmul(x, w, index=index, transposed=transposed)
    return _kernel(transposed)(x, w, jnp.int32(0) if index is None else index)
