"""Tree attention for the verify step (prefix cache + tree block with an ancestor mask).

reference.py is the definition; gpu.py (Pallas Triton) and tpu.py (Pallas Mosaic) are the
kernels; api.tree_attention picks one for the backend.
"""

from pallas_kernels.tree_attention.api import tree_attention

__all__ = ["tree_attention"]
