"""Where each block of a semi-autoregressive dLLM decode ends: fixed-length blocks (LLaDA,
Fast-dLLM) or AdaBlock-dLLM's semantic blocks, decided per row at the block's first forward."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from specjax.diffusion.rules import Prediction


@dataclasses.dataclass(frozen=True)
class Blocks:
    """Blocks of `length` generated slots (length = gen_length: one block, pure diffusion)."""

    length: int = 32

    def __post_init__(self):
        if self.length < 1:
            raise ValueError(f"block length must be >= 1, got {self.length}")

    def max_width(self, gen_length: int) -> int:
        return min(self.length, gen_length)

    def end(self, pred: Prediction, start: jax.Array, gen_end: int, gen_length: int) -> jax.Array:
        return jnp.minimum(start + self.length, gen_end)


@dataclasses.dataclass(frozen=True)
class AdaBlock:
    """AdaBlock-dLLM: look at the next `window` x gen_length slots; if one is predicted to be a
    delimiter (LLaDA: "\\n") with probability >= `threshold`, the block ends right after the
    most confident such slot; else it is `init_length` long."""

    init_length: int = 32
    delimiters: tuple[int, ...] = (198,)
    threshold: float = 0.3
    window: float = 0.25

    def max_width(self, gen_length: int) -> int:
        return min(max(self.init_length, self._window(gen_length)), gen_length)

    def _window(self, gen_length: int) -> int:
        return max(1, math.ceil(self.window * gen_length))

    def end(self, pred: Prediction, start: jax.Array, gen_end: int, gen_length: int) -> jax.Array:
        pos = jnp.arange(pred.x0.shape[-1])[None, :]
        in_window = (pos >= start[:, None]) & (pos < start[:, None] + self._window(gen_length)) & (pos < gen_end)
        is_delimiter = jnp.isin(pred.x0, jnp.asarray(self.delimiters))
        score = jnp.where(in_window & is_delimiter, pred.conf, -1.0)
        best = jnp.argmax(score, axis=-1)
        found = jnp.max(score, axis=-1) >= self.threshold
        return jnp.where(found, best + 1, jnp.minimum(start + self.init_length, gen_end)).astype(jnp.int32)
