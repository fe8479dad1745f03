"""The CPU kernel (cpu.cc through the XLA FFI): rows of float32 scores, each split in chunks
across the cores; the first maximum (or NaN) of a row is jnp.argmax's."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import ffi


def supports(x) -> bool:
    """Float scores with at least one entry a row (integers keep XLA's exact compare)."""
    return jnp.issubdtype(x.dtype, jnp.floating) and x.ndim >= 1 and x.size > 0 and ffi.available()


@jax.custom_batching.custom_vmap
def _rows(x):
    return jax.ffi.ffi_call("specjax_argmax", jax.ShapeDtypeStruct(x.shape[:1], jnp.int32))(x.astype(jnp.float32))


@_rows.def_vmap
def _fold(axis_size, in_batched, x):  # the batch becomes rows
    return _rows(x.reshape(-1, x.shape[-1])).reshape(x.shape[:-1]), True


@jax.custom_jvp
def argmax(x):
    """As reference.argmax for x [M, V] float32 (another float dtype is widened first, exactly)."""
    return _rows(x)


@argmax.defjvp
def _jvp(primals, tangents):  # an index: no tangent (argmax inside a differentiated function)
    out = argmax(*primals)
    return out, np.zeros(out.shape, jax.dtypes.float0)
