"""The CPU kernel (cpu.cc through the XLA FFI): every row summed by the same code, so a row's
bits do not depend on how many rows are normed with it."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import ffi
from pallas_kernels.ffi.batching import inference_only
from pallas_kernels.rms_norm import reference

MAX_ELEMENTS = 64 * 8192  # a decode or verify step's rows (the matmul kernel's 64) of a wide model,
# or of its query / key heads (a per-head norm); beyond, XLA's fusion (a prefill)


def supports(rows: int, d: int) -> bool:
    return rows * d <= MAX_ELEMENTS and ffi.available()


def _ffi(x, w, *, eps, offset):
    return jax.ffi.ffi_call("specjax_rms_norm", jax.ShapeDtypeStruct(x.shape, jnp.float32))(
        x.astype(jnp.float32), w.astype(jnp.float32), eps=np.float32(eps), offset=np.float32(offset))


@functools.cache
def _kernel(eps: float, offset: float):
    ref = functools.partial(reference.rms_norm, eps=eps, offset=offset)

    def fold(axis_size, x, w):  # vmap over x only: the batch becomes rows
        return rms_norm(x.reshape(-1, x.shape[-1]), w, eps, offset).reshape(x.shape)

    return inference_only(functools.partial(_ffi, eps=eps, offset=offset),
                          lambda x, w: ref(x, w).astype(jnp.float32), fold, name="rms_norm")


def rms_norm(x, w, eps: float, offset: float = 0.0):
    """As reference.rms_norm, in float32; x [M, D], M * D <= MAX_ELEMENTS."""
    return _kernel(float(eps), float(offset))(x, w)
