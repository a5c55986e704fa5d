"""Parsing and validating a GGUF image: header, metadata, tensor infos.

Everything a later read depends on is checked here, once, so that a tensor the reader hands out
can always be viewed, reshaped and dequantized as its shape says. The tensor-info checks are
those of llama.cpp's gguf_init_from_file_impl, and stricter where llamatui's numpy views need it:
every dimension at least 1, element count and byte size within int64 and the file, at most
GGML_MAX_DIMS dimensions, a known type, rows a whole number of its blocks, offsets aligned and
inside the data section, no two tensors sharing a name or bytes. Each failure is a GGUFError
that names the field (or tensor) and what is wrong, with the offset in the file.
"""
from __future__ import annotations

import itertools
import math
import struct
from typing import NamedTuple

import numpy as np

from ..catalog import GGML_TYPES_BY_ID, GGMLType
from .metadata import LazyStrings, Metadata, string_array_end
from .tensor import GGUFTensor
from .values import (DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_NESTING, MAX_DIMS, SCALAR_DTYPES,
                     SCALAR_FORMATS, SCALAR_SIZES, SUPPORTED_VERSIONS, GGUFError, GGUFValueType,
                     ValueType)

INT64_MAX = (1 << 63) - 1  # ggml counts elements and bytes in int64


class Cursor:
    """Bounds-checked cursor over the mapped file; every failure names the field and offset."""

    def __init__(self, buf: np.ndarray, mem):
        self.buf = buf  # uint8 view of the whole file
        self.mem = mem  # the same bytes, for struct.unpack_from
        self.pos = 0
        self.end = len(buf)

    def fail(self, what: str, offset: int | None = None) -> GGUFError:
        return GGUFError(f"{what} (at offset {self.pos if offset is None else offset})")

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.end:
            raise self.fail(f"truncated file: {what} needs {n} bytes but only "
                            f"{max(self.end - self.pos, 0)} remain")

    def scalar(self, vtype: GGUFValueType, what: str):
        size = SCALAR_SIZES[vtype]
        self.need(size, what)
        (value,) = struct.unpack_from(SCALAR_FORMATS[vtype], self.mem, self.pos)
        self.pos += size
        return value

    def u32(self, what: str) -> int:
        return self.scalar(GGUFValueType.UINT32, what)

    def u64(self, what: str) -> int:
        return self.scalar(GGUFValueType.UINT64, what)

    def string(self, what: str) -> str:
        start = self.pos
        n = self.u64(f"length of {what}")
        if n > self.end - self.pos:
            raise self.fail(f"{what}: string length {n} runs past the end of the file", start)
        raw = bytes(self.mem[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", "surrogateescape")

    def value_type(self, what: str) -> GGUFValueType:
        start = self.pos
        code = self.u32(f"type of {what}")
        try:
            return GGUFValueType(code)
        except ValueError:
            raise self.fail(f"{what}: unknown metadata value type {code}", start) from None

    def value(self, vtype: GGUFValueType, what: str, depth: int = 0):
        """Returns (ValueType, value); array values may be lazy (see Metadata)."""
        if vtype == GGUFValueType.STRING:
            return ValueType(vtype), self.string(what)
        if vtype != GGUFValueType.ARRAY:
            return ValueType(vtype), self.scalar(vtype, what)
        if depth >= MAX_ARRAY_NESTING:
            raise self.fail(f"{what}: arrays nested deeper than {MAX_ARRAY_NESTING}")
        etype = self.value_type(f"element type of {what}")
        start = self.pos
        count = self.u64(f"element count of {what}")
        if etype in SCALAR_DTYPES:
            dtype = SCALAR_DTYPES[etype]
            if count > (self.end - self.pos) // dtype.itemsize:
                raise self.fail(f"{what}: {count} elements of {etype.name} run past the end of "
                                "the file", start)
            data = self.buf[self.pos:self.pos + count * dtype.itemsize].view(dtype)
            self.pos += count * dtype.itemsize
            return ValueType(vtype, ValueType(etype)), data
        if etype == GGUFValueType.STRING:
            return ValueType(vtype, ValueType(etype)), self.strings(count, what, start)
        element, items = self.arrays(count, what, start, depth)
        return ValueType(vtype, element), items

    def strings(self, count: int, what: str, start: int) -> LazyStrings:
        """An array of `count` strings at the cursor, left undecoded."""
        # Each string takes at least its 8-byte length, so a hostile count fails here cheaply.
        if count > (self.end - self.pos) // 8:
            raise self.fail(f"{what}: {count} strings cannot fit in the rest of the file", start)
        next_pos = string_array_end(self.buf, self.pos, count, self.end)
        if next_pos < 0:
            raise self.fail(f"{what}: a string in the array runs past the end of the file", start)
        strings = LazyStrings(self.buf, self.pos, count, int(next_pos))
        self.pos = int(next_pos)
        return strings

    def arrays(self, count: int, what: str, start: int, depth: int) -> tuple[ValueType, list]:
        """An array of `count` arrays at the cursor, and its element type: the inner arrays'
        common type, or ValueType(ARRAY) without an element type when they differ (or there are
        none), since one declared type would misdescribe some of them."""
        # Arrays of arrays: rare and small; each element needs at least 12 bytes.
        if count > (self.end - self.pos) // 12:
            raise self.fail(f"{what}: {count} nested arrays cannot fit in the rest of the file",
                            start)
        items, types = [], set()
        for i in range(count):
            element, item = self.value(GGUFValueType.ARRAY, f"{what}[{i}]", depth + 1)
            items.append(item)
            types.add(element)
        return (types.pop() if len(types) == 1 else ValueType(GGUFValueType.ARRAY)), items


class TensorInfo(NamedTuple):
    """One entry of the tensor-info table as read, before it is checked."""
    start: int  # where the entry begins in the file
    name: str
    ne: tuple[int, ...]  # ggml order: ne[0] is the row length
    ggml_type: GGMLType
    offset: int  # relative to the data section


def parse(buf: np.ndarray, mem, header_only: bool = False):
    """(version, Metadata, {name: GGUFTensor}, alignment, data_offset) of a GGUF image: `buf` its
    bytes as uint8, `mem` the same bytes for struct. With `header_only`, the image may end
    anywhere after the tensor infos: tensors are described, their data neither checked against
    the end of the file nor readable."""
    r = Cursor(buf, mem)
    version, n_tensors, n_kv = _header(r)
    metadata = _metadata(r, n_kv)
    alignment = _alignment(r, metadata)
    infos = [_tensor_info(r, i) for i in range(n_tensors)]
    data_offset = -(-r.pos // alignment) * alignment
    if data_offset > r.end and n_tensors and not header_only:
        raise r.fail(f"truncated file: data section would start at {data_offset}")
    data_size = (1 << 62) if header_only else r.end - data_offset
    tensors = {}
    for info in infos:
        if info.name in tensors:
            raise r.fail(f"duplicate tensor name {info.name!r}", info.start)
        shape = _checked_shape(r, info, alignment, data_offset, data_size)
        tensors[info.name] = GGUFTensor(info.name, info.ggml_type, shape,
                                        data_offset + info.offset, buf)
    _check_overlaps(tensors.values())
    return version, metadata, tensors, alignment, data_offset


def _header(r: Cursor) -> tuple[int, int, int]:
    """Magic, version, and the tensor and metadata counts (each bounded by the file's size)."""
    r.need(4, "magic")
    magic = bytes(r.mem[0:4])
    if magic != GGUF_MAGIC:
        raise r.fail(f"not a GGUF file: magic is {magic!r}, expected {GGUF_MAGIC!r}", 0)
    r.pos = 4
    version = r.u32("version")
    if version not in SUPPORTED_VERSIONS:
        raise r.fail(f"unsupported GGUF version {version} (supported: 2, 3)", 4)
    n_tensors = r.u64("tensor count")
    n_kv = r.u64("metadata count")
    # Each metadata entry takes at least 13 bytes, each tensor info at least 24.
    if n_kv > (r.end - r.pos) // 13:
        raise r.fail(f"metadata count {n_kv} cannot fit in a file of {r.end} bytes", 16)
    if n_tensors > (r.end - r.pos) // 24:
        raise r.fail(f"tensor count {n_tensors} cannot fit in a file of {r.end} bytes", 8)
    return version, n_tensors, n_kv


def _metadata(r: Cursor, n_kv: int) -> Metadata:
    raw, types = {}, {}
    for i in range(n_kv):
        start = r.pos
        key = r.string(f"key of metadata entry {i}")
        if key in raw:
            raise r.fail(f"duplicate metadata key {key!r}", start)
        vtype = r.value_type(f"metadata {key!r}")
        types[key], raw[key] = r.value(vtype, f"metadata {key!r}")
    return Metadata(raw, types)


def _alignment(r: Cursor, metadata: Metadata) -> int:
    if "general.alignment" not in metadata:
        return DEFAULT_ALIGNMENT
    vtype = metadata.types["general.alignment"]
    if vtype.type != GGUFValueType.UINT32:
        raise r.fail(f"general.alignment must be a power of two (u32), got a {vtype.type.name} "
                     "value")
    alignment = metadata["general.alignment"]
    if alignment <= 0 or alignment & (alignment - 1):
        raise r.fail(f"general.alignment must be a power of two (u32), got {alignment!r}")
    return alignment


def _tensor_info(r: Cursor, i: int) -> TensorInfo:
    """Entry `i` of the tensor-info table; the checks that need no other entry's position (the
    number of dimensions, before any is read, and the type) are made as it is read."""
    start = r.pos
    name = r.string(f"name of tensor {i}")
    n_dims = r.u32(f"n_dims of tensor {name!r}")
    if n_dims > MAX_DIMS:
        raise r.fail(f"tensor {name!r} has {n_dims} dimensions (at most {MAX_DIMS})", start)
    ne = tuple(r.u64(f"dimension {d} of tensor {name!r}") for d in range(n_dims))
    type_pos = r.pos
    type_id = r.u32(f"type of tensor {name!r}")
    if type_id not in GGML_TYPES_BY_ID:
        raise r.fail(f"tensor {name!r} has unknown ggml type {type_id}", type_pos)
    offset = r.u64(f"offset of tensor {name!r}")
    return TensorInfo(start, name, ne, GGML_TYPES_BY_ID[type_id], offset)


def _checked_shape(r: Cursor, info: TensorInfo, alignment: int, data_offset: int,
                   data_size: int) -> tuple[int, ...]:
    """The tensor's numpy shape, once its dimensions, size and place in the data section are
    known to be sound (data_size: the bytes after data_offset)."""
    name, ne, gtype, offset = info.name, info.ne, info.ggml_type, info.offset
    for d, n in enumerate(ne):
        if n == 0:
            raise r.fail(f"tensor {name!r}: dimension {d} is 0 (every dimension must be at "
                         "least 1)", info.start)
        if n > INT64_MAX:
            raise r.fail(f"tensor {name!r}: dimension {d} is {n}, more than int64 holds",
                         info.start)
    n_elements = math.prod(ne)
    if n_elements > INT64_MAX:
        raise r.fail(f"tensor {name!r}: dimensions {list(ne)} overflow int64 ({n_elements} "
                     "elements)", info.start)
    row_length = ne[0] if ne else 1  # ggml's ne are 1 past n_dims
    if row_length % gtype.block_size:
        raise r.fail(f"tensor {name!r}: row length {row_length} is not a multiple of the "
                     f"{gtype.name} block size {gtype.block_size}", info.start)
    nbytes = n_elements // gtype.block_size * gtype.type_size
    if nbytes > INT64_MAX:
        raise r.fail(f"tensor {name!r}: {n_elements} elements of {gtype.name} take {nbytes} "
                     "bytes, more than int64 holds", info.start)
    if offset % alignment:
        raise r.fail(f"tensor {name!r}: data offset {offset} is not aligned to {alignment}",
                     info.start)
    if offset > data_size:
        raise r.fail(f"tensor {name!r}: data offset {offset} lies outside the file (past the "
                     f"{data_size} bytes of its data section)", info.start)
    if offset + nbytes > data_size:
        raise r.fail(f"tensor {name!r}: data [{data_offset + offset}, "
                     f"{data_offset + offset + nbytes}) lies outside the file ({r.end} bytes)",
                     info.start)
    return ne[::-1]


def _check_overlaps(tensors) -> None:
    ordered = sorted(tensors, key=lambda t: t.offset)
    for a, b in itertools.pairwise(ordered):
        if a.offset + a.nbytes > b.offset:
            raise GGUFError(f"tensors {a.name!r} and {b.name!r} overlap in the data section "
                            f"(at offset {b.offset})")
