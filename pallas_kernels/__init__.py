"""The kernels used by specjax. Each op folder has reference.py (pure JAX, the definition),
its kernels (cpu.cc through the XLA FFI, gpu.py and tpu.py in Pallas) and api.py (picks one
for the backend)."""

from pallas_kernels.argmax import argmax
from pallas_kernels.matmul import PanelWeight, matmul
from pallas_kernels.quant_matmul import (QuantizedWeight, dequantize, kernel_layout, quantize,
                                         quantized_matmul)
from pallas_kernels.rms_norm import rms_norm
from pallas_kernels.tree_attention import tree_attention

__all__ = ["PanelWeight", "QuantizedWeight", "argmax", "dequantize", "kernel_layout", "matmul", "quantize",
           "quantized_matmul", "rms_norm", "tree_attention"]
