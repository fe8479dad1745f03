"""Dense matmul for few rows (decode and verify): reference.py is the definition, cpu.cc the
CPU kernel (each weight read once for all rows); api.matmul picks one. panels.py: PanelWeight,
the layout the CPU kernel reads fastest."""

from pallas_kernels.matmul.api import kernel_layout, matmul, runs_cpu_kernel
from pallas_kernels.matmul.panels import PanelWeight

__all__ = ["PanelWeight", "kernel_layout", "matmul", "runs_cpu_kernel"]
