"""Pallas kernels used by specjax; each op folder has reference.py (pure JAX, the definition)."""

from pallas_kernels.tree_attention import tree_attention

__all__ = ["tree_attention"]
