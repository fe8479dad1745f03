"""The canvas a masked-diffusion LM decodes on: each row's prompt, left-padded to a common
length, then `gen_length` MASK slots. Shapes are static; pads are hidden from attention."""

from __future__ import annotations

from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np


class Canvas(NamedTuple):
    """tokens int32[B, P + G]: prompts left-padded to P, then the G generated slots (MASK until
    committed); valid bool[B, P + G]: False at the pads, which no position attends to."""

    tokens: jax.Array
    valid: jax.Array


def make_canvas(prompts: Sequence[Sequence[int]], gen_length: int, mask_id: int, pad_id: int = 0,
                prompt_width: int | None = None) -> Canvas:
    """Left-pad `prompts` (token ids) to the longest, or to `prompt_width` (one shape for many
    batches: one compile), and append `gen_length` MASK slots."""
    if not prompts or gen_length < 1:
        raise ValueError("need at least one prompt and gen_length >= 1")
    longest = max(len(p) for p in prompts)
    width = longest if prompt_width is None else prompt_width
    if width < longest:
        raise ValueError(f"a prompt of {longest} tokens does not fit a prompt width of {width}")
    tokens = np.full((len(prompts), width + gen_length), mask_id, np.int32)
    valid = np.ones(tokens.shape, bool)
    for row, prompt in enumerate(prompts):
        pad = width - len(prompt)
        tokens[row, :pad], valid[row, :pad] = pad_id, False
        tokens[row, pad:width] = prompt
    return Canvas(jnp.asarray(tokens), jnp.asarray(valid))


def key_mask(valid: jax.Array, num_queries: int) -> jax.Array:
    """bool[B, Q, T]: every query sees every non-pad position (a bidirectional forward's mask)."""
    return jnp.broadcast_to(valid[:, None, :], (valid.shape[0], num_queries, valid.shape[1]))
