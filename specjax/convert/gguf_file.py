"""A GGUF file's metadata and tensor index, read in one pass over its header.

`gguf.GGUFReader` builds a numpy view for every element of every metadata array, which costs
seconds per 50,000-token vocabulary (SmolLM2: 3.5 s; Gemma 3's 262,144 tokens: ~25 s) each time
a file is opened. Here the header is parsed with `struct` over the file's bytes (a string array
is one loop over its lengths, a number array one `np.frombuffer`), and each tensor's data is a
view of one read-only memory map, shaped as `gguf.GGUFReader` shapes it, so that
`gguf.quants.dequantize` reads it. Format: github.com/ggml-org/ggml/blob/master/docs/gguf.md.
"""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path
from typing import Any

import gguf
import numpy as np

VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
# value types: 0-7 and 10-12 are scalars (struct format), 8 a string, 9 an array
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
# tensor types that load as typed numbers; every other type is raw bytes, [..., bytes a row]
NUMBERS = {gguf.GGMLQuantizationType.F32: np.float32, gguf.GGMLQuantizationType.F16: np.float16,
           gguf.GGMLQuantizationType.F64: np.float64, gguf.GGMLQuantizationType.I8: np.int8,
           gguf.GGMLQuantizationType.I16: np.int16, gguf.GGMLQuantizationType.I32: np.int32,
           gguf.GGMLQuantizationType.I64: np.int64}


@dataclasses.dataclass(frozen=True)
class Tensor:
    """One tensor: `shape` in GGUF's order (the contiguous dimension first), `data` a read-only
    view in numpy's order (typed numbers for float and integer types, else uint8 bytes with
    the last axis a row's bytes, as `gguf.GGUFReader` gives it)."""

    name: str
    tensor_type: gguf.GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray


@dataclasses.dataclass(frozen=True)
class GGUFFile:
    """`fields`: the metadata by key (str, int, float, bool, or a list of them); `tensors` in
    the file's order."""

    path: Path
    fields: dict[str, Any]
    tensors: list[Tensor]


class _Header:
    """The file's bytes from an offset on, read value by value (little-endian)."""

    def __init__(self, buf: np.ndarray):
        self.buf, self.offset = buf, 0

    def scalar(self, fmt: str):
        (value,) = struct.unpack_from("<" + fmt, self.buf, self.offset)
        self.offset += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar("Q")
        end = self.offset + n
        if end > len(self.buf):
            raise ValueError("a string runs past the end of the file")
        text = bytes(self.buf[self.offset:end]).decode("utf-8")
        self.offset = end
        return text

    def value(self, kind: int):
        if kind in SCALARS:
            return self.scalar(SCALARS[kind])
        if kind == STRING:
            return self.string()
        if kind != ARRAY:
            raise ValueError(f"unknown metadata value type {kind}")
        item, count = self.scalar("I"), self.scalar("Q")
        if item in SCALARS:  # one read for the whole array
            dtype = np.dtype(SCALARS[item]).newbyteorder("<")
            values = np.frombuffer(self.buf, dtype, count, self.offset)
            self.offset += count * dtype.itemsize
            return values.tolist()
        return [self.value(item) for _ in range(count)]


def read(path: str | Path) -> GGUFFile:
    """Parse a GGUF file (memory-mapped: tensor data is read when used). ValueError, in one line,
    for a file that is not GGUF, or is truncated, corrupt, big-endian or of another version."""
    path = Path(path)
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ValueError(f"not a GGUF file (magic {magic!r}, expected b'GGUF')")
    try:
        return _parse(path)
    except ValueError as e:
        raise ValueError(f"truncated or corrupt GGUF file ({e})") from None


def _parse(path: Path) -> GGUFFile:
    buf = np.memmap(path, np.uint8, mode="r")
    head = _Header(buf)
    head.offset = 4  # past the magic
    try:
        version = head.scalar("I")
        if version not in VERSIONS:
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            raise ValueError("a big-endian GGUF file (not supported)" if swapped in VERSIONS
                             else f"GGUF version {version} (supported: {VERSIONS})")
        num_tensors, num_fields = head.scalar("Q"), head.scalar("Q")
        fields = {}
        for _ in range(num_fields):
            key = head.string()
            fields[key] = head.value(head.scalar("I"))
        index = []
        for _ in range(num_tensors):
            name = head.string()
            dims = tuple(head.scalar("Q") for _ in range(head.scalar("I")))
            index.append((name, gguf.GGMLQuantizationType(head.scalar("I")), dims, head.scalar("Q")))
    except struct.error:
        raise ValueError("the header runs past the end of the file") from None
    alignment = fields.get("general.alignment", DEFAULT_ALIGNMENT)
    if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"general.alignment must be a power of two, got {alignment!r}")
    start = -(-head.offset // alignment) * alignment
    tensors, names = [], set()
    for name, kind, dims, offset in index:
        if name in names:
            raise ValueError(f"tensor {name} appears twice")
        names.add(name)
        tensors.append(_tensor(buf, name, kind, dims, start + offset))
    return GGUFFile(path, fields, tensors)


def _tensor(buf: np.ndarray, name: str, kind: gguf.GGMLQuantizationType, dims: tuple[int, ...],
            offset: int) -> Tensor:
    shape = dims[::-1]  # numpy's order
    block, block_bytes = gguf.GGML_QUANT_SIZES[kind]
    if kind in NUMBERS:
        dtype = np.dtype(NUMBERS[kind])
    else:
        if shape and shape[-1] % block:
            raise ValueError(f"tensor {name}: a row of {shape[-1]} is not whole blocks of {block}")
        dtype, shape = np.dtype(np.uint8), (*shape[:-1], shape[-1] // block * block_bytes)
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if offset + size > len(buf):
        raise ValueError(f"tensor {name} runs past the end of the file")
    data = buf[offset:offset + size].view(dtype).reshape(shape)
    return Tensor(name, kind, dims, data)
