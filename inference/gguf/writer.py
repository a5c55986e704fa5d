"""Writing GGUF files: metadata with declared types, tensors given whole or produced while
writing, one file or llama.cpp's split layout, always atomically (see partial.py)."""
from __future__ import annotations

import math
import os
import struct
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ..catalog import GGML_TYPES, GGMLType
from .file import split_path
from .metadata import Metadata
from .partial import fcntl, remove_abandoned_writes
from .values import (DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS, MAX_SPLITS, SCALAR_DTYPES,
                     SCALAR_FORMATS, SPLIT_COUNT, SPLIT_NO, SPLIT_TENSORS_COUNT,
                     SUPPORTED_VERSIONS, GGUFValueType, ValueType)


def infer_value_type(value) -> ValueType:
    """A reasonable GGUF type for a Python value, for keys written without an explicit type. A
    list's elements take the first one's type; a list of arrays of different types gets
    ValueType(ARRAY) as element type, each inner array being written with its own."""
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
        for vtype, dtype in SCALAR_DTYPES.items():
            if dtype == value.dtype.newbyteorder("<"):
                return ValueType(GGUFValueType.ARRAY, ValueType(vtype))
        raise TypeError(f"cannot store a numpy array of {value.dtype} in GGUF metadata")
    if isinstance(value, (list, tuple)):
        element = infer_value_type(value[0]) if len(value) else ValueType(GGUFValueType.INT32)
        if element.type == GGUFValueType.ARRAY and \
                any(infer_value_type(v) != element for v in value[1:]):
            element = ValueType(GGUFValueType.ARRAY)
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
        return struct.pack(SCALAR_FORMATS[t], value)
    et = vtype.element or infer_value_type(value).element  # None: an inner array of a mixed one
    head = struct.pack("<IQ", et.type, len(value))
    if et.type in SCALAR_DTYPES:
        return head + np.asarray(value, dtype=SCALAR_DTYPES[et.type]).tobytes()
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


class GGUFWriter:
    """Collects metadata and tensors, then writes a GGUF file atomically: everything goes to a
    partial file beside the target (see partial.py), renamed into place only when
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
        gtype, shape, nbytes = _shape_and_size(name, type_name, shape)
        data = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        if _row_length(shape) % gtype.block_size or data.nbytes != nbytes:
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
        gtype, shape, nbytes = _shape_and_size(name, type_name, shape)
        if _row_length(shape) % gtype.block_size:
            raise ValueError(f"tensor {name!r}: rows of {_row_length(shape)} values cannot hold "
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


def _shape_and_size(name: str, type_name: str, shape) -> tuple[GGMLType, tuple[int, ...], int]:
    """(type, shape as ints, bytes) of a tensor to write; only shapes the reader accepts (at
    most GGML_MAX_DIMS dimensions, each at least 1)."""
    gtype = GGML_TYPES[type_name]
    shape = tuple(int(d) for d in shape)
    if len(shape) > MAX_DIMS or any(d < 1 for d in shape):
        raise ValueError(f"tensor {name!r}: shape {shape} is not one GGUF can hold (at most "
                         f"{MAX_DIMS} dimensions, each at least 1)")
    return gtype, shape, math.prod(shape) // gtype.block_size * gtype.type_size


def _row_length(shape: tuple[int, ...]) -> int:
    return shape[-1] if shape else 1  # a tensor of no dimensions holds one value


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
