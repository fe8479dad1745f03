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
        if w.shape[-1] % tile:
            raise ValueError(f"N = {w.shape[-1]} is not a multiple of the tile {tile}")
        return cls(to_panels(w, tile, 2), tile)

    def untiled(self) -> jax.Array:
        """The weight [..., K, N], row-major."""
        return from_panels(self.data, 2)

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


def to_panels(a, tile: int, trailing: int):
    """[..., *inner, N] (`trailing` = 1 + len(inner)) -> [..., N/tile, *inner, tile]: column
    panels (PanelWeight's data; a QuantizedWeight's data and scales)."""
    return jnp.moveaxis(a.reshape(*a.shape[:-1], -1, tile), -2, -trailing - 1)


def from_panels(a, trailing: int):
    """The inverse of to_panels."""
    a = jnp.moveaxis(a, -trailing - 1, -2)
    return a.reshape(*a.shape[:-2], -1)
