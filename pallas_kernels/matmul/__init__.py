"""Dense matmul for few rows (decode and verify): reference.py is the definition, cpu.cc the
CPU kernel (each weight read once for all rows); api.matmul picks one."""

from pallas_kernels.matmul.api import runs_cpu_kernel, matmul

__all__ = ["runs_cpu_kernel", "matmul"]
