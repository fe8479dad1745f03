"""A layer stack [L, ...] held as L separate buffers: how `sj.load` lays out the layer weights
on a GPU.

Scanned over a stack, each layer's weights are a slice of it, and XLA's GPU matmuls (Triton
fusions) take no slice as an operand: every layer's weights are copied out before their
matmuls, so a decode step reads each weight twice and writes it once. Held as one buffer per
layer and run by a layer loop unrolled at trace time (`specjax.models.llama.layer_loop`), each
matmul reads its weights where they lie (on an H200, the 8B-shaped bf16 decode step 13.6 ->
6.9 ms: benchmarks/gpu/h200-2026-11-27b); the price is a program that holds every layer, so
compiling takes longer. The CPU kernels read layers from their stacks in place and keep the
stacked layout; so does a TPU (not measured there).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from pallas_kernels import QuantizedWeight
from pallas_kernels.matmul import PanelWeight
from specjax.pytrees import register_dataclass


@register_dataclass
@dataclasses.dataclass(frozen=True)
class LayerList:
    """One weight of every layer: `layers[i]` is layer i's array or QuantizedWeight."""

    layers: tuple

    @classmethod
    def split(cls, stack) -> "LayerList":
        """The stack [L, ...] (an array or a QuantizedWeight) as L buffers."""
        one = (lambda i: stack.layer(i)) if isinstance(stack, QuantizedWeight) else (lambda i: stack[i])
        return cls(tuple(one(i) for i in range(stack.shape[0])))

    def layer(self, index: int):
        """Layer `index`'s weight, its own buffer. The index is a Python int: a scan over the
        layers (a traced index) would have to re-stack them, the copy this layout avoids."""
        if not isinstance(index, int):
            raise TypeError("a LayerList is indexed by a Python int: run its layers with "
                            "specjax.models.llama.layer_loop(..., unrolled=True), not a scan")
        return self.layers[index]

    def map(self, fn) -> "LayerList":
        """fn applied to each layer's weight."""
        return LayerList(tuple(fn(w) for w in self.layers))

    def untiled(self):
        """The row-major stack [L, ...] (the portable layout)."""
        laid_out = lambda w: isinstance(w, (QuantizedWeight, PanelWeight))
        return jax.tree.map(lambda *ws: jnp.stack(ws), *(w.untiled() if laid_out(w) else w for w in self.layers))

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.layers), *self.layers[0].shape)


def is_split(layers: dict) -> bool:
    """Whether params["layers"] holds LayerLists (then every leaf of it does)."""
    return any(isinstance(w, LayerList) for w in layers.values())
