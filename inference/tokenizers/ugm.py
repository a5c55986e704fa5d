"""Unigram (T5 / XLM-R SentencePiece) as llama.cpp's `llm_tokenizer_ugm_session`
(`tokenizer.ggml.model = t5`).

Normalization (`normalize`) walks the text's UTF-8 bytes: a prefix that follows a path of the
USER_DEFINED tokens' byte trie is kept as it is; otherwise the longest prefix found in the
model's precompiled character map (SentencePiece's XOR-compressed double array, `charsmap`) is
replaced by its mapping; otherwise one UTF-8 character is copied (an invalid byte becomes
U+FFFD). Spaces become U+2581, with one in front of the text (`add_space_prefix`) or runs of
them merged to one before each word (`remove_extra_whitespaces`).

Tokenization is SentencePiece's Viterbi search: at each code point every NORMAL, USER_DEFINED or
UNUSED token starting there extends the best path ending there (USER_DEFINED tokens score 0), a
code point no one-character token covers may be the unknown token (the lowest score minus 10),
and the best path is read back from the end with runs of unknown tokens merged.
"""
from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..hparams import ModelMetadataError

if TYPE_CHECKING:
    from .vocab import Vocab

ATTR_UNKNOWN, ATTR_UNUSED, ATTR_NORMAL = 1 << 0, 1 << 1, 1 << 2
ATTR_USER_DEFINED = 1 << 4
_SPACE = "\u2581"
# a malformed map is the file's fault, found when it is read or (a node out of bounds, as
# llama.cpp's xcda_array_view throws) when a lookup reaches the broken part
_KEY = "GGUF metadata tokenizer.ggml.precompiled_charsmap"


class CharsMap:
    """SentencePiece's precompiled normalization map: a double array (XCDA) of byte strings,
    each leading to a NUL-terminated replacement."""

    def __init__(self, blob: bytes):
        if len(blob) < 4:
            raise ModelMetadataError(f"{_KEY} too small: {len(blob)} bytes, expected a "
                                     "4-byte size and a double array")
        (size,) = struct.unpack_from("<I", blob)
        if size + 4 >= len(blob):
            raise ModelMetadataError(f"{_KEY}: double array of {size} bytes does not fit "
                                     f"in {len(blob)} bytes")
        self.nodes = np.frombuffer(blob, "<u4", size // 4, 4).tolist()
        self.replacements = blob[4 + size:]

    def _node(self, i: int) -> int:
        if i >= len(self.nodes):
            raise ModelMetadataError(f"{_KEY}: node {i} outside the double array")
        return self.nodes[i]

    @staticmethod
    def _base(node: int) -> int:
        return (node >> 10) << ((node & (1 << 9)) >> 6)

    def longest(self, data: bytes, start: int) -> tuple[int, bytes] | None:
        """(bytes matched, replacement) for the longest mapped prefix of data[start:]."""
        node = self._node(0)
        index = self._base(node)
        best = None
        for pos in range(start, len(data)):
            c = data[pos]
            if c == 0:
                break
            index ^= c
            node = self._node(index)
            if node & ((1 << 31) | 0xFF) != c:
                break
            leaf = (node >> 8) & 1
            index ^= self._base(node)
            if leaf:
                best = (pos - start + 1, self._node(index) & ((1 << 31) - 1))
        if best is None:
            return None
        length, offset = best
        end = self.replacements.find(b"\0", offset)
        if offset >= len(self.replacements) or end < 0:
            raise ModelMetadataError(f"{_KEY}: replacement at {offset} is not terminated")
        return length, self.replacements[offset:end]


def _utf8_length(data: bytes, pos: int) -> int:
    """Bytes of the character at data[pos] as unicode_cpt_from_utf8 reads it (lead byte and
    continuation bytes only, no overlong or range check); 0 when it throws."""
    b = data[pos]
    if not b & 0x80:
        return 1
    n = 0 if not b & 0x40 else 2 if not b & 0x20 else 3 if not b & 0x10 else \
        4 if not b & 0x08 else 0
    if n == 0 or pos + n > len(data):
        return 0
    if any(c & 0xC0 != 0x80 for c in data[pos + 1:pos + n]):
        return 0
    return n


class UGMModel:
    def __init__(self, token_to_id: Vocab, scores: Sequence[float], load_attrs: np.ndarray,
                 attrs: Sequence[int], unk_id: int | None, charsmap: bytes | None,
                 add_space_prefix: bool, remove_extra_whitespaces: bool):
        """load_attrs: the attributes as the token types give them (llama.cpp builds its tries
        before its special-token heuristics run); attrs: the live ones."""
        self.token_to_id = token_to_id
        self.scores = scores
        self.attrs = attrs
        self.unk_id = unk_id
        self.charsmap = CharsMap(bytes(charsmap)) if charsmap is not None and len(charsmap) \
            else None
        self.add_space_prefix = add_space_prefix
        self.merge_spaces = remove_extra_whitespaces
        matchable = (load_attrs & (ATTR_NORMAL | ATTR_USER_DEFINED | ATTR_UNUSED)) != 0
        self._matchable = matchable
        normal = (load_attrs & ATTR_NORMAL) != 0
        lowest = np.float32(np.asarray(scores, np.float32)[:len(load_attrs)][normal].min()) \
            if normal.any() else np.float32(np.finfo(np.float32).max)
        self.unknown_score = float(lowest - np.float32(10.0))  # float arithmetic, as in C++
        self.max_len = max((len(token_to_id[i]) for i in np.nonzero(matchable)[0].tolist()),
                           default=0)
        self._user_trie: dict = {}  # USER_DEFINED tokens' bytes
        for i in np.nonzero(load_attrs & ATTR_USER_DEFINED)[0].tolist():
            node = self._user_trie
            for b in token_to_id[i].encode("utf-8", "surrogateescape"):
                node = node.setdefault(b, {})

    def encode(self, text: str) -> list[int]:
        norm = self.normalize(text.encode("utf-8", "surrogateescape"))
        n = len(norm)
        if n == 0:
            return []
        tok, scores, attrs, unk = self.token_to_id, self.scores, self.attrs, self.unk_id
        matchable = self._matchable
        # best[i]: (score, token, start) of the best tokenization of norm[:i]
        best: list[tuple[float, int | None, int]] = [(-np.inf, unk, 0)] * (n + 1)
        best[0] = (0.0, unk, 0)
        for i in range(n):
            here = best[i][0]
            single = False
            for j in range(i + 1, min(n, i + self.max_len) + 1):
                tid = tok.get(norm[i:j])
                if tid is None or not matchable[tid]:
                    continue
                if j == i + 1:
                    single = True
                score = here + (0.0 if attrs[tid] & ATTR_USER_DEFINED else scores[tid])
                if score > best[j][0]:
                    best[j] = (score, tid, i)
            if not single:
                score = here + self.unknown_score
                if score > best[i + 1][0]:
                    best[i + 1] = (score, unk, i)
        out: list[int] = []
        prev_unknown = False
        i = n
        while True:
            _, tid, start = best[i]
            unknown = tid == unk
            if not (prev_unknown and unknown):
                out.append(tid)
            if start == 0:
                break
            prev_unknown = unknown
            i = start
        out.reverse()
        return out

    def normalize(self, data: bytes) -> str:
        """llm_tokenizer_ugm_session::normalize, on bytes; the result as text."""
        out = bytearray()
        space = _SPACE.encode()
        prepend = self.add_space_prefix
        merge = self.merge_spaces
        prepended = in_word = False
        pos = 0
        while pos < len(data):
            piece, used = self._normalize_prefix(data, pos)
            for c in piece:
                if c != 0x20:
                    if not in_word:
                        in_word = True
                        if (prepend and not prepended) or merge:
                            out += space
                            prepended = True
                    out.append(c)
                else:
                    in_word = False
                    if not merge:
                        out += space
            pos += used
        return out.decode("utf-8", "surrogateescape")

    def _normalize_prefix(self, data: bytes, pos: int) -> tuple[bytes, int]:
        """(normalized bytes, input bytes used) for the start of data[pos:]."""
        node, end = self._user_trie, pos
        while end < len(data) and (node := node.get(data[end])) is not None:
            end += 1  # the deepest trie path, token end or not, as naive_trie gives it
        if end > pos:
            return data[pos:end], end - pos
        if self.charsmap is not None:
            found = self.charsmap.longest(data, pos)
            if found is not None:
                return found[1], found[0]
        n = _utf8_length(data, pos)
        if n == 0:
            return "\ufffd".encode(), 1
        return data[pos:pos + n], n
