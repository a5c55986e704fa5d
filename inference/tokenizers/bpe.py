"""Byte-level BPE as llama.cpp does it (`tokenizer.ggml.model = gpt2`; `gemma4` is the same
merging on raw UTF-8 characters, with <0xXX> byte tokens for what no merge covers).

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


QWEN35_REGEX = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|"
                r"[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|"
                r"\s+(?!\S)|\s+")
NEWLINES_REGEX = r"[^\n]+|[\n]+"


class PreConfig:
    """What `tokenizer.ggml.pre` selects in llama.cpp's vocab loader."""

    def __init__(self, regexes, clean_spaces=True, ignore_merges=False, add_bos=False,
                 no_bos=False, byte_encode=True, whole_newline_words=False, force_bos=False):
        self.regexes = list(regexes)
        self.clean_spaces = clean_spaces
        self.ignore_merges = ignore_merges
        self.add_bos = add_bos
        self.no_bos = no_bos  # llama.cpp clears the default BOS id (chatglm)
        # False for SentencePiece-style BPE (Gemma 4): merges run on the raw UTF-8 characters,
        # spaces are escaped to U+2581 first and missing bytes fall back to <0xXX> tokens
        self.byte_encode = byte_encode
        self.escape_whitespaces = not byte_encode
        # Gemma 4: a word of newlines that is a token stays whole
        self.whole_newline_words = whole_newline_words
        self.force_bos = force_bos  # add BOS even when the file says not to (Gemma 4)


_STARCODER = [r"\p{N}", GPT2_REGEX]
_DEFAULT = [r"[\p{P}\$\+<=>\^~\|]+", GPT2_REGEX, r"\p{N}+", r"[0-9][0-9][0-9]"]
_FALCON = [r"[\p{P}\$\+<=>\^~\|`]+", GPT2_REGEX, r"[0-9][0-9][0-9]"]
_BLOOM = [" ?[^(\\s|.,!?…。，、।۔،)]+"]
_VIKING = [" ?[^(\\s|.,!?…。，、।۔،)]+", r"\p{N}"]
_DEEPSEEK_CODER = ["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[一-龥ࠀ-一가-퟿]+", r"\p{N}"]
_BAILINGMOE = [r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"]
# written with escapes: these classes hold code points that editors and terminals normalize
_DEEPSEEK_LLM = [
    "[\r\n]",
    "\\s?[A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370"
    "-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-"
    "\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d"
    "\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6"
    "-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-"
    "\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-"
    "\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-"
    "\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b"
    "-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-"
    "\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-"
    "\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    "\\s+$",
    "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
    "\\p{N}+",
]
_DEEPSEEK3 = [
    "\\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\"
    "p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]
_SPARK2_5 = [
    "\\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\"
    "p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+",
    "\\p{N}",
]
_YOUTU = [
    "[\uac00-\ud7a3\u3131-\u318e]+|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b"
    "\uff0c\u3001-\u303f\ufe30-\ufe4f]+|[\u3105-\u312f]+|[\u4e00-\u9fa5\u3040-\u309f\u30a0-"
    "\u30ff]+",
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}"
    "\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV]"
    "[eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!"
    "\\S)|\\s+",
]
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_JAIS2 = [_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|"
          r"\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}"]
_CHAMELEON = ["<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )",
              r"\p{N}", r"[\p{P}!-/:-@\[-`{-~]", GPT2_REGEX]
_GRANITE_EMB_MULTI = [
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+" + _CONTRACTIONS
    + r"?|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*"
    + _CONTRACTIONS + r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"]
_EXAONE_MOE = [_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+"]
_MINICPM5 = [r"\p{N}{1,3}", _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"]
_UFAKZEKA = [r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
             r"\s+(?!\S)|\s+"]
_SEED_CODER = [r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
               r"\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"]


def _pre_table() -> dict[str, PreConfig]:
    t: dict[str, PreConfig] = {}

    def add(names, *args, **kw):
        for name in names:
            t[name] = PreConfig(*args, **kw)

    add(["default", ""], _DEFAULT)
    add(["deepseek-llm"], _DEEPSEEK_LLM, clean_spaces=False)
    add(["deepseek-v3", "hunyuan-dense", "hy_v4", "joyai-llm"], _DEEPSEEK3, clean_spaces=False)
    add(["spark2_5"], _SPARK2_5, clean_spaces=False)
    add(["youtu"], _YOUTU, clean_spaces=False, ignore_merges=True)
    add(["jais-2"], _JAIS2)
    add(["qwen35"], [QWEN35_REGEX], clean_spaces=False)
    add(["gemma4", "granite-embed-multi-311m"], [NEWLINES_REGEX], byte_encode=False,
        whole_newline_words=True, force_bos=True)
    add(["sarvam-moe"], [NEWLINES_REGEX], byte_encode=False, clean_spaces=False)
    add(["chameleon"], _CHAMELEON, add_bos=True, clean_spaces=False)
    add(["granite-embed-multi-97m"], _GRANITE_EMB_MULTI, clean_spaces=False, ignore_merges=True)
    add(["exaone-moe"], _EXAONE_MOE)
    add(["minicpm5"], _MINICPM5, ignore_merges=True)
    add(["laguna"], [NEWLINES_REGEX, QWEN2_REGEX], clean_spaces=False)
    add(["ufakzeka"], _UFAKZEKA, clean_spaces=False)
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
    add(["chatglm-bpe"], [LLAMA3_REGEX], no_bos=True)
    add(["glm4", "glm5"], [LLAMA3_REGEX], no_bos=True, ignore_merges=True)
    add(["tekken"], [TEKKEN_REGEX], clean_spaces=False, ignore_merges=True, add_bos=True)
    add(["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"], [GPT4O_REGEX], clean_spaces=False)
    add(["bailingmoe", "bailingmoe2", "llada-moe"], _BAILINGMOE, clean_spaces=False)
    add(["seed-coder"], _SEED_CODER, clean_spaces=False)
    return t


PRE_TOKENIZERS: dict[str, PreConfig] = _pre_table()


# ----------------------------------------------------------------------------- splitting

# The GPT-2, Llama-3 and Qwen 3.5 regexes get llama.cpp's hand-written splitters, which behave as
# the regex (GPT-2's with a final `|\s+` alternative) on the code points' own Unicode classes.
_CUSTOM = {
    GPT2_REGEX: GPT2_REGEX + r"|\s+",
    LLAMA3_REGEX: LLAMA3_REGEX,
    LLAMA3_REGEX_ORIG: LLAMA3_REGEX,
    QWEN35_REGEX: QWEN35_REGEX,
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
        if expr.endswith("$") and not expr.endswith("\\$"):
            expr = expr[:-1] + r"\Z"  # ECMAScript's $ is the end of the input, never a newline
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
        pre = self.pre
        enc = byte_encode(word) if pre.byte_encode else word
        tok = self.token_to_id
        if pre.ignore_merges and (tid := tok.get(enc)) is not None:
            return (tid,)
        if pre.whole_newline_words and not enc.strip("\n") and (tid := tok.get(enc)) is not None:
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
            # llama.cpp looks each byte of the symbol's UTF-8 up as a one-byte token (as a <0xXX>
            # token without byte encoding) and drops the bytes that are not tokens.
            for b in s.encode("utf-8", "surrogatepass"):
                if self.pre.byte_encode:
                    one = chr(b) if b < 0x80 else chr(0xDC00 + b)  # GGUF strings: surrogateescape
                else:
                    one = f"<0x{b:02X}>"
                tid = tok.get(one)
                if tid is not None:
                    yield tid
