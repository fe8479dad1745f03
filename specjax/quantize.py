"""Weight-only quantization of a Model: int8 / int4 group-wise matmul weights.

The layer matmuls (stacked [L, K, N]) and an untied lm_head [E, V] become QuantizedWeight
pytrees (leaves stacked on the layer axis, so the layer scan slices them as it slices arrays);
`dense` in the forward then runs the quantized-matmul kernel. Embeddings, norms and biases stay
as they are.
"""

from __future__ import annotations

import pallas_kernels
from specjax.models import Model

LAYER_MATMULS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
MODES = {"int8": 8, "int4": 4}


def quantize(model: Model, mode: str, group_size: int = 128) -> Model:
    """The model with its matmul weights quantized to `mode` ("int8" or "int4"), symmetric,
    one scale per `group_size` input rows and output column."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")

    def one(name, w):
        if isinstance(w, pallas_kernels.QuantizedWeight):
            raise ValueError(f"{name} is already quantized")
        try:
            return pallas_kernels.quantize(w, MODES[mode], group_size)
        except ValueError as e:
            raise ValueError(f"cannot quantize {name} {tuple(w.shape)}: {e}") from None

    layers = dict(model.params["layers"])
    for name in LAYER_MATMULS:
        layers[name] = one(f"layers/{name}", layers[name])
    params = {**model.params, "layers": layers}
    if "lm_head" in params:
        params["lm_head"] = one("lm_head", params["lm_head"])
    return Model(params, model.config)
