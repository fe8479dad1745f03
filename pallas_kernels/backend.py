"""Which implementation of an op runs: the kernel for the backend, or the pure-JAX reference."""

from __future__ import annotations

import jax

IMPLS = ("reference", "cpu", "gpu", "tpu")


def pick_impl(impl: str | None, interpret) -> str:
    """`impl` if given; else the kernel for jax's default backend ("gpu" / "tpu" / "cpu", the
    last when the CPU kernels built, see pallas_kernels.ffi; else "reference"). On CPU,
    interpret mode picks a Pallas kernel instead — `interpret=True` runs the GPU (Triton-style)
    kernel in HLO interpret mode, a `pltpu.InterpretParams` the TPU kernel in TPU interpret mode. Under a multi-device mesh (`jax.set_mesh`): "reference",
    which XLA partitions over the mesh; a kernel is one device's code."""
    if impl is not None:
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
        return impl
    if jax.sharding.get_abstract_mesh().size > 1:
        return "reference"
    backend = jax.default_backend()
    if backend in ("gpu", "tpu"):
        return backend
    if interpret is True:
        return "gpu"
    if interpret:
        return "tpu"
    from pallas_kernels import ffi  # builds the kernels on first use
    return "cpu" if backend == "cpu" and ffi.available() else "reference"
