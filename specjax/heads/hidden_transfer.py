"""Hidden Transfer (Wu et al. 2024, "Parallel Decoding via Hidden Transfer for Lossless Large
Language Model Acceleration"): at a transfer layer t, node v's hidden state becomes K pseudo
hidden states for the next K positions,

    pseudo_j = h_v + h_v W_j + b_j        (W_j, b_j zero-initialised: pseudo_j starts as a copy of h_v)

which then pass through the target's layers t..L-1 and its LM head inside the verify pass (see
`specjax.heads.guesses`). Only the transfer is trained: params (`PARAMS`) {"w": [K, E, E],
"b": [K, E]}.

No official code is public; this follows the paper: one linear transfer per future offset from
the last context token's layer-t state, pseudo states attending to the context and to each
other causally, KL distillation toward the target. The residual form and zero init are ours.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from specjax.heads.guesses import GuessLayout
from specjax.models.params import Param, shapes


class Dims(NamedTuple):
    num_guesses: int
    hidden_size: int


PARAMS = {"w": Param(lambda d: (d.num_guesses, d.hidden_size, d.hidden_size), (None, None, None), "zeros"),
          "b": Param(lambda d: (d.num_guesses, d.hidden_size), (None, None), "zeros")}


def init(num_guesses: int, hidden_size: int) -> dict:
    """The zero transfer: every pseudo state starts as a copy of its node's."""
    return {name: jnp.zeros(shape, jnp.float32)
            for name, shape in shapes(PARAMS, Dims(num_guesses, hidden_size)).items()}


def make(params: dict, layout: GuessLayout):
    """The pseudo states from the nodes' stream x [B, N, E] entering the transfer layer."""
    def pseudo(x):
        x32 = x.astype(jnp.float32)
        all_k = x32[:, :, None] + jnp.einsum("bne,kef->bnkf", x32, params["w"].astype(jnp.float32)) \
            + params["b"].astype(jnp.float32)  # [B, N, K, E]
        return all_k[:, layout.node, layout.offset - 1]
    return pseudo


def shape(params: dict) -> tuple[int, int]:
    """(guesses K, hidden size)."""
    return params["b"].shape


__all__ = ["PARAMS", "Dims", "init", "make", "shape"]
