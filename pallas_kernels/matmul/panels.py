"""PanelWeight: a float [K, N] matmul weight stored in column panels [N / tile, K, tile].

A decode step reads every weight once for a few rows, so its speed is the speed of that read.
Row-major [K, N], a block of output columns is K short pieces strided by N (too short for the
hardware prefetchers); in panels each block is one contiguous read. Leaves may carry leading
(stacked-layer) axes: data [..., N / tile, K, tile]. The values are the weight's own; only the
order in memory changes, and the CPU kernel sums each output in the same order either way.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PanelWeight:
    """A float [..., K, N] weight as `data` [..., N / tile, K, tile]; `tile` is static."""

    data: jax.Array
    tile: int = dataclasses.field(metadata=dict(static=True))

    @classmethod
    def of(cls, w: jax.Array, tile: int) -> "PanelWeight":
        """w [..., K, N] in panels of `tile` columns (tile must divide N)."""
        *lead, k, n = w.shape
        if n % tile:
            raise ValueError(f"N = {n} is not a multiple of the tile {tile}")
        return cls(jnp.moveaxis(w.reshape(*lead, k, n // tile, tile), -2, -3), tile)

    def untiled(self) -> jax.Array:
        """The weight [..., K, N], row-major."""
        *lead, panels, k, tile = self.data.shape
        return jnp.moveaxis(self.data, -3, -2).reshape(*lead, k, panels * tile)

    def layer(self, index) -> "PanelWeight":
        """Layer `index` (may be traced) of a stack [L, ...] of weights."""
        return dataclasses.replace(self, data=jax.lax.dynamic_index_in_dim(self.data, index, keepdims=False))

    @property
    def shape(self) -> tuple[int, ...]:
        """The logical shape [..., K, N]."""
        *lead, panels, k, tile = self.data.shape
        return (*lead, k, panels * tile)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype(self):
        return self.data.dtype
