"""QuantizedWeight: a symmetric, group-wise int8 / int4 matmul weight, and its (de)quantizer.

Layout of a [K, N] weight with P = 8 // bits values per byte (P = 1 for int8, 2 for int4):
the K rows are cut into P planes of K / P rows; byte (r, n) of `data` holds plane p's row r in
bits [4p, 4p + 4) (int4) or whole (int8), so plane p is rows [p K/P, (p+1) K/P) of the weight.
Each plane is cut into groups of `group_size` rows sharing one scale per column:
    w[p K/P + r, n] ~= q[p, r, n] * scales[p, r // group_size, n].
Keeping the planes apart (rather than interleaving neighbouring rows in a byte) lets a kernel
unpack with a shift and a mask and multiply each plane by a contiguous slice of x.

Leaves may carry leading axes (a stack of layers): data [..., K/P, N], scales [..., P, K/(P g), N].

With `tile` t > 0 the same values are stored in column panels of t (the CPU kernel's layout: a
panel is one contiguous read, where a row-major [K/P, N] read strides by N for every row):
data [..., N/t, K/P, t], scales [..., N/t, P, K/(P g), t]. `tiled` and `untiled` convert.

In `quads` (the CPU kernel's layout for int8 activations: `in_quads`) each 4 consecutive rows of
the data (of each panel) are stored column by column, a column's 4 bytes together, and offset to
unsigned (a value + 128, a nibble + 8): a 64-byte vector is then 16 columns' 4-row dot-product
operands, as AVX-512 VNNI multiplies them, with nothing to rearrange.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from pallas_kernels.matmul.panels import from_panels, to_panels

BITS = (8, 4)
GROUP_SIZES = (32, 64, 128)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QuantizedWeight:
    """A quantized [K, N] weight: int8 `data` [..., K/P, N], float32 `scales`
    [..., P, K/(P*group_size), N] (or their column panels, see `tile`); `bits`, `group_size`,
    `in_features` (K), `out_features` (N), `tile`, `quads` and `act_bits` are static. `act_bits` is what
    a model's matmul passes to `quantized_matmul` with this weight: None (float activations) or 8
    (each row of activations rounded to int8: W8A8 / W4A8); with 8 the CPU kernel reads the rows
    in `quads` (4 rows a column in 4 bytes, see the module's docstring)."""

    data: jax.Array
    scales: jax.Array
    bits: int = dataclasses.field(metadata=dict(static=True))
    group_size: int = dataclasses.field(metadata=dict(static=True))
    in_features: int = dataclasses.field(metadata=dict(static=True))
    out_features: int = dataclasses.field(metadata=dict(static=True))
    tile: int = dataclasses.field(default=0, metadata=dict(static=True))
    act_bits: int | None = dataclasses.field(default=None, metadata=dict(static=True))
    quads: bool = dataclasses.field(default=False, metadata=dict(static=True))

    @property
    def pack(self) -> int:
        """Values per byte: 1 (int8) or 2 (int4)."""
        return 8 // self.bits

    def layer(self, index) -> "QuantizedWeight":
        """Layer `index` (may be traced) of a stack [L, ...] of weights."""
        take = lambda a: jax.lax.dynamic_index_in_dim(a, index, keepdims=False)
        return dataclasses.replace(self, data=take(self.data), scales=take(self.scales))

    @property
    def lead_shape(self) -> tuple[int, ...]:
        """The leading (stacked-layer) axes of the leaves."""
        return self.data.shape[:self.data.ndim - (3 if self.tile else 2)]

    def tiled(self, tile: int) -> "QuantizedWeight":
        """The same weight stored in column panels of `tile` (which must divide N; 0: row-major),
        not in quads."""
        if (tile, False) == (self.tile, self.quads):
            return self
        if self.tile or self.quads:
            return self.untiled().tiled(tile)
        if self.out_features % tile:
            raise ValueError(f"N = {self.out_features} is not a multiple of the tile {tile}")
        return dataclasses.replace(self, data=to_panels(self.data, tile, 2),
                                   scales=to_panels(self.scales, tile, 3), tile=tile)

    def untiled(self) -> "QuantizedWeight":
        """The same weight in the row-major layout (data [..., K/P, N]), not in quads."""
        if self.quads:
            return dataclasses.replace(self, data=_from_quads(self.data, self.bits), quads=False).untiled()
        if not self.tile:
            return self
        return dataclasses.replace(self, data=from_panels(self.data, 2),
                                   scales=from_panels(self.scales, 3), tile=0)

    def in_quads(self) -> "QuantizedWeight":
        """The same weight, panels (or row-major) as they are, with its rows in quads."""
        if self.quads:
            return self
        return dataclasses.replace(self, data=_to_quads(self.data, self.bits), quads=True)

    @property
    def shape(self) -> tuple[int, ...]:
        """The logical shape [..., K, N] of the weight."""
        return (*self.lead_shape, self.in_features, self.out_features)


def _offset(bits: int):
    """The byte that offsets a stored value to unsigned, as an int8: 0x80 (int8), 0x88 (int4)."""
    return jnp.int8(-128 if bits == 8 else -120)


def _to_quads(data, bits: int):
    """[..., R, C] -> each 4 rows column by column ([..., R/4, C, 4] in memory), offset."""
    *lead, r, c = data.shape
    quads = jnp.swapaxes(data.reshape(*lead, r // 4, 4, c), -1, -2).reshape(*lead, r, c)
    return quads ^ _offset(bits)


def _from_quads(data, bits: int):
    """The inverse of _to_quads."""
    *lead, r, c = data.shape
    return jnp.swapaxes((data ^ _offset(bits)).reshape(*lead, r // 4, c, 4), -1, -2).reshape(*lead, r, c)


def _check_format(bits: int, group_size: int, k: int):
    if bits not in BITS:
        raise ValueError(f"bits must be 8 or 4, got {bits}")
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {GROUP_SIZES}, got {group_size}")
    pack = 8 // bits
    if k % (pack * group_size):
        raise ValueError(f"K = {k} must be divisible by {pack * group_size} "
                         f"({pack} plane(s) of groups of {group_size}) for int{bits}")


def unpack(data, bits: int):
    """int8 data [..., K/P, N] -> the P planes [..., K/P, N]: (data,) for int8, two int32
    planes of values in [-8, 8) for int4."""
    if bits == 8:
        return (data,)
    d = data.astype(jnp.int32)
    return (d << 28) >> 28, d >> 4  # arithmetic shifts sign-extend each nibble


@functools.partial(jax.jit, static_argnames=("bits", "group_size"))
def quantize(w, bits: int = 8, group_size: int = 128) -> QuantizedWeight:
    """Symmetric group-wise quantization of w [..., K, N] along K (max-abs scale per group and
    column, round to nearest, values in [-(2^(b-1)-1), 2^(b-1)-1])."""
    *lead, k, n = w.shape
    _check_format(bits, group_size, k)
    pack = 8 // bits
    qmax = 2 ** (bits - 1) - 1
    groups = w.astype(jnp.float32).reshape(*lead, pack, k // (pack * group_size), group_size, n)
    scales = jnp.max(jnp.abs(groups), axis=-2) / qmax  # [..., P, K/(P g), N]
    safe = jnp.where(scales == 0, 1.0, scales)
    q = jnp.clip(jnp.round(groups / safe[..., None, :]), -qmax, qmax).astype(jnp.int32)
    q = q.reshape(*lead, pack, k // pack, n)
    data = q[..., 0, :, :] if bits == 8 else (q[..., 0, :, :] & 0xF) | (q[..., 1, :, :] << 4)
    return QuantizedWeight(data.astype(jnp.int8), scales, bits, group_size, k, n)


@jax.jit
def dequantize(qw: QuantizedWeight):
    """QuantizedWeight -> float32 [..., K, N]."""
    qw = qw.untiled()
    planes = jnp.stack(unpack(qw.data, qw.bits), axis=-3)  # [..., P, K/P, N]
    *lead, pack, rows, n = planes.shape
    g = qw.group_size
    w = planes.reshape(*lead, pack, rows // g, g, n).astype(jnp.float32) * qw.scales[..., None, :]
    return w.reshape(*lead, qw.in_features, n)
