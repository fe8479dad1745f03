"""Quantization of a Model: int8 / int4 group-wise matmul weights (`quantize`), and optionally
int8 activations into those matmuls (`quantize_activations`).

The layer matmuls (stacked [L, K, N]) and the lm_head [E, V] become QuantizedWeight pytrees
(leaves stacked on the layer axis); `dense` in the forward then runs the quantized-matmul kernel.
A model with tied embeddings gets an int8 copy of the head (the embedding's transpose; int8 in
int4 mode too, as llama.cpp's quantizers keep the output head at higher precision: at int4 it
doubled the tiny model's logit error): the embedding itself stays float for the gather. Norms and
biases stay as they are. Quantized weights are stored as this host's kernel reads them fastest
(`pallas_kernels.kernel_layout`); checkpoints hold the row-major layout.
"""

from __future__ import annotations

import dataclasses
import functools

import jax

import pallas_kernels
from pallas_kernels.matmul import PanelWeight
from pallas_kernels.quant_matmul.weight import GROUP_SIZES
from specjax.models import Model
from specjax.models.layer_list import LayerList
from specjax.models.params import LLAMA, leaves

MODES = {"int8": 8, "int4": 4}


def largest_group(k: int, bits: int) -> int:
    """The largest supported group size whose planes tile K input rows (int4 packs two planes)."""
    fits = [g for g in GROUP_SIZES if k % ((8 // bits) * g) == 0]
    if not fits:
        raise ValueError(f"K = {k} is not a multiple of {(8 // bits) * min(GROUP_SIZES)}, so no group "
                         f"size in {GROUP_SIZES} fits int{bits}")
    return max(fits)


def quantize_weight(w, bits: int, group_size: int | None = None, name: str = "weight"):
    """One matmul weight [..., K, N] (an array, a PanelWeight or a LayerList of them) as a
    QuantizedWeight of `bits` in the kernels' layout; group_size None: `largest_group`."""
    if isinstance(w, LayerList):
        return w.map(lambda layer: quantize_weight(layer, bits, group_size, name))
    if isinstance(w, pallas_kernels.QuantizedWeight):
        raise ValueError(f"{name} is already quantized")
    try:
        g = group_size if group_size is not None else largest_group(w.shape[-2], bits)
        if isinstance(w, PanelWeight):
            w = w.untiled()
        return pallas_kernels.kernel_layout(pallas_kernels.quantize(w, bits, g))
    except ValueError as e:
        raise ValueError(f"cannot quantize {name} {tuple(w.shape)}: {e}") from None


def is_quantized(model: Model) -> bool:
    """Whether `model`'s layer weights are quantized (`QuantizedWeight`s: `quantize`, a Q8_0 /
    Q4_0 GGUF)."""
    first = lambda w: w.layers[0] if isinstance(w, LayerList) else w
    return any(isinstance(first(w), pallas_kernels.QuantizedWeight) for w in model.params["layers"].values())


def quantize(model: Model, mode: str, group_size: int | None = None) -> Model:
    """The model with its matmul weights (those declared `matmul` in `specjax.models.params`)
    quantized to `mode` ("int8" or "int4"), symmetric, one scale per `group_size` input rows and
    output column. The default (None) takes, per matrix, the largest supported group (of 32,
    64, 128) that divides its K: a model whose widths are not multiples of 128 (the shipped
    tiny's 704) quantizes as is."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")

    params = {k: dict(v) if isinstance(v, dict) else v for k, v in model.params.items()}  # to set leaves in
    for leaf in leaves(LLAMA, model.config):
        if leaf.param.matmul:
            *parents, name = leaf.path
            node = functools.reduce(dict.__getitem__, parents, params)
            node[name] = quantize_weight(node[name], MODES[mode], group_size, "/".join(leaf.path))
    if model.config.tie_word_embeddings:  # a quantized copy for the head; the gather stays float
        params["lm_head"] = quantize_weight(params["embed"].T, 8, group_size, "lm_head")
    return Model(params, model.config)


def quantize_activations(model: Model, bits: int | None = 8) -> Model:
    """The model with each quantized matmul (`quantize`, a Q8_0 / Q4_0 GGUF) taking `bits`-bit
    activations: 8 rounds each row of a matmul's input to int8 with one scale (max |x| / 127)
    and sums the products in int32 per group (W8A8 / W4A8; AVX-512 VNNI on CPUs that have it),
    None gives back float activations. It changes the model's numbers slightly (on SmolLM2
    int4, +2% in the negative log-likelihood of the float model's own answers); every exact
    method stays exact, since drafts are verified by the same matmuls."""
    if bits not in (None, 8):
        raise ValueError(f"activation bits must be 8 or None, got {bits!r}")
    if not is_quantized(model):
        raise ValueError("the model has no quantized matmuls: quantize its weights first (sj.quantize)")
    relay = lambda w: pallas_kernels.kernel_layout(dataclasses.replace(w, act_bits=bits))  # their kernel's layout
    return Model(map_quantized(model.params, relay), model.config)


def map_quantized(params, fn):
    """params with `fn` applied to every QuantizedWeight."""
    quantized = lambda x: isinstance(x, pallas_kernels.QuantizedWeight)
    return jax.tree.map(lambda x: fn(x) if quantized(x) else x, params, is_leaf=quantized)
