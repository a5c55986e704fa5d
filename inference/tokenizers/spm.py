"""SentencePiece-style merging as llama.cpp's `llm_tokenizer_spm_session`.

The text (spaces already escaped to U+2581) starts as one symbol per UTF-8 character. Every pair of
adjacent symbols whose joined text is a vocabulary token goes into a priority queue ordered by that
token's score, highest first, leftmost first on ties; popping a pair whose symbols have changed
since it was queued is skipped. Each finished symbol is its token, or, when it is not in the
vocabulary, one `<0xXX>` byte token per UTF-8 byte.
"""
from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .vocab import Vocab


def utf8_bytes(symbol: str) -> bytes:
    """A symbol's bytes; lone surrogates from surrogateescape stand for the raw byte."""
    try:
        return symbol.encode("utf-8")
    except UnicodeEncodeError:
        out = bytearray()
        for ch in symbol:
            cp = ord(ch)
            if 0xDC80 <= cp <= 0xDCFF:
                out.append(cp - 0xDC00)
            else:
                out += ch.encode("utf-8", "surrogatepass")
        return bytes(out)


class SPMModel:
    def __init__(self, token_to_id: Vocab, scores: Sequence[float], byte_ids: list[int | None],
                 unk_id: int | None):
        self.token_to_id = token_to_id
        self.scores = scores
        self.byte_ids = byte_ids  # byte value → id of "<0xXX>" (or of the 1-byte token)
        self.unk_id = unk_id

    def encode(self, text: str) -> list[int]:
        """Ids of one already-escaped fragment."""
        n = len(text)
        if n == 0:
            return []
        tok = self.token_to_id
        scores = self.scores
        # symbol i covers text[start[i] : start[i] + size[i]]; merging always joins a symbol with
        # its right neighbour, so a live symbol's text is contiguous from its own index.
        size = [1] * n
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap: list[tuple[float, int, int, int]] = []
        for i in range(n - 1):
            tid = tok.get(text[i:i + 2])
            if tid is not None:
                heap.append((-scores[tid], i, 2, i + 1))
        heapq.heapify(heap)
        pop, push = heapq.heappop, heapq.heappush
        while heap:
            _, left, total, right = pop(heap)
            ls, rs = size[left], size[right]
            if ls == 0 or rs == 0 or ls + rs != total:
                continue
            size[left] = total
            size[right] = 0
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prv[after] = left
            before = prv[left]
            if before >= 0:
                joined = size[before] + total
                tid = tok.get(text[before:before + joined])
                if tid is not None:
                    push(heap, (-scores[tid], before, joined, left))
            if after >= 0:
                joined = total + size[after]
                tid = tok.get(text[left:left + joined])
                if tid is not None:
                    push(heap, (-scores[tid], left, joined, after))
        out: list[int] = []
        i = 0
        while i != -1:
            piece = text[i:i + size[i]]
            tid = tok.get(piece)
            if tid is not None:
                out.append(tid)
            else:
                for b in utf8_bytes(piece):
                    bid = self.byte_ids[b]
                    if bid is None:
                        # llama.cpp throws here (no byte token); the unknown token is the
                        # closest meaningful stand-in.
                        bid = self.unk_id
                    if bid is not None:
                        out.append(bid)
            i = nxt[i]
        return out
