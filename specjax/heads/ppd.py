"""PPD (Chen et al. 2024, "Hardware-Aware Parallel Prompt Decoding"): K trained prompt tokens,
each an ensemble of `members` virtual tokens, appended after the input; through the frozen
target, prompt token j predicts the token j + 1 steps ahead (see `specjax.heads.guesses`).
Only their embeddings are trained: params (`PARAMS`) {"prompt": [K, members, E]}.

Follows the official code (hmarkc/parallel-prompt-decoding): the "ensemble" attention mask,
mean aggregation of the members' logits, the KD loss of `specjax.train.objectives.guesses`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from specjax.heads.guesses import GuessLayout
from specjax.models.params import Param, shapes


class Dims(NamedTuple):
    num_guesses: int
    members: int
    hidden_size: int


PARAMS = {"prompt": Param(lambda d: (d.num_guesses, d.members, d.hidden_size), (None, None, None))}


def init(key: jax.Array, num_guesses: int, members: int, embed: jax.Array) -> dict:
    """Prompt embeddings around the target's token embeddings: their mean plus noise of their
    per-dimension spread."""
    embed = jnp.asarray(embed, jnp.float32)
    noise = jax.random.normal(key, shapes(PARAMS, Dims(num_guesses, members, embed.shape[1]))["prompt"])
    return {"prompt": embed.mean(0) + noise * embed.std(0)}


def make(params: dict, layout: GuessLayout):
    """The guesses' input embeddings (they enter with the tokens', at layer 0)."""
    def inputs(x):
        e = params["prompt"][layout.offset - 1, layout.member]  # [M, E]
        return jnp.broadcast_to(e, (x.shape[0], *e.shape))
    return inputs


def shape(params: dict) -> tuple[int, int, int]:
    """(guesses K, ensemble members, hidden size)."""
    return params["prompt"].shape


__all__ = ["PARAMS", "Dims", "init", "make", "shape"]
