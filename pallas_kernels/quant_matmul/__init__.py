"""Weight-only int8 / int4 matmul with group-wise scales (and W8A8).

weight.py defines QuantizedWeight and (de)quantization, reference.py the matmul; gpu.py
(Pallas Triton) and tpu.py (Pallas Mosaic) are the kernels; api.quantized_matmul picks one.
"""

from pallas_kernels.quant_matmul.api import kernel_layout, quantized_matmul, runs_cpu_kernel
from pallas_kernels.quant_matmul.weight import QuantizedWeight, dequantize, quantize

__all__ = ["QuantizedWeight", "dequantize", "kernel_layout", "quantize", "quantized_matmul", "runs_cpu_kernel"]
