"""Byte-level BPE as llama.cpp does it (`tokenizer.ggml.model = gpt2`).

Two parts, both following llama.cpp's `src/unicode.cpp` and `src/llama-vocab.cpp`:

* `PreTokenizer` splits text into words with the pre-tokenizer's list of regexes, each regex
  splitting the pieces the previous one left. Like `unicode_regex_split`, both the matches and the
  unmatched spans between them become pieces. llama.cpp runs the GPT-2 and Llama-3 regexes through
  hand-written splitters that behave like the regex plus a trailing `|\\s+`; every other regex goes
  through `std::regex` on a "collapsed" copy of the text (every code point >= 128 replaced by one
  byte standing for its Unicode category, `\\p{X}` in the regex rewritten to match that byte), and
  `PreTokenizer` reproduces both paths with the `regex` module.
* `BPEModel` maps a word's UTF-8 bytes to GPT-2's printable byte characters and merges adjacent
  symbols lowest merge rank first, leftmost on ties (`llm_tokenizer_bpe_session`).
"""
from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

import regex

if TYPE_CHECKING:
    from .vocab import Vocab

# ----------------------------------------------------------------------------- GPT-2 byte map


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable character map (`unicode_byte_to_utf8_map`)."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return table


BYTE_TO_UNICODE: dict[int, str] = _bytes_to_unicode()
UNICODE_TO_BYTE: dict[str, int] = {c: b for b, c in BYTE_TO_UNICODE.items()}
# bytes.translate-free encoder: index by byte value
_BYTE_CHARS: list[str] = [BYTE_TO_UNICODE[b] for b in range(256)]


def byte_encode(word: str) -> str:
    """The word's UTF-8 bytes as GPT-2 byte characters."""
    chars = _BYTE_CHARS
    return "".join([chars[b] for b in word.encode("utf-8", "surrogatepass")])


def byte_decode(text: str) -> bytes:
    """Inverse of `byte_encode` for a vocabulary token, as `llama_decode_text`: a character outside
    the byte map becomes `[UNK_BYTE_0x<hex>` + the whole token text + `]`."""
    table = UNICODE_TO_BYTE
    out = bytearray()
    for ch in text:
        b = table.get(ch)
        if b is not None:
            out.append(b)
        else:
            utf8 = ch.encode("utf-8", "surrogatepass")
            out += (b"[UNK_BYTE_0x" + utf8.hex().encode()
                    + text.encode("utf-8", "surrogateescape") + b"]")
    return bytes(out)


# ----------------------------------------------------------------------------- pre-tokenizer regexes

GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3_REGEX = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
                r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_REGEX_ORIG = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                     r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
               r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT4O_REGEX = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
               r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|"
               r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
               r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|"
               r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TEKKEN_REGEX = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|"
                r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|"
                r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


class PreConfig:
    """What `tokenizer.ggml.pre` selects in llama.cpp's vocab loader."""

    def __init__(self, regexes, clean_spaces=True, ignore_merges=False, add_bos=False,
                 no_bos=False):
        self.regexes = list(regexes)
        self.clean_spaces = clean_spaces
        self.ignore_merges = ignore_merges
        self.add_bos = add_bos
        self.no_bos = no_bos  # llama.cpp clears the default BOS id (chatglm)


_STARCODER = [r"\p{N}", GPT2_REGEX]
_DEFAULT = [r"[\p{P}\$\+<=>\^~\|]+", GPT2_REGEX, r"\p{N}+", r"[0-9][0-9][0-9]"]
_FALCON = [r"[\p{P}\$\+<=>\^~\|`]+", GPT2_REGEX, r"[0-9][0-9][0-9]"]
_BLOOM = [" ?[^(\\s|.,!?…。，、।۔،)]+"]
_VIKING = [" ?[^(\\s|.,!?…。，、।۔،)]+", r"\p{N}"]
_DEEPSEEK_CODER = ["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[一-龥ࠀ-一가-퟿]+", r"\p{N}"]
_BAILINGMOE = [r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"]
_SEED_CODER = [r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
               r"\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"]


def _pre_table() -> dict[str, PreConfig]:
    t: dict[str, PreConfig] = {}

    def add(names, *args, **kw):
        for name in names:
            t[name] = PreConfig(*args, **kw)

    add(["default", ""], _DEFAULT)
    add(["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
         "jina-v5-nano"], [LLAMA3_REGEX], ignore_merges=True, add_bos=True)
    add(["dbrx", "smaug-bpe"], [LLAMA3_REGEX])
    add(["deepseek-coder"], _DEEPSEEK_CODER, clean_spaces=False)
    add(["falcon"], _FALCON)
    add(["starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"], _STARCODER)
    add(["command-r", "smollm"], _STARCODER, clean_spaces=False)
    add(["gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
         "mellum", "modern-bert", "exaone4", "mpt", "olmo", "jais", "jina-v1-en", "jina-v2-code",
         "roberta-bpe"], [GPT2_REGEX])
    add(["trillion", "granite-docling"], [GPT2_REGEX], clean_spaces=False)
    add(["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open"], [QWEN2_REGEX],
        clean_spaces=False)
    add(["stablelm2", "megrez"], [QWEN2_REGEX])
    add(["grok-2"], [QWEN2_REGEX], clean_spaces=False)
    add(["poro-chat"], _BLOOM, clean_spaces=False)
    add(["bloom", "gpt3-finnish"], _BLOOM)
    add(["viking"], _VIKING, clean_spaces=False)
    add(["glm4", "chatglm-bpe"], [LLAMA3_REGEX], no_bos=True)
    add(["tekken"], [TEKKEN_REGEX], clean_spaces=False, ignore_merges=True, add_bos=True)
    add(["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"], [GPT4O_REGEX], clean_spaces=False)
    add(["bailingmoe", "bailingmoe2", "llada-moe"], _BAILINGMOE, clean_spaces=False)
    add(["seed-coder"], _SEED_CODER, clean_spaces=False)
    return t


PRE_TOKENIZERS: dict[str, PreConfig] = _pre_table()


# ----------------------------------------------------------------------------- splitting

# The GPT-2 and Llama-3 regexes get llama.cpp's hand-written splitters, which behave as the regex
# with a final `|\s+` alternative, on code point flags generated from the `regex` module.
_CUSTOM = {
    GPT2_REGEX: GPT2_REGEX + r"|\s+",
    LLAMA3_REGEX: LLAMA3_REGEX,
    LLAMA3_REGEX_ORIG: LLAMA3_REGEX,
}

# unicode_regex_split's category collapsing
_UCAT_ENUM = {r"\p{N}": 0xD1, r"\p{L}": 0xD2, r"\p{P}": 0xD3, r"\p{M}": 0xD4, r"\p{S}": 0xD5,
              r"\p{Lu}": 0xD2, r"\p{Ll}": 0xD2, r"\p{Lt}": 0xD2, r"\p{Lm}": 0xD2, r"\p{Lo}": 0xD2}
_UCAT_MAP = {0xD1: "0-9", 0xD2: "A-Za-z", 0xD3: r"!-#%-*,-/:-;?-@\[-\]_\{\}", 0xD4: "",
             0xD5: r"\$\+<->^`\|"}

_RE_WS = regex.compile(r"\s")
_RE_SURROGATE = regex.compile("[\ud800-\udfff]")
_RE_CATS = [(regex.compile(r"\p{N}"), "\xd1"), (regex.compile(r"\p{L}"), "\xd2"),
            (regex.compile(r"\p{P}"), "\xd3"), (regex.compile(r"\p{M}"), "\xd4"),
            (regex.compile(r"\p{S}"), "\xd5")]


class _CollapseTable(dict):
    """str.translate table: code point → its collapsed character (computed on first use)."""

    def __missing__(self, cp: int) -> str:
        if cp < 128:
            out = chr(cp)
        else:
            ch = chr(cp)
            if _RE_WS.match(ch):
                out = "\x0b"
            else:
                out = "\xd0"
                for rx, rep in _RE_CATS:
                    if rx.match(ch):
                        out = rep
                        break
        self[cp] = out
        return out


class _WhitespaceTable(dict):
    """str.translate table for the std::wregex path: non-ASCII whitespace → vertical tab."""

    def __missing__(self, cp: int) -> str:
        ch = chr(cp)
        out = "\x0b" if cp > 0x7F and _RE_WS.match(ch) else ch
        self[cp] = out
        return out


_COLLAPSE = _CollapseTable()
_WS_ONLY = _WhitespaceTable()


def collapse_regex(expr: str) -> str:
    """unicode_regex_split's rewrite of `\\p{X}` into a class over the collapsed bytes."""
    out = []
    inside = False
    i, n = 0, len(expr)
    while i < n:
        c = expr[i]
        if c == "[" and (i == 0 or expr[i - 1] != "\\"):
            out.append("[")
            inside = True
            i += 1
            continue
        if inside and c == "]" and expr[i - 1] != "\\":
            out.append("]")
            inside = False
            i += 1
            continue
        if c == "\\" and i + 3 < n and expr[i + 1] == "p" and expr[i + 2] == "{":
            close = expr.find("}", i + 3)
            if close != -1 and close <= i + 10:
                pat = expr[i:close + 1]
                if pat in _UCAT_ENUM:
                    cat = _UCAT_ENUM[pat]
                    out.append(("" if inside else "[") + chr(cat) + _UCAT_MAP[cat]
                               + ("" if inside else "]"))
                    i = close + 1
                    continue
        out.append(c)
        i += 1
    return "".join(out)


class _Splitter:
    """One regex of the list: splits each piece into matched and unmatched spans."""

    def __init__(self, expr: str):
        if expr in _CUSTOM:
            self.mode = "raw"
            self.rx = regex.compile(_CUSTOM[expr])
        elif any(cat in expr for cat in _UCAT_ENUM):
            if any(ord(ch) >= 128 for ch in expr):
                raise ValueError("regex mixes unicode categories and non-ASCII characters")
            self.mode = "collapsed"
            self.rx = regex.compile(collapse_regex(expr), regex.ASCII)
        else:
            self.mode = "wide"
            self.rx = regex.compile(expr, regex.ASCII)

    def split(self, text: str, pieces: list[tuple[int, int]]) -> list[tuple[int, int]]:
        if self.mode == "raw":
            subject = text
        elif self.mode == "collapsed":
            subject = text.translate(_COLLAPSE)
        else:
            subject = text.translate(_WS_ONLY)
        finditer = self.rx.finditer
        out: list[tuple[int, int]] = []
        for start, end in pieces:
            pos = start
            for m in finditer(subject, start, end):
                a, b = m.span()
                if a == b:
                    continue  # std::regex_iterator would step past an empty match too
                if a > pos:
                    out.append((pos, a))
                out.append((a, b))
                pos = b
            if pos < end:
                out.append((pos, end))
        return out


class PreTokenizer:
    def __init__(self, regexes: list[str]):
        self.splitters = [_Splitter(r) for r in regexes]

    def split(self, text: str) -> list[str]:
        pieces = [(0, len(text))] if text else []
        for sp in self.splitters:
            pieces = sp.split(text, pieces)
        return [text[a:b] for a, b in pieces]


# ----------------------------------------------------------------------------- merging


class BPEModel:
    """Rank-ordered merges over GPT-2 byte characters, with a word → ids cache."""

    CACHE_LIMIT = 200_000

    def __init__(self, token_to_id: Vocab, merges, pre: PreConfig):
        self.token_to_id = token_to_id
        # llama.cpp splits each merge at the first space after position 0 and keeps the first
        # rank of a duplicate pair; a lookup key "left right" (neither side holding a space) then
        # equals the merge line itself.
        ranks: dict[str, int] = {}
        for i, line in enumerate(merges):
            if isinstance(line, bytes):
                line = line.decode("utf-8", "surrogateescape")
            pos = line.find(" ", 1)
            key = line if pos != -1 else " "
            if key not in ranks:
                ranks[key] = i
        self.ranks = ranks
        self.pre = pre
        self.pretokenizer = PreTokenizer(pre.regexes)
        self.cache: dict[str, tuple[int, ...]] = {}

    def encode(self, text: str) -> list[int]:
        """Token ids of one raw-text fragment (no special tokens inside)."""
        if not text.isascii() and _RE_SURROGATE.search(text):
            # A str holding lone surrogates stands for bytes that are not UTF-8; llama.cpp's
            # decoder turns each such byte into U+FFFD before splitting.
            text = _RE_SURROGATE.sub("\ufffd", text)
        out: list[int] = []
        cache = self.cache
        for word in self.pretokenizer.split(text):
            ids = cache.get(word)
            if ids is None:
                ids = self._encode_word(word)
                if len(cache) >= self.CACHE_LIMIT:
                    cache.clear()
                cache[word] = ids
            out.extend(ids)
        return out

    def _encode_word(self, word: str) -> tuple[int, ...]:
        enc = byte_encode(word)
        tok = self.token_to_id
        if self.pre.ignore_merges and (tid := tok.get(enc)) is not None:
            return (tid,)
        return tuple(self._symbols_to_ids(self._merge(enc)))

    def _merge(self, enc: str) -> list[str]:
        n = len(enc)
        if n < 2:
            return [enc] if n else []
        ranks = self.ranks
        sym = list(enc)
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap: list[tuple[int, int, int, str]] = []
        for i in range(n - 1):
            r = ranks.get(sym[i] + " " + sym[i + 1])
            if r is not None:
                heap.append((r, i, i + 1, sym[i] + sym[i + 1]))
        if not heap:
            return sym
        heapq.heapify(heap)
        pop, push = heapq.heappop, heapq.heappush
        while heap:
            _, left, right, text = pop(heap)
            ls, rs = sym[left], sym[right]
            if not ls or not rs or ls + rs != text:
                continue
            sym[left] = text
            sym[right] = ""
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prv[after] = left
            before = prv[left]
            if before >= 0:
                r = ranks.get(sym[before] + " " + text)
                if r is not None:
                    push(heap, (r, before, left, sym[before] + text))
            if after >= 0:
                r = ranks.get(text + " " + sym[after])
                if r is not None:
                    push(heap, (r, left, after, text + sym[after]))
        return [s for s in sym if s]

    def _symbols_to_ids(self, symbols: list[str]):
        tok = self.token_to_id
        for s in symbols:
            tid = tok.get(s)
            if tid is not None:
                yield tid
                continue
            # llama.cpp looks each byte of the symbol's UTF-8 up as a one-byte token and drops
            # the bytes that are not tokens.
            for b in s.encode("utf-8", "surrogatepass"):
                one = chr(b) if b < 0x80 else chr(0xDC00 + b)  # GGUF strings: surrogateescape
                tid = tok.get(one)
                if tid is not None:
                    yield tid
