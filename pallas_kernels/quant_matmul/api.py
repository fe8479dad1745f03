"""quantized_matmul: the kernel for the backend, or the reference where no kernel applies."""

from __future__ import annotations

from pallas_kernels.backend import pick_impl
from pallas_kernels.quant_matmul import gpu, reference, tpu
from pallas_kernels.quant_matmul.weight import QuantizedWeight


def quantized_matmul(x, qw: QuantizedWeight, *, act_bits: int | None = None, out_dtype=None,
                     interpret=False, impl: str | None = None):
    """x [M, K] (bf16 or f32) @ qw [K, N] -> [M, N] in `out_dtype` (default x's dtype),
    accumulated in float32 (int32 per group with act_bits=8: per-row dynamic int8 activations).

    Runs the GPU or TPU kernel on those backends (see backend.pick_impl for `impl` and
    `interpret`), the reference elsewhere or for shapes a kernel does not tile.
    """
    reference.check_inputs(x, qw, act_bits)
    impl = pick_impl(impl, interpret)
    if impl == "gpu" and gpu.supports(qw):
        return gpu.quantized_matmul(x, qw, act_bits=act_bits, out_dtype=out_dtype,
                                    interpret=interpret)
    if impl == "tpu" and tpu.supports(qw, act_bits):
        return tpu.quantized_matmul(x, qw, act_bits=act_bits, out_dtype=out_dtype,
                                    interpret=interpret)
    return reference.quantized_matmul(x, qw, act_bits=act_bits, out_dtype=out_dtype)
