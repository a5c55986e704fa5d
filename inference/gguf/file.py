"""An open GGUF file, or a split model opened from its first shard; and helpers for the files
behind it (shard names, the mapping's pages).

A model split by llama.cpp's gguf-split is several files named `PREFIX-00001-of-0000N.gguf` and
on: the first holds all the metadata; each holds `split.no`, `split.count`,
`split.tensors.count` and a share of the tensors. Opening the first shard opens the whole model.
"""
from __future__ import annotations

import mmap
import os
import warnings

import numpy as np

from .metadata import Metadata
from .reader import parse
from .tensor import GGUFTensor
from .values import INTEGER_TYPES, SPLIT_COUNT, SPLIT_NO, SPLIT_TENSORS_COUNT, GGUFError


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
             ) -> GGUFFile:
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
    def _open_file(cls, path, use_mmap: bool, mlock: bool) -> GGUFFile:
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
            parsed = parse(buf, mapping)
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
        if self.metadata.types[key].type not in INTEGER_TYPES or value < 0:
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
                   ) -> GGUFFile:
        """Parses a GGUF image held in memory. With `header_only`, `data` may be just the start
        of a file (as fetched by an HTTP Range request): tensors are described but their data is
        not checked or readable."""
        if not data:
            raise GGUFError(f"{name}: empty, not a GGUF model")
        buf = np.frombuffer(data, dtype=np.uint8)
        try:
            parsed = parse(buf, data, header_only)
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
