"""Which implementation of an op runs: the kernel for the backend, or the pure-JAX reference."""

from __future__ import annotations

import jax

IMPLS = ("reference", "gpu", "tpu")


def pick_impl(impl: str | None, interpret) -> str:
    """`impl` if given; else the kernel for jax's default backend ("gpu" / "tpu"). On other
    backends (CPU): "reference", unless interpret mode is asked for — `interpret=True` runs
    the GPU (Triton-style) kernel in HLO interpret mode, a `pltpu.InterpretParams` the TPU
    kernel in TPU interpret mode. Under a multi-device mesh (`jax.set_mesh`): "reference",
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
    return "reference"
