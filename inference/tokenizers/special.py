"""Special tokens cut out of text in one pass, with the result of llama.cpp's
`tokenizer_st_partition`.

llama.cpp tries the special tokens one after another in the order of `cache_special_tokens`
(longest text first). Each token is searched for in every raw fragment the tokens before it
left, leftmost first; a match splits its fragment, an LSTRIP token also drops the whitespace
(C `isspace`) before it and an RSTRIP token the whitespace after it, within the fragment. That
costs text length × number of special tokens: Gemma 3 has 6,414 of them.

`SpecialPartitioner` gets the same fragments from one scan of the text and work proportional to
the matches:

* one regex built from a trie of the token texts reports, at each position, the longest token
  starting there; the shorter tokens starting there are its prefixes (a short list per token);
* tokens that repeat one character (Gemma's runs of spaces, tabs and newlines) would occur at
  every position of a long run, so they are found as maximal runs of that character instead;
* the occurrences are then settled token by token in llama.cpp's order: an occurrence is taken
  when none of its characters is claimed yet (by an earlier token or stripped whitespace) and it
  starts after the token's previous match, which is what the fragment-by-fragment search gives.
"""
from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Sequence

C_SPACE = " \t\n\v\f\r"  # C isspace() in the "C" locale


def trie_regex(texts: Sequence[str]) -> str:
    """A regex matching the longest of `texts` that starts at the current position: the texts'
    trie as nested groups, each token end an optional (greedy) continuation."""
    trie: dict = {}
    for text in texts:
        node = trie
        for ch in text:
            node = node.setdefault(ch, {})
        node[""] = True  # a token ends here

    def emit(node: dict) -> str:
        out = []
        while True:  # a chain of single children is one literal, without recursion
            kids = sorted(k for k in node if k)
            if not kids:
                return "".join(out)
            if len(kids) == 1 and "" not in node:
                out.append(re.escape(kids[0]))
                node = node[kids[0]]
                continue
            parts = [re.escape(k) + emit(node[k]) for k in kids]
            body = parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"
            if "" in node:
                body = "(?:" + body + ")?"
            return "".join(out) + body

    return emit(trie)


class SpecialPartitioner:
    """tokenizer_st_partition for one list of special tokens (in llama.cpp's order) and their
    LSTRIP / RSTRIP attributes."""

    def __init__(self, texts: Sequence[str], ids: Sequence[int], lstrip: Sequence[bool],
                 rstrip: Sequence[bool]):
        self.spec = (list(texts), list(ids), list(lstrip), list(rstrip))
        self._ids = list(ids)
        self._lens = [len(t) for t in texts]
        self._lstrip = list(lstrip)
        self._rstrip = list(rstrip)
        self._rank: dict[str, int] = {}  # text → position in the order, for multi-char tokens
        # run character → its one-character-run tokens as (length, rank), longest first
        self._runs: dict[str, list[tuple[int, int]]] = {}
        for rank, text in enumerate(texts):
            if text and text == text[0] * len(text):
                self._runs.setdefault(text[0], []).append((len(text), rank))
            elif text:
                self._rank[text] = rank
        self._chains: dict[str, tuple[int, ...]] = {}
        self._find_tokens = (re.compile("(?=(" + trie_regex(list(self._rank)) + "))").finditer
                             if self._rank else None)
        self._find_runs = (re.compile("|".join(
            f"{re.escape(ch)}{{{min(n for n, _ in runs)},}}" for ch, runs in self._runs.items()
        )).finditer if self._runs else None)

    def partition(self, text: str) -> list:
        """The fragments in order: ints are special token ids, (start, end) pairs raw text."""
        n = len(text)
        if not n:
            return []
        starts, runs = self._occurrences(text)
        if not starts and not runs:
            return [(0, n)]
        claimed = bytearray(n)
        found: list[tuple[int, int, int]] = []
        for rank in sorted(starts.keys() | runs.keys()):
            if rank in starts:
                self._take_matches(text, claimed, rank, starts[rank], found)
            else:
                self._take_runs(text, claimed, rank, runs[rank], found)
        return _fragments(claimed, found)

    def _occurrences(self, text: str) -> tuple[dict, dict]:
        """rank → sorted start positions, for multi-character tokens; rank → the maximal runs
        of its character long enough to hold it, as (start, end) pairs, for run tokens."""
        starts: dict[int, list[int]] = {}
        runs: dict[int, list[tuple[int, int]]] = {}
        if self._find_tokens is not None:
            chains = self._chains
            for m in self._find_tokens(text):
                word = m.group(1)
                chain = chains.get(word)
                if chain is None:
                    chain = self._chain(word)
                p = m.start()
                for rank in chain:
                    where = starts.get(rank)
                    if where is None:
                        starts[rank] = [p]
                    else:
                        where.append(p)
        if self._find_runs is not None:
            by_char: dict[str, list[tuple[int, int]]] = {}
            for m in self._find_runs(text):
                span = m.span()
                by_char.setdefault(text[span[0]], []).append(span)
            for ch, spans in by_char.items():
                spans.sort(key=lambda s: s[0] - s[1])  # longest first
                neg_lengths = [s[0] - s[1] for s in spans]
                for length, rank in self._runs[ch]:
                    k = bisect_right(neg_lengths, -length)  # the runs at least this long
                    if k:
                        runs[rank] = spans[:k]
        return starts, runs

    def _chain(self, word: str) -> tuple[int, ...]:
        """Ranks of the multi-character tokens that are prefixes of `word` (itself included)."""
        rank = self._rank
        chain = tuple(r for k in range(2, len(word) + 1) if (r := rank.get(word[:k])) is not None)
        self._chains[word] = chain
        return chain

    def _take_matches(self, text, claimed, rank, starts, found) -> None:
        """Leftmost-first matches of one token among its occurrences: one that overlaps an
        earlier match (of this token or another) or stripped whitespace is skipped."""
        n = self._lens[rank]
        for p in starts:
            if claimed.find(1, p, p + n) < 0:
                self._take(text, claimed, rank, p, found)

    def _take_runs(self, text, claimed, rank, spans, found) -> None:
        """Leftmost-first matches of a one-character-run token inside the runs of its
        character, stepping over what earlier tokens claimed."""
        n = self._lens[rank]
        for start, end in spans:
            p = start
            while p + n <= end:
                hit = claimed.find(1, p, p + n)
                if hit < 0:
                    p = self._take(text, claimed, rank, p, found)
                    continue
                p = claimed.find(0, hit + 1, end)
                if p < 0:
                    break

    def _take(self, text, claimed, rank, start, found) -> int:
        """Claim one match and the whitespace it strips; returns where its search resumes."""
        end = start + self._lens[rank]
        claimed[start:end] = b"\x01" * (end - start)
        if self._lstrip[rank]:
            lo = start
            while lo > 0 and not claimed[lo - 1] and text[lo - 1] in C_SPACE:
                lo -= 1
            claimed[lo:start] = b"\x01" * (start - lo)
        found.append((start, end, self._ids[rank]))
        if self._rstrip[rank]:
            hi, limit = end, len(text)
            while hi < limit and not claimed[hi] and text[hi] in C_SPACE:
                hi += 1
            claimed[end:hi] = b"\x01" * (hi - end)
            return hi
        return end


def _fragments(claimed: bytearray, found: list[tuple[int, int, int]]) -> list:
    """Tokens and raw text in text order. Between two tokens the unclaimed characters are one
    span: stripped whitespace always touches the token that stripped it."""
    found.sort()
    out: list = []
    pos = 0
    for start, end, tid in found:
        if start > pos:
            lo = claimed.find(0, pos, start)
            if lo >= 0:
                out.append((lo, claimed.rfind(0, pos, start) + 1))
        out.append(tid)
        pos = end
    lo = claimed.find(0, pos)
    if lo >= 0:
        out.append((lo, claimed.rfind(0, pos) + 1))
    return out


def partition_longest_first(text: str, texts: Sequence[str], ids: Sequence[int],
                            lstrip: Sequence[bool], rstrip: Sequence[bool]) -> list:
    """llama.cpp's own loop, token after token over the fragments (time: text × tokens): the
    reference `SpecialPartitioner` is tested and benchmarked against."""
    frags: list = [(0, len(text))] if text else []
    for s, tid, left, right in zip(texts, ids, lstrip, rstrip):
        if s not in text:
            continue
        out = []
        for frag in frags:
            if frag.__class__ is int:
                out.append(frag)
                continue
            start, end = frag
            while True:
                m = text.find(s, start, end)
                if m < 0:
                    out.append((start, end))
                    break
                left_end = m
                if left:
                    while left_end > start and text[left_end - 1] in C_SPACE:
                        left_end -= 1
                if left_end > start:
                    out.append((start, left_end))
                out.append(tid)
                start = m + len(s)
                if right:
                    while start < end and text[start] in C_SPACE:
                        start += 1
                if start >= end:
                    break
        frags = out
    return frags
