"""GGUF files: read by mmap (zero-copy tensors), validated, and written back byte for byte.

Layout (v2/v3, little-endian): magic "GGUF", u32 version, u64 tensor count, u64 metadata count;
metadata as (string key, u32 value type, value); tensor infos as (string name, u32 n_dims,
u64 ne[n_dims], u32 ggml type, u64 offset); then, at the next multiple of `general.alignment`,
the data section that every tensor offset is relative to. A string is a u64 length and its bytes.

A model split by llama.cpp's gguf-split is several such files named `PREFIX-00001-of-0000N.gguf`
and on: the first holds all the metadata; each holds `split.no`, `split.count`,
`split.tensors.count` and a share of the tensors. Opening the first shard opens the whole model.
"""
from __future__ import annotations

import mmap
import os
import re
import struct
import tempfile
import time
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum

import numba
import numpy as np

from ..catalog import GGML_TYPES, GGML_TYPES_BY_ID, GGMLType

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock; partials are judged by age
    fcntl = None

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_NESTING = 8
# llama.cpp's LLM_KV_SPLIT_* keys, written as u16, u16 and i32.
SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS_COUNT = "split.no", "split.count", "split.tensors.count"
MAX_SPLITS = 0xFFFF  # split.count is a u16


class GGUFError(ValueError):
    """A file that is not a valid GGUF file; the message says what is wrong and where."""


class GGUFValueType(IntEnum):
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# Fixed-size value types: struct format and numpy dtype (little-endian).
_SCALAR_FORMATS = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H", GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
_SCALAR_DTYPES = {t: np.dtype(f) for t, f in _SCALAR_FORMATS.items()}


@dataclass(frozen=True)
class ValueType:
    """The declared type of a metadata value: `type`, and for arrays the element type (nested
    arrays give a ValueType as element)."""
    type: GGUFValueType
    element: "ValueType | None" = None


# ----------------------------------------------------------------------------- reading

@numba.njit(cache=True)
def _read_u64(buf, pos):
    n = np.int64(0)
    for b in range(7, -1, -1):
        n = (n << 8) | np.int64(buf[pos + b])
    return n


@numba.njit(cache=True)
def _string_array_end(buf, pos, count, end):
    """Where an array of `count` length-prefixed strings starting at `pos` ends; -1 when a length
    runs past `end`. Nothing is allocated: opening a file must stay cheap."""
    for _ in range(count):
        if pos + 8 > end:
            return -1
        n = _read_u64(buf, pos)
        if n < 0 or n > end - pos - 8:
            return -1
        pos += 8 + n
    return pos


@numba.njit(cache=True)
def _join_strings(buf, pos, count, end_pos):
    """The strings' bytes joined by NUL separators, and whether any string itself holds a NUL.
    (The array was bounds-checked by _string_array_end when the file was opened.)"""
    out = np.zeros(max(end_pos - pos - 8 * count + count - 1, 0), np.uint8)
    has_nul = False
    j = 0
    for _ in range(count):
        n = _read_u64(buf, pos)
        pos += 8
        for k in range(pos, pos + n):
            out[j] = buf[k]
            has_nul |= buf[k] == 0
            j += 1
        pos += n
        j += 1
    return out, has_nul


@numba.njit(cache=True)
def _pack_strings(buf, pos, count, end_pos):
    """The strings' bytes back to back and their offsets (count + 1). (Bounds-checked at open.)"""
    blob = np.empty(max(end_pos - pos - 8 * count, 0), np.uint8)
    offsets = np.empty(count + 1, np.int64)
    j = 0
    for i in range(count):
        offsets[i] = j
        n = _read_u64(buf, pos)
        pos += 8
        blob[j:j + n] = buf[pos:pos + n]
        j += n
        pos += n
    offsets[count] = j
    return blob, offsets


class _LazyStrings:
    """A string array decoded on first use (Gemma's vocabulary has 262,144 entries)."""

    def __init__(self, buf: np.ndarray, pos: int, count: int, end_pos: int):
        self.buf, self.pos, self.count, self.end_pos = buf, pos, count, end_pos

    def packed(self) -> tuple[bytes, np.ndarray]:
        """(blob, offsets): string i is blob[offsets[i]:offsets[i + 1]], UTF-8 as stored."""
        if self.count == 0:
            return b"", np.zeros(1, np.int64)
        blob, offsets = _pack_strings(self.buf, self.pos, self.count, self.end_pos)
        return blob.tobytes(), offsets

    def decode(self) -> list[str]:
        if self.count == 0:
            return []
        joined, has_nul = _join_strings(self.buf, self.pos, self.count, self.end_pos)
        if not has_nul:  # one decode and split in C instead of a Python loop per string
            return joined.tobytes().decode("utf-8", "surrogateescape").split("\0")
        out, pos, raw = [], self.pos, self.buf
        for _ in range(self.count):
            n = int(_read_u64(raw, pos))
            out.append(bytes(raw[pos + 8:pos + 8 + n]).decode("utf-8", "surrogateescape"))
            pos += 8 + n
        return out


class _Reader:
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
        fmt = _SCALAR_FORMATS[vtype]
        size = struct.calcsize(fmt)
        self.need(size, what)
        (value,) = struct.unpack_from(fmt, self.mem, self.pos)
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
        if etype in _SCALAR_DTYPES:
            dtype = _SCALAR_DTYPES[etype]
            if count > (self.end - self.pos) // dtype.itemsize:
                raise self.fail(f"{what}: {count} elements of {etype.name} run past the end of "
                                "the file", start)
            data = self.buf[self.pos:self.pos + count * dtype.itemsize].view(dtype)
            self.pos += count * dtype.itemsize
            return ValueType(vtype, ValueType(etype)), data
        if etype == GGUFValueType.STRING:
            # Each string takes at least its 8-byte length, so a hostile count fails here cheaply.
            if count > (self.end - self.pos) // 8:
                raise self.fail(f"{what}: {count} strings cannot fit in the rest of the file", start)
            next_pos = _string_array_end(self.buf, self.pos, count, self.end)
            if next_pos < 0:
                raise self.fail(f"{what}: a string in the array runs past the end of the file",
                                start)
            strings = _LazyStrings(self.buf, self.pos, count, int(next_pos))
            self.pos = int(next_pos)
            return ValueType(vtype, ValueType(etype)), strings
        # Arrays of arrays: rare and small; each element needs at least 12 bytes.
        if count > (self.end - self.pos) // 12:
            raise self.fail(f"{what}: {count} nested arrays cannot fit in the rest of the file",
                            start)
        items, element = [], None
        for i in range(count):
            element, item = self.value(GGUFValueType.ARRAY, f"{what}[{i}]", depth + 1)
            items.append(item)
        return ValueType(vtype, element or ValueType(GGUFValueType.ARRAY)), items


def _plain(value):
    """A parsed metadata value as the Python value users see."""
    if isinstance(value, _LazyStrings):
        return value.decode()
    if isinstance(value, np.ndarray):
        return value.copy()  # detached from the mapping, so it outlives close()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


class Metadata(Mapping):
    """key → Python value, in file order. Arrays are decoded on first access: numeric arrays become
    numpy arrays, string arrays lists of str. `types[key]` is the declared ValueType."""

    def __init__(self, raw: dict, types: dict[str, ValueType]):
        self._raw = raw
        self._decoded: dict = {}
        self.types = types

    def __getitem__(self, key):
        if key not in self._decoded:
            self._decoded[key] = _plain(self._raw[key])
        return self._decoded[key]

    def packed_strings(self, key) -> tuple[bytes, np.ndarray] | None:
        """A string array as (blob, offsets) (string i is blob[offsets[i]:offsets[i + 1]]) without
        a Python str per element; None when `key` is not a string array. Not cached."""
        value = self._raw.get(key)
        if isinstance(value, _LazyStrings):
            return value.packed()
        return None

    def length(self, key) -> int | None:
        """The element count of an array value without decoding it; None for a scalar."""
        value = self._raw[key]
        if isinstance(value, _LazyStrings):
            return value.count
        return len(value) if isinstance(value, (np.ndarray, list)) else None

    def __iter__(self):
        return iter(self._raw)

    def __len__(self):
        return len(self._raw)

    def __repr__(self):
        return f"Metadata({len(self)} keys)"


class GGUFTensor:
    """One tensor: `.type` (llama.cpp's name), `.shape` (numpy order: ggml's ne reversed),
    `.nbytes`, `.data` (zero-copy uint8 view), `.rows` (uint8, one row of blocks per row),
    `.dequantize()`; `.shard`: which file of a split model holds it (0 otherwise)."""

    def __init__(self, name: str, ggml_type: GGMLType, shape: tuple[int, ...], offset: int,
                 buf: np.ndarray):
        self.name = name
        self.ggml_type = ggml_type
        self.shape = shape
        self.offset = offset  # absolute, in its file
        self.shard = 0
        self.n_elements = int(np.prod(shape, dtype=np.int64)) if shape else 1
        self.nbytes = self.n_elements // ggml_type.block_size * ggml_type.type_size
        self._buf = buf

    @property
    def type(self) -> str:
        return self.ggml_type.name

    @property
    def data(self) -> np.ndarray:
        if self._buf is None or self.offset + self.nbytes > len(self._buf):
            raise GGUFError(f"tensor {self.name!r}: data is not available (file closed, or only "
                            "its header was read)")
        return self._buf[self.offset:self.offset + self.nbytes]

    @property
    def rows(self) -> np.ndarray:
        row_bytes = self.ggml_type.row_bytes(self.shape[-1])
        return self.data.reshape(-1, row_bytes)

    def dequantize(self) -> np.ndarray:
        from ..quants import dequantize
        return dequantize(self.type, self.data, self.n_elements).reshape(self.shape)

    def __repr__(self):
        return f"GGUFTensor({self.name!r}, {self.type}, shape={self.shape})"


class GGUFFile:
    """An open GGUF file, or a split model opened from its first shard. Opening reads the headers
    only; tensor data stays in the mappings until used. Use as a context manager or call close().
    `shard_paths` lists the model's files; `file_size` is their total size."""

    def __init__(self, path, buf: np.ndarray, mapping, version: int, metadata: Metadata,
                 tensors: dict[str, GGUFTensor], alignment: int, data_offset: int):
        self.path = path
        self._buf = buf
        self._mapping = mapping
        self.version = version
        self.metadata = metadata
        self.tensors = tensors
        self.alignment = alignment
        self.data_offset = data_offset
        self.file_size = len(buf)
        self.shard_paths = [path]
        self._other_shards: list[GGUFFile] = []

    @classmethod
    def open(cls, path, use_mmap: bool = True, mlock: bool = False, join_splits: bool = True
             ) -> "GGUFFile":
        """Opens a model file. The first shard of a split model brings in the others (found by
        name, as llama_model_loader does with llama_split_prefix/llama_split_path) and gives
        one `tensors` dict and the first shard's metadata; another shard is refused, since
        llama.cpp loads a split model from its first file only. `join_splits=False` opens just
        the one file, any shard included (to check a download, say)."""
        f = cls._open_file(path, use_mmap, mlock)
        if join_splits:
            try:
                f._join_shards(use_mmap, mlock)
            except BaseException:
                f.close()
                raise
        return f

    @classmethod
    def _open_file(cls, path, use_mmap: bool, mlock: bool) -> "GGUFFile":
        path = os.fspath(path)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size == 0:
                    raise GGUFError(f"{path}: empty file, not a GGUF model")
                if use_mmap:
                    mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                else:
                    mapping = bytearray(size)
                    if f.readinto(mapping) != size:
                        raise GGUFError(f"{path}: file changed size while reading")
        except IsADirectoryError:
            raise GGUFError(f"{path}: is a directory, not a GGUF model") from None
        buf = np.frombuffer(mapping, dtype=np.uint8)
        if mlock and use_mmap:
            _mlock(buf)
        try:
            parsed = _parse(buf, mapping)
        except GGUFError as e:
            raise GGUFError(f"{path}: {e}") from None
        return cls(path, buf, mapping, *parsed)

    def split_position(self) -> tuple[int, int]:
        """(split.no, split.count) of this file; (0, 1) for a file that is not split."""
        count = self._split_key(SPLIT_COUNT, 0)
        if count <= 1:
            return 0, 1
        no = self._split_key(SPLIT_NO, None)
        if no >= count:
            raise GGUFError(f"{self.path}: {SPLIT_NO} is {no} but {SPLIT_COUNT} is {count}")
        return no, count

    def _split_key(self, key: str, default: int | None) -> int:
        if key not in self.metadata:
            if default is None:
                raise GGUFError(f"{self.path}: {SPLIT_COUNT} is set but {key} is missing")
            return default
        value = self.metadata[key]
        if self.metadata.types[key].type not in _INTEGER_TYPES or value < 0:
            raise GGUFError(f"{self.path}: {key} must be a non-negative integer, got {value!r}")
        return int(value)

    def _join_shards(self, use_mmap: bool, mlock: bool) -> None:
        """Adds the other shards' tensors (llama_model_loader's split loop, with its checks:
        each shard's split.no in turn, the same split.count, no tensor twice, and in all
        split.tensors.count tensors)."""
        no, count = self.split_position()
        if count == 1:
            return
        prefix = split_prefix(self.path, no, count)
        if no != 0:
            first = f" ({split_path(prefix, 0, count)})" if prefix else ""
            raise GGUFError(f"{self.path}: shard {no + 1} of {count} of a split model; open "
                            f"its first shard{first}, which loads all {count}")
        if prefix is None:
            raise GGUFError(f"{self.path}: the first of {count} shards, but its name does not "
                            f"end in {split_path('', 0, count)}, so the others cannot be found")
        for shard_no in range(1, count):
            path = split_path(prefix, shard_no, count)
            if not os.path.isfile(path):
                raise GGUFError(f"{self.path}: shard {shard_no + 1} of {count} is missing: {path}")
            shard = GGUFFile._open_file(path, use_mmap, mlock)
            self._other_shards.append(shard)
            found = shard.split_position()
            if SPLIT_COUNT not in shard.metadata:
                raise GGUFError(f"{path}: no {SPLIT_COUNT}, so not shard {shard_no + 1} of the "
                                f"{count} that {self.path} names")
            if found[1] != count:
                raise GGUFError(f"{path}: {SPLIT_COUNT} is {found[1]}, but the first shard "
                                f"{self.path} says {count}")
            if found[0] != shard_no:
                raise GGUFError(f"{path}: {SPLIT_NO} is {found[0]}, expected {shard_no} (shard "
                                f"{shard_no + 1} of {count})")
            for name, t in shard.tensors.items():
                if name in self.tensors:
                    raise GGUFError(f"{path}: tensor {name!r} is also in an earlier shard")
                t.shard = shard_no
                self.tensors[name] = t
            self.shard_paths.append(path)
            self.file_size += shard.file_size
        expected = self._split_key(SPLIT_TENSORS_COUNT, len(self.tensors))
        if expected != len(self.tensors):
            raise GGUFError(f"{self.path}: {SPLIT_TENSORS_COUNT} is {expected} but the {count} "
                            f"shards hold {len(self.tensors)} tensors")

    @classmethod
    def from_bytes(cls, data: bytes, name: str = "<bytes>", header_only: bool = False
                   ) -> "GGUFFile":
        """Parses a GGUF image held in memory. With `header_only`, `data` may be just the start
        of a file (as fetched by an HTTP Range request): tensors are described but their data is
        not checked or readable."""
        if not data:
            raise GGUFError(f"{name}: empty, not a GGUF model")
        buf = np.frombuffer(data, dtype=np.uint8)
        try:
            parsed = _parse(buf, data, header_only)
        except GGUFError as e:
            raise GGUFError(f"{name}: {e}") from None
        return cls(name, buf, data, *parsed)

    def close(self) -> None:
        shards, self._other_shards = self._other_shards, []
        for shard in shards:
            shard.close()
        self.tensors = {}
        self._buf = None
        mapping, self._mapping = self._mapping, None
        if isinstance(mapping, mmap.mmap):
            try:
                mapping.close()
            except BufferError:
                pass  # views are still alive; the mapping closes when the last one goes

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def architecture(self) -> str | None:
        return self.metadata.get("general.architecture")

    def __repr__(self):
        shards = f", {len(self.shard_paths)} shards" if len(self.shard_paths) > 1 else ""
        return f"GGUFFile({self.path!r}, v{self.version}, {len(self.metadata)} keys, " \
               f"{len(self.tensors)} tensors{shards})"


_INTEGER_TYPES = frozenset(t for t in _SCALAR_FORMATS
                           if t not in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64,
                                        GGUFValueType.BOOL))


def release_pages(view: np.ndarray) -> int:
    """Drops this process's resident pages of `view`, bytes of a GGUF file's read-only mapping
    (madvise MADV_DONTNEED): they come back from the file when read again. For a tensor the
    engine keeps in another form (matmul's packed copies), so that its bytes do not count twice.
    Returns the bytes released; 0 for arrays not backed by a file mapping (read into memory:
    there MADV_DONTNEED would zero them) or where the OS refuses (--mlock)."""
    base = view
    while base is not None and not isinstance(base, mmap.mmap):
        base = getattr(base, "base", None) if not isinstance(base, memoryview) else base.obj
    if base is None or base.closed or not hasattr(base, "madvise") or view.size == 0:
        return 0
    start = view.ctypes.data - np.frombuffer(base, np.uint8).ctypes.data
    lo = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE  # whole pages inside the view only
    hi = (start + view.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if hi <= lo:
        return 0
    try:
        base.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
    except (OSError, ValueError):
        return 0
    return hi - lo


def split_path(prefix: str, split_no: int, split_count: int) -> str:
    """The file of shard `split_no` (0-based) of a split model: llama_split_path's
    `PREFIX-00001-of-00003.gguf`."""
    return f"{prefix}-{split_no + 1:05d}-of-{split_count:05d}.gguf"


def split_prefix(path, split_no: int, split_count: int) -> str | None:
    """The PREFIX of a shard's path (llama_split_prefix), None when the name does not end in the
    shard's own `-0000i-of-0000N.gguf`."""
    path = os.fspath(path)
    postfix = split_path("", split_no, split_count)
    if len(path) <= len(postfix) or not path.endswith(postfix):
        return None
    return path[:-len(postfix)]


def _mlock(buf: np.ndarray) -> None:
    import ctypes
    import ctypes.util
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    if libc.mlock(ctypes.c_void_p(buf.ctypes.data), ctypes.c_size_t(buf.nbytes)) != 0:
        warnings.warn(f"mlock failed ({os.strerror(ctypes.get_errno())}); the model may be "
                      "paged out (raise RLIMIT_MEMLOCK with `ulimit -l`)", RuntimeWarning, 2)


def _parse(buf: np.ndarray, mem, header_only: bool = False):
    r = _Reader(buf, mem)
    r.need(4, "magic")
    magic = bytes(mem[0:4])
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

    raw, types = {}, {}
    for i in range(n_kv):
        start = r.pos
        key = r.string(f"key of metadata entry {i}")
        if key in raw:
            raise r.fail(f"duplicate metadata key {key!r}", start)
        vtype = r.value_type(f"metadata {key!r}")
        types[key], raw[key] = r.value(vtype, f"metadata {key!r}")
    metadata = Metadata(raw, types)

    alignment = DEFAULT_ALIGNMENT
    if "general.alignment" in raw:
        alignment = raw["general.alignment"]
        if types["general.alignment"].type != GGUFValueType.UINT32 or alignment <= 0 \
                or alignment & (alignment - 1):
            raise r.fail(f"general.alignment must be a power of two (u32), got {alignment!r}")

    infos = []
    for i in range(n_tensors):
        start = r.pos
        name = r.string(f"name of tensor {i}")
        n_dims = r.u32(f"n_dims of tensor {name!r}")
        if n_dims > MAX_DIMS:
            raise r.fail(f"tensor {name!r} has {n_dims} dimensions (at most {MAX_DIMS})", start)
        ne = [r.u64(f"dimension {d} of tensor {name!r}") for d in range(n_dims)]
        type_pos = r.pos
        type_id = r.u32(f"type of tensor {name!r}")
        if type_id not in GGML_TYPES_BY_ID:
            raise r.fail(f"tensor {name!r} has unknown ggml type {type_id}", type_pos)
        offset = r.u64(f"offset of tensor {name!r}")
        infos.append((start, name, ne, GGML_TYPES_BY_ID[type_id], offset))

    data_offset = -(-r.pos // alignment) * alignment
    if data_offset > r.end and n_tensors and not header_only:
        raise r.fail(f"truncated file: data section would start at {data_offset}")
    data_size = (1 << 62) if header_only else r.end - data_offset

    tensors = {}
    for start, name, ne, gtype, offset in infos:
        if name in tensors:
            raise r.fail(f"duplicate tensor name {name!r}", start)
        n_elements = 1
        for d in ne:
            n_elements *= d
        if n_elements >= 1 << 62:
            raise r.fail(f"tensor {name!r}: dimensions {ne} overflow", start)
        if ne and ne[0] % gtype.block_size:
            raise r.fail(f"tensor {name!r}: row length {ne[0]} is not a multiple of the "
                         f"{gtype.name} block size {gtype.block_size}", start)
        if offset % alignment:
            raise r.fail(f"tensor {name!r}: data offset {offset} is not aligned to {alignment}",
                         start)
        nbytes = n_elements // gtype.block_size * gtype.type_size
        if offset + nbytes > data_size:
            raise r.fail(f"tensor {name!r}: data [{data_offset + offset}, "
                         f"{data_offset + offset + nbytes}) lies outside the file "
                         f"({r.end} bytes)", start)
        shape = tuple(int(d) for d in reversed(ne))
        tensors[name] = GGUFTensor(name, gtype, shape, data_offset + offset, buf)

    ordered = sorted(tensors.values(), key=lambda t: t.offset)
    for a, b in zip(ordered, ordered[1:]):
        if a.offset + a.nbytes > b.offset:
            raise GGUFError(f"tensors {a.name!r} and {b.name!r} overlap in the data section "
                            f"(at offset {b.offset})")
    return version, metadata, tensors, alignment, data_offset


# ----------------------------------------------------------------------------- writing

def infer_value_type(value) -> ValueType:
    """A reasonable GGUF type for a Python value, for keys written without an explicit type."""
    if isinstance(value, (bool, np.bool_)):
        return ValueType(GGUFValueType.BOOL)
    if isinstance(value, (int, np.integer)):
        if 0 <= value < 1 << 32:
            return ValueType(GGUFValueType.UINT32)
        return ValueType(GGUFValueType.INT64 if -(1 << 63) <= value < 1 << 63
                         else GGUFValueType.UINT64)
    if isinstance(value, (float, np.floating)):
        return ValueType(GGUFValueType.FLOAT32)
    if isinstance(value, str):
        return ValueType(GGUFValueType.STRING)
    if isinstance(value, np.ndarray):
        for vtype, dtype in _SCALAR_DTYPES.items():
            if dtype == value.dtype.newbyteorder("<"):
                return ValueType(GGUFValueType.ARRAY, ValueType(vtype))
        raise TypeError(f"cannot store a numpy array of {value.dtype} in GGUF metadata")
    if isinstance(value, (list, tuple)):
        element = infer_value_type(value[0]) if len(value) else ValueType(GGUFValueType.INT32)
        return ValueType(GGUFValueType.ARRAY, element)
    raise TypeError(f"cannot store {type(value).__name__} in GGUF metadata")


def _encode_string(s: str) -> bytes:
    raw = s.encode("utf-8", "surrogateescape")
    return struct.pack("<Q", len(raw)) + raw


def _encode_value(vtype: ValueType, value) -> bytes:
    t = vtype.type
    if t == GGUFValueType.STRING:
        return _encode_string(value)
    if t != GGUFValueType.ARRAY:
        return struct.pack(_SCALAR_FORMATS[t], value)
    et = vtype.element
    head = struct.pack("<IQ", et.type, len(value))
    if et.type in _SCALAR_DTYPES:
        return head + np.asarray(value, dtype=_SCALAR_DTYPES[et.type]).tobytes()
    if et.type == GGUFValueType.STRING:
        return head + b"".join(map(_encode_string, value))
    return head + b"".join(_encode_value(et, v) for v in value)  # nested arrays: no type tag


@dataclass
class _TensorToWrite:
    name: str
    ggml_type: GGMLType
    shape: tuple[int, ...]
    data: np.ndarray | None  # uint8 bytes; None when written later through a callback
    nbytes: int


# ----------------------------------------------------------------------------- partial files
#
# GGUFWriter assembles a file as `.<name>.partial-<pid>-<random>` beside it and holds an
# exclusive flock on it while writing. A writer killed with -9 loses the lock, so the next
# writer in that folder (or the model store, which lists these) can tell its leftover from a
# file still being written, and remove it.

_PARTIAL_WRITE = re.compile(r"^\.(?P<target>.+)\.partial-(?P<pid>\d+)-[A-Za-z0-9_]+$")
_OLD_PARTIAL_WRITE = re.compile(r"^\.partial-[A-Za-z0-9_]+\.gguf$")  # before pids and locks
# Without a lock to ask: a partial untouched this long has no writer (one writes continuously).
ABANDONED_AFTER = 60.0
OLD_ABANDONED_AFTER = 3600.0


@dataclass(frozen=True)
class PartialWrite:
    """A file GGUFWriter is writing, or a leftover of one that died (`abandoned`)."""
    path: str
    target: str | None  # the file it becomes (None for the older unnamed partials)
    pid: int | None
    size: int
    abandoned: bool


def _process_exists(pid: int) -> bool:
    """POSIX only (on Windows os.kill would end the process)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _locked_by_writer(path: str) -> bool:
    """Whether a live writer holds the partial's flock."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:  # BlockingIOError: held
        return True
    finally:
        os.close(fd)  # releases the shared lock if we got it
    return False


def _abandoned(path: str, pid: int | None, mtime: float) -> bool:
    age = time.time() - mtime
    if pid is None:
        return age > OLD_ABANDONED_AFTER
    if fcntl is None:
        return age > ABANDONED_AFTER
    if _locked_by_writer(path):
        return False
    # Unlocked: dead, or between creating the file and locking it (its process alive, the
    # file new), or its pid reused by another process (the file old).
    return not _process_exists(pid) or age > ABANDONED_AFTER


def partial_writes(directory) -> list[PartialWrite]:
    """GGUFWriter's partial files in `directory`, live and abandoned."""
    out = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return out
    for e in entries:
        m = _PARTIAL_WRITE.match(e.name)
        if m is None and not _OLD_PARTIAL_WRITE.match(e.name):
            continue
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        pid = int(m["pid"]) if m else None
        target = os.path.join(directory, m["target"]) if m else None
        out.append(PartialWrite(e.path, target, pid, st.st_size,
                                _abandoned(e.path, pid, st.st_mtime)))
    return sorted(out, key=lambda p: p.path)


def remove_abandoned_writes(directory) -> list[PartialWrite]:
    """Deletes the partial files in `directory` whose writer died; returns them. Never
    raises: a folder that cannot be written keeps its leftovers."""
    removed = []
    for p in partial_writes(directory):
        if p.abandoned:
            try:
                os.unlink(p.path)
                removed.append(p)
            except OSError:
                pass
    return removed


class GGUFWriter:
    """Collects metadata and tensors, then writes a GGUF file atomically: everything goes to a
    partial file beside the target (see "partial files" above), renamed into place only when
    complete. (llama_model_quantize_impl writes its output in place; a run that fails or is
    killed there leaves a broken file under the final name.)"""

    def __init__(self, path, alignment: int = DEFAULT_ALIGNMENT, version: int = 3):
        if version not in SUPPORTED_VERSIONS:
            raise ValueError(f"GGUF version {version} is not supported (2 or 3)")
        self.path = os.fspath(path)
        self.alignment = alignment
        self.version = version
        self.metadata: dict[str, tuple[ValueType, object]] = {}
        self.tensors: list[_TensorToWrite] = []

    def add(self, key: str, value, vtype: ValueType | GGUFValueType | None = None) -> None:
        if isinstance(vtype, GGUFValueType):
            vtype = ValueType(vtype)
        self.metadata[key] = (vtype or infer_value_type(value), value)
        if key == "general.alignment":
            self.alignment = int(value)

    def add_metadata(self, metadata: Metadata, skip: Iterable[str] = ()) -> None:
        """Copies every key of an open file's metadata with its declared type."""
        skip = set(skip)
        for key in metadata:
            if key not in skip:
                self.add(key, metadata[key], metadata.types[key])

    def add_tensor(self, name: str, type_name: str, shape, data: np.ndarray) -> None:
        gtype = GGML_TYPES[type_name]
        shape = tuple(int(d) for d in shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) // gtype.block_size * gtype.type_size
        data = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        if shape[-1] % gtype.block_size or data.nbytes != nbytes:
            raise ValueError(f"tensor {name!r}: {data.nbytes} bytes do not hold {type_name} "
                             f"data of shape {shape} ({nbytes} bytes expected)")
        t = self._declare(name, type_name, shape)
        t.data = data
        self.tensors.append(t)

    def add_tensor_info(self, name: str, type_name: str, shape) -> None:
        """Declares a tensor whose bytes are produced while writing: `write(tensor_source=...)`
        asks for them in declaration order, so a whole model never has to sit in memory."""
        self.tensors.append(self._declare(name, type_name, shape))

    def _declare(self, name: str, type_name: str, shape) -> _TensorToWrite:
        gtype = GGML_TYPES[type_name]
        shape = tuple(int(d) for d in shape)
        n_elements = int(np.prod(shape, dtype=np.int64))
        nbytes = n_elements // gtype.block_size * gtype.type_size
        if shape[-1] % gtype.block_size:
            raise ValueError(f"tensor {name!r}: rows of {shape[-1]} values cannot hold "
                             f"{type_name} blocks of {gtype.block_size}")
        if any(t.name == name for t in self.tensors):
            raise ValueError(f"duplicate tensor name {name!r}")
        return _TensorToWrite(name, gtype, shape, None, nbytes)

    def write(self, progress=None, tensor_source=None) -> None:
        """Writes the file. `progress(done_bytes, total_bytes)` is called as tensors are written.
        `tensor_source(name)` gives the bytes of each tensor declared with `add_tensor_info`: one
        array (or bytes), or an iterable of them written one after the other."""
        self._write_files([(self.path, self.metadata, self.tensors)], progress, tensor_source)

    def write_split(self, max_tensors: int = 0, max_bytes: int = 0, progress=None,
                    tensor_source=None) -> list[str]:
        """Writes the model in llama.cpp's split layout, byte for byte as `llama-gguf-split
        --split` does: `max_tensors` per shard (--split-max-tensors) or at most `max_bytes` of
        padded tensor data per shard (--split-max-size). The writer's path, less a `.gguf`
        ending, is the PREFIX of `PREFIX-00001-of-0000N.gguf` and on. The first shard holds all
        the metadata, each split.no, split.tensors.count and split.count (and, for an alignment
        other than 32, general.alignment, which gguf-split leaves out). All shards appear
        together, or none. Returns their paths in order."""
        shards = self._split_plan(max_tensors, max_bytes)
        count = len(shards)
        prefix = self.path.removesuffix(".gguf")
        files = []
        for no, tensors in enumerate(shards):
            split_keys = (SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS_COUNT)
            metadata = {k: v for k, v in self.metadata.items() if k not in split_keys} \
                if no == 0 else {}
            if no and self.alignment != DEFAULT_ALIGNMENT:  # the only other key a shard needs
                metadata["general.alignment"] = (ValueType(GGUFValueType.UINT32), self.alignment)
            # In gguf-split's order (it sets split.count last, once the count is known), so
            # the shards come out byte for byte as llama-gguf-split writes them.
            metadata[SPLIT_NO] = (ValueType(GGUFValueType.UINT16), no)
            metadata[SPLIT_TENSORS_COUNT] = (ValueType(GGUFValueType.INT32), len(self.tensors))
            metadata[SPLIT_COUNT] = (ValueType(GGUFValueType.UINT16), count)
            files.append((split_path(prefix, no, count), metadata, tensors))
        self._write_files(files, progress, tensor_source)
        return [path for path, _, _ in files]

    def _split_plan(self, max_tensors: int, max_bytes: int) -> list[list[_TensorToWrite]]:
        """The tensors of each shard, in order (gguf-split's split_strategy; unlike it, a tensor
        larger than `max_bytes` gets a shard of its own instead of an error)."""
        if (max_tensors > 0) == (max_bytes > 0):
            raise ValueError(f"give one of max_tensors and max_bytes as a positive number "
                             f"(got max_tensors={max_tensors}, max_bytes={max_bytes})")
        if not self.tensors:
            raise ValueError(f"{self.path}: a model without tensors cannot be split")
        shards: list[list[_TensorToWrite]] = [[]]
        shard_bytes = 0
        for t in self.tensors:
            padded = t.nbytes + _padding(t.nbytes, self.alignment)
            full = len(shards[-1]) == max_tensors if max_tensors else \
                shard_bytes + padded > max_bytes
            if full and shards[-1]:
                shards.append([])
                shard_bytes = 0
            shards[-1].append(t)
            shard_bytes += padded
        if len(shards) > MAX_SPLITS:
            raise ValueError(f"{len(shards)} shards; split.count holds at most {MAX_SPLITS}")
        return shards

    def _header(self, metadata: dict, tensors: list[_TensorToWrite]) -> bytes:
        parts = [GGUF_MAGIC, struct.pack("<IQQ", self.version, len(tensors), len(metadata))]
        for key, (vtype, value) in metadata.items():
            parts += [_encode_string(key), struct.pack("<I", vtype.type),
                      _encode_value(vtype, value)]
        offset = 0
        for t in tensors:
            ne = tuple(reversed(t.shape))
            parts += [_encode_string(t.name), struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne,
                                                          t.ggml_type.id, offset)]
            offset += _padding(t.nbytes, self.alignment) + t.nbytes
        return b"".join(parts)

    def _write_files(self, files, progress, tensor_source) -> None:
        """Writes each (path, metadata, tensors) to a temporary file beside it; renames them all
        into place only once every one is complete."""
        pending = [t.name for t in self.tensors if t.data is None]
        if pending and tensor_source is None:
            raise ValueError(f"no tensor_source for the tensors declared without data: "
                             f"{', '.join(pending[:3])}{' ...' if len(pending) > 3 else ''}")
        total = sum(t.nbytes for t in self.tensors)
        done = 0
        written = []  # (temporary path, final path, open file: its lock says "being written")
        try:
            for path, metadata, tensors in files:
                directory, name = os.path.split(os.path.abspath(path))
                remove_abandoned_writes(directory)
                fd, tmp = tempfile.mkstemp(prefix=f".{name}.partial-{os.getpid()}-",
                                           dir=directory)
                f = os.fdopen(fd, "wb")
                written.append((tmp, path, f))
                if fcntl is not None:
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX)  # held until every shard is in place
                os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the usual permissions
                header = self._header(metadata, tensors)
                f.write(header)
                f.write(b"\0" * _padding(len(header), self.alignment))
                for t in tensors:
                    if t.data is not None:
                        f.write(memoryview(t.data))
                    else:
                        _write_chunks(f, t, tensor_source(t.name))
                    f.write(b"\0" * _padding(t.nbytes, self.alignment))
                    done += t.nbytes
                    if progress:
                        progress(done, total)
                f.flush()
                os.fsync(f.fileno())
            for tmp, path, _ in written:
                os.replace(tmp, path)
        except BaseException:
            for tmp, _, _ in written:
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
            raise
        finally:
            for _, _, f in written:
                f.close()


def _write_chunks(f, t: _TensorToWrite, source) -> None:
    """Writes a tensor's bytes from `source` (a buffer or an iterable of buffers), checking that
    they add up to exactly the declared size."""
    if isinstance(source, (bytes, bytearray, memoryview, np.ndarray)):
        source = (source,)
    written = 0
    for chunk in source:
        view = memoryview(np.ascontiguousarray(chunk).view(np.uint8).reshape(-1)) \
            if isinstance(chunk, np.ndarray) else memoryview(chunk).cast("B")
        if written + view.nbytes > t.nbytes:
            raise ValueError(f"tensor {t.name!r}: more than the {t.nbytes} bytes its "
                             f"{t.ggml_type.name} shape {t.shape} holds")
        f.write(view)
        written += view.nbytes
    if written != t.nbytes:
        raise ValueError(f"tensor {t.name!r}: got {written} bytes, its {t.ggml_type.name} shape "
                         f"{t.shape} needs {t.nbytes}")


def _read_umask() -> int:
    # Reading the umask means setting it; done once at import, before any worker threads exist.
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def _padding(n: int, alignment: int) -> int:
    return -n % alignment
