"""A vocabulary's token texts without a Python object per token.

Gemma 3's 262,144 tokens as a list of str plus a str → id dict take ~45 MiB; here the texts are
one UTF-8 blob with offsets, and text → id goes through an open-addressing table of Python's own
`hash(str)` (linear probing, load factor ≤ 1/2, 32-bit hash tags), verified against the stored
text: ~6 MiB. A lookup costs more than a dict's, which tokenizing does not notice.

Texts are stored as GGUF stores them (UTF-8, invalid bytes kept through surrogateescape).
"""
from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence

import numpy as np

_ERRORS = "surrogateescape"
# Tokenizing asks for the same short pieces over and over: the answers to the latest lookups are
# kept (a dict, emptied when it reaches this size: ~3 MiB at most)
_RECENT_MAX = 1 << 15
_MISSING = object()


class Vocab(Sequence):
    """The token texts as a read-only sequence (id → text: `vocab[i]`, `len`, `in`), plus
    text → id with `get`."""

    def __init__(self, blob: bytes, offsets: np.ndarray):
        """blob: the texts' UTF-8 bytes back to back; offsets (n + 1,): text i is
        blob[offsets[i]:offsets[i + 1]]. Raises ValueError on a duplicate text."""
        self._blob = bytes(blob)
        offsets = np.asarray(offsets, dtype=np.int64)
        n = len(offsets) - 1
        if n < 0 or (n and (offsets[0] != 0 or offsets[n] != len(self._blob))) \
                or len(self._blob) >= 1 << 32:
            raise ValueError("vocabulary offsets do not cover the text blob")
        self._offsets = array("I", offsets.astype(np.uint32).tobytes())
        self._n = n
        self._recent: dict[str, int | None] = {}
        size = 1 << max(4, (2 * n - 1).bit_length())  # at most half full
        self._mask = size - 1
        self._slots = slots = array("i", [-1]) * size
        # the low 32 bits of each text's hash: a cheap first test before comparing texts
        self._hashes = hashes = array("I", bytes(4 * n))
        mask, text = self._mask, self.text
        for i in range(n):
            s = text(i)
            h = hash(s)
            hashes[i] = h & 0xFFFFFFFF
            j = h & mask
            while (k := slots[j]) >= 0:
                if hashes[k] == hashes[i] and text(k) == s:
                    raise ValueError(f"duplicate token in vocabulary: {s!r} has ids {k} and {i}")
                j = (j + 1) & mask
            slots[j] = i

    @classmethod
    def from_texts(cls, texts: Iterable[str]) -> "Vocab":
        raw = [t.encode("utf-8", _ERRORS) for t in texts]
        offsets = np.zeros(len(raw) + 1, np.int64)
        np.cumsum([len(r) for r in raw], out=offsets[1:])
        return cls(b"".join(raw), offsets)

    def __len__(self) -> int:
        return self._n

    def text(self, token_id: int) -> str:
        """The token's text (IndexError when out of range)."""
        if not 0 <= token_id < self._n:
            raise IndexError(f"token id {token_id} out of range (n_vocab={self._n})")
        o = self._offsets
        return self._blob[o[token_id]:o[token_id + 1]].decode("utf-8", _ERRORS)

    def get(self, text: str, default=None):
        """The id of `text`, or `default`."""
        found = self._recent.get(text, _MISSING)
        if found is _MISSING:
            found = self._lookup(text)
            if len(self._recent) >= _RECENT_MAX:
                self._recent.clear()
            self._recent[text] = found
        return default if found is None else found

    def _lookup(self, text: str) -> int | None:
        h = hash(text)
        slots, hashes, mask = self._slots, self._hashes, self._mask
        j = h & mask
        h &= 0xFFFFFFFF
        while (k := slots[j]) >= 0:
            if hashes[k] == h:  # almost surely the text: confirm on the bytes
                o = self._offsets
                if self._blob[o[k]:o[k + 1]] == text.encode("utf-8", _ERRORS):
                    return k
            j = (j + 1) & mask
        return None

    def __getitem__(self, token_id: int) -> str:
        return self.text(token_id)

    def __contains__(self, text) -> bool:
        return isinstance(text, str) and self.get(text) is not None

    def nbytes(self) -> int:
        """Bytes held by the packed texts and the table."""
        return (len(self._blob) + self._offsets.itemsize * len(self._offsets)
                + self._slots.itemsize * len(self._slots)
                + self._hashes.itemsize * len(self._hashes))

    def __repr__(self) -> str:
        return f"Vocab({self._n} tokens, {self.nbytes() / 2**20:.1f} MiB)"
