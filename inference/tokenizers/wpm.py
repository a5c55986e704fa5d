"""WordPiece as llama.cpp's `llm_tokenizer_wpm_session` (`tokenizer.ggml.model = bert`).

The text is normalized and split into words the way BERT's basic tokenizer does (`preprocess`):
whitespace ends a word; NUL, U+FFFD and control characters vanish; with `lowercase` each code
point takes its simple lowercase mapping; with `strip_accents` each code point is replaced by the
first code point of its NFD decomposition and combining marks vanish; punctuation, ASCII symbols
and CJK ideographs are words of their own. Each word, behind a U+2581 "phantom space", is then
covered greedily by the longest vocabulary tokens from the left; a word that cannot be covered
becomes the unknown token. Character classes follow llama.cpp's tables, which are generated from
Python's `unicodedata` (`scripts/gen-unicode-data.py`).
"""
from __future__ import annotations

import unicodedata
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .vocab import Vocab

# unicode.cpp's whitespace set (Unicode's White_Space property)
WHITESPACE = frozenset([*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
                        0x2028, 0x2029, 0x202F, 0x205F, 0x3000])

# BertTokenizer's CJK ranges, as llama.cpp has them (0x2B920, not 0x2B820, like HF's Rust code)
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def is_chinese_char(cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in _CJK)


def simple_lower(ch: str) -> str:
    """unicode_tolower: the one-code-point lowercase mapping (İ → i, not i + U+0307)."""
    low = ch.lower()
    return low if len(low) == 1 else low[0]


def nfd_first(ch: str) -> str:
    """unicode_cpts_normalize_nfd keeps one code point: the first of the decomposition."""
    return unicodedata.normalize("NFD", ch)[0]


class WPMModel:
    def __init__(self, token_to_id: Vocab, unk_id: int | None, lowercase: bool = True,
                 strip_accents: bool = True):
        self.token_to_id = token_to_id
        self.unk_id = unk_id
        self.lowercase = lowercase
        self.strip_accents = strip_accents
        self.max_len = max((len(t) for t in token_to_id), default=0)  # in code points
        self._kinds: dict[str, int] = {}  # character → _SKIP / _ALONE / _SPACE / _PART

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        tok = self.token_to_id
        for word in self.words(text):
            word = "\u2581" + word
            n = len(word)
            start = len(out)
            i = 0
            while i < n:
                for j in range(min(n, i + self.max_len), i, -1):
                    tid = tok.get(word[i:j])
                    if tid is not None:
                        out.append(tid)
                        i = j
                        break
                else:  # a piece no token covers: the whole word is unknown
                    del out[start:]
                    break
            if len(out) == start and self.unk_id is not None:
                out.append(self.unk_id)
        return out

    def words(self, text: str) -> list[str]:
        """llm_tokenizer_wpm_session::preprocess."""
        words = [""]
        kinds = self._kinds
        for ch in text:
            kind = kinds.get(ch)
            if kind is None:
                kind = kinds[ch] = self._kind(ch)
            if kind == _PART:
                words[-1] += self._map(ch)
            elif kind == _SPACE:
                if words[-1]:
                    words.append("")
            elif kind == _ALONE:
                if words[-1]:
                    words.append("")
                words[-1] = self._map(ch)
                words.append("")
        if not words[-1]:
            words.pop()
        return words

    def _map(self, ch: str) -> str:
        if self.strip_accents:
            ch = nfd_first(ch)
        return simple_lower(ch) if self.lowercase else ch

    def _kind(self, ch: str) -> int:
        cp = ord(ch)
        if 0xD800 <= cp <= 0xDFFF:
            cp = 0xFFFD  # a byte that is not UTF-8 decodes to U+FFFD
        if self.strip_accents:
            cp = ord(nfd_first(chr(cp))) if cp != 0xFFFD else cp
        if cp in WHITESPACE:
            return _SPACE
        cat = unicodedata.category(chr(cp))
        if cp == 0 or cp == 0xFFFD or cat in ("Cc", "Cf", "Co", "Cs"):
            return _SKIP
        if self.strip_accents and cat[0] == "M":
            return _SKIP
        if cat[0] == "P" or (cp < 0x7F and cat[0] == "S") or is_chinese_char(cp):
            return _ALONE
        return _PART


_SKIP, _ALONE, _SPACE, _PART = range(4)
