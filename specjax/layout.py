"""Where a model's weights sit in memory: as this host's kernels read them fastest, or in the
row-major layout that checkpoints and HF folders hold. The values are the same either way.

On CPU the kernels read quantized weights and the float layer stacks ([L, K, N] in
params["layers"]) in column panels, where a block of output columns is one contiguous read
(`pallas_kernels.QuantizedWeight.tile`, `pallas_kernels.PanelWeight`); elsewhere every
weight stays row-major, and on a GPU each layer's weights get their own buffers
(`specjax.models.layer_list.LayerList`: XLA's GPU matmuls would copy a slice of a stack).
`sj.load` gives the kernel layout; `sj.save` writes the portable one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import pallas_kernels
from pallas_kernels import QuantizedWeight
from pallas_kernels.matmul import PanelWeight
from pallas_kernels.matmul import kernel_layout as float_kernel_layout
from specjax.models.layer_list import LayerList, is_split
from specjax.quantize import map_quantized


def kernel_layout(params: dict, *, consume: bool = False) -> dict:
    """params laid out as the default backend's kernels read them fastest. `consume`: the caller
    gives `params` up (a loader), so each layer stack is freed once laid out anew, and loading
    holds the model plus one stack at most rather than the model twice."""
    params = map_quantized(params, pallas_kernels.kernel_layout)
    if "layers" not in params or is_split(params["layers"]):
        return params
    float_stack = lambda w: isinstance(w, jax.Array) and w.ndim == 3 and jnp.issubdtype(w.dtype, jnp.floating)
    if jax.default_backend() == "gpu":
        lay = LayerList.split
    else:
        lay = lambda w: float_kernel_layout(w) if float_stack(w) else w
    layers = {}
    for name, w in params["layers"].items():
        layers[name] = lay(w)
        if consume and layers[name] is not w:
            jax.block_until_ready(layers[name])  # the copy made, before its source goes
            for leaf in jax.tree.leaves(w):
                leaf.delete()
    return {**params, "layers": layers}


def portable_layout(params):
    """params (or any pytree holding weights) in the row-major layout: every QuantizedWeight
    untiled, every PanelWeight back to its [..., K, N] array, every LayerList re-stacked."""
    laid_out = lambda x: isinstance(x, (QuantizedWeight, PanelWeight, LayerList))
    return jax.tree.map(lambda x: x.untiled() if laid_out(x) else x, params, is_leaf=laid_out)
