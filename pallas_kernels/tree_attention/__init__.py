"""Tree attention for the verify step (prefix cache + tree block with an ancestor mask)."""

from pallas_kernels.tree_attention.reference import tree_attention

__all__ = ["tree_attention"]
