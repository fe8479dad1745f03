"""The CPU kernel (cpu.cc through the XLA FFI): each weight read once for all M rows."""

from __future__ import annotations

import ctypes
import functools

import jax
import jax.numpy as jnp

from pallas_kernels import ffi
from pallas_kernels.ffi.batching import inference_only
from pallas_kernels.matmul import reference
from pallas_kernels.matmul.panels import PanelWeight

MAX_ROWS = 64  # row-major weights: decode and verify rows; beyond, XLA's GEMM is as fast
DTYPES = (jnp.float32, jnp.bfloat16)


def panel_tile(n: int) -> int:
    """The panel width this host's kernel reads fastest for n output columns (cpu.cc's
    specjax_matmul_tile); 0 where none divides n, or without the kernels."""
    lib = ffi.library()
    return int(lib.specjax_matmul_tile(ctypes.c_int64(n))) if lib else 0


def preferred_layout(w):
    """A float layer stack [..., K, N] as the kernel reads it fastest: column panels of
    panel_tile(N), else as it is."""
    tile = panel_tile(w.shape[-1])
    return PanelWeight.of(w, tile) if tile else w


def supports(x, w) -> bool:
    """Up to MAX_ROWS rows of a row-major weight; any number of a PanelWeight (measured faster
    than XLA's GEMM at prefill's rows too, which would have to read the panels)."""
    rows_ok = isinstance(w, PanelWeight) or x.shape[0] <= MAX_ROWS
    return rows_ok and w.dtype in DTYPES and ffi.available()


def _ffi(x, w, index, *, transposed):
    n = w.shape[-2] if transposed else w.shape[-1]
    tile = w.tile if isinstance(w, PanelWeight) else 0
    stack = w.data if tile else w
    stack = stack if w.ndim == 3 else stack[None]
    return jax.ffi.ffi_call("specjax_matmul", jax.ShapeDtypeStruct((x.shape[0], n), jnp.float32))(
        x.astype(jnp.float32), stack, jnp.asarray(index, jnp.int32).reshape(()), nk=transposed,
        tile=tile)


@functools.cache
def _kernel(transposed: bool):
    def ref(x, w, index):
        return reference.matmul(x, w, index=None if w.ndim == 2 else index, transposed=transposed)

    def fold(axis_size, x, w, index):  # vmap over x only: the batch becomes rows
        out = matmul(x.reshape(-1, x.shape[-1]), w, index if w.ndim == 3 else None, transposed)
        return out.reshape(axis_size, x.shape[1], -1)

    return inference_only(functools.partial(_ffi, transposed=transposed), ref, fold, name="matmul")


def matmul(x, w, index=None, transposed=False):
    """As reference.matmul; x [M, K] float, w float32 or bfloat16 (an array, then M <= MAX_ROWS,
    or a PanelWeight)."""
    if not isinstance(w, PanelWeight) and x.shape[0] > MAX_ROWS:
        return reference.matmul(x, w, index=index, transposed=transposed)
    return _kernel(transposed)(x, w, jnp.int32(0) if index is None else index)
