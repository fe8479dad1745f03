"""matmul: the CPU kernel for the decode and verify rows, XLA's dot elsewhere."""

from __future__ import annotations

from pallas_kernels.backend import pick_impl
from pallas_kernels.matmul import cpu, reference


def matmul(x, w, *, index=None, transposed=False, impl: str | None = None):
    """x [M, K] @ W -> float32 [M, N] (contract: reference.matmul; W = w[index] of a stack).

    On CPU (see backend.pick_impl) the kernel runs for up to cpu.MAX_ROWS rows of float32 or
    bfloat16 weights, reading the layer straight from its stack; XLA's dot runs otherwise and
    on GPU and TPU, where it is already at the roofline for these shapes.
    """
    if pick_impl(impl, False) == "cpu" and cpu.supports(x, w):
        return cpu.matmul(x, w, index, transposed)
    return reference.matmul(x, w, index=index, transposed=transposed)


def kernel_layout(w):
    """A float layer stack [..., K, N] as the default backend's matmul reads it fastest: a
    PanelWeight where the CPU kernel runs (when N allows), the array itself elsewhere."""
    return cpu.preferred_layout(w) if pick_impl(None, False) == "cpu" else w


def runs_cpu_kernel(rows: int) -> bool:
    """Whether a matmul over `rows` rows runs the CPU kernel on jax's default backend. The
    kernel reads a layer from its stack: a caller should then pass the stack and the layer's
    index rather than a slice, which XLA would copy out of the stack first."""
    return pick_impl(None, False) == "cpu" and rows <= cpu.MAX_ROWS
