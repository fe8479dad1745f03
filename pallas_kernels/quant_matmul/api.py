"""quantized_matmul: the kernel for the backend, or the reference where no kernel applies."""

from __future__ import annotations

from pallas_kernels import ffi
from pallas_kernels.backend import pick_impl
from pallas_kernels.quant_matmul import cpu, gpu, reference, tpu
from pallas_kernels.quant_matmul.weight import QuantizedWeight


def quantized_matmul(x, qw: QuantizedWeight, *, index=None, act_bits: int | None = None,
                     out_dtype=None, interpret=False, impl: str | None = None):
    """x [M, K] (bf16 or f32) @ qw [K, N] -> [M, N] in `out_dtype` (default x's dtype),
    accumulated in float32 (int32 per group with act_bits=8: per-row dynamic int8 activations).
    With `index`, qw is a stack of layers [L, ...] and layer `index` (may be traced) is used:
    the CPU kernel reads it in place, other implementations slice it first.

    Runs the CPU, GPU or TPU kernel on those backends (see backend.pick_impl for `impl` and
    `interpret`; the CPU kernel for up to cpu.MAX_ROWS rows), the reference
    elsewhere or for shapes a kernel does not tile.
    """
    out_dtype = x.dtype if out_dtype is None else out_dtype
    impl = pick_impl(impl, interpret)
    if impl == "cpu" and cpu.supports(x, qw, act_bits):
        reference.check_inputs(x, qw if index is None else qw.layer(0), act_bits)
        return cpu.quantized_matmul(x, qw, index, act_bits).astype(out_dtype)
    if index is not None:
        qw = qw.layer(index)
    reference.check_inputs(x, qw, act_bits)
    qw = qw.untiled()  # the GPU / TPU kernels read the row-major layout
    if impl == "gpu" and gpu.supports(qw):
        return gpu.quantized_matmul(x, qw, act_bits=act_bits, out_dtype=out_dtype,
                                    interpret=interpret)
    if impl == "tpu" and tpu.supports(qw, act_bits):
        return tpu.quantized_matmul(x, qw, act_bits=act_bits, out_dtype=out_dtype,
                                    interpret=interpret)
    return reference.quantized_matmul(x, qw, act_bits=act_bits, out_dtype=out_dtype)


def runs_cpu_kernel(rows: int, act_bits: int | None) -> bool:
    """Whether a quantized matmul over `rows` rows runs the CPU kernel on jax's default backend
    (with int8 activations at any number of rows). The kernel reads a layer from its stack: a
    caller should then pass the stack and the layer's index rather than a slice."""
    return pick_impl(None, False) == "cpu" and (act_bits == 8 or rows <= cpu.MAX_ROWS) and ffi.available()


def kernel_layout(qw: QuantizedWeight) -> QuantizedWeight:
    """qw stored as the default backend's kernel reads it fastest: the CPU kernel's column panels
    where that kernel runs, the row-major layout elsewhere (the values are the same)."""
    return cpu.preferred_layout(qw) if pick_impl(None, False) == "cpu" else qw.untiled()
