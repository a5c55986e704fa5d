"""Metadata values as the reader leaves them: numeric arrays as zero-copy views, string arrays
decoded only when asked for (a vocabulary of 262,144 tokens costs nothing until it is used), and
the `Metadata` mapping that turns them into Python values on first access."""
from __future__ import annotations

from collections.abc import Mapping

import numba
import numpy as np

from .values import ValueType


@numba.njit(cache=True)
def _read_u64(buf, pos):
    n = np.int64(0)
    for b in range(7, -1, -1):
        n = (n << 8) | np.int64(buf[pos + b])
    return n


@numba.njit(cache=True)
def string_array_end(buf, pos, count, end):
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
    (The array was bounds-checked by string_array_end when the file was opened.)"""
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
        for k in range(n):  # a loop, not a slice copy: that compiles shape checks (~2 s)
            blob[j + k] = buf[pos + k]
        j += n
        pos += n
    offsets[count] = j
    return blob, offsets


class LazyStrings:
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


def _plain(value):
    """A parsed metadata value as the Python value users see."""
    if isinstance(value, LazyStrings):
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
        if isinstance(value, LazyStrings):
            return value.packed()
        return None

    def length(self, key) -> int | None:
        """The element count of an array value without decoding it; None for a scalar."""
        value = self._raw[key]
        if isinstance(value, LazyStrings):
            return value.count
        return len(value) if isinstance(value, (np.ndarray, list)) else None

    def __iter__(self):
        return iter(self._raw)

    def __len__(self):
        return len(self._raw)

    def __repr__(self):
        return f"Metadata({len(self)} keys)"
