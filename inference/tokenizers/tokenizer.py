"""Tokenizers that reproduce llama.cpp's `llama_tokenize` / `llama_detokenize` exactly.

Built from a GGUF metadata mapping (`Tokenizer.from_metadata`), following `src/llama-vocab.cpp`:

* vocabulary types `gpt2` (byte-level BPE, see `bpe`), `gemma4` (BPE on raw UTF-8
  with spaces as U+2581), `llama` (SentencePiece-style merging by score, see `spm`),
  `bert` (WordPiece, `wpm`) and `t5` (Unigram, `ugm`);
* special tokens (CONTROL, USER_DEFINED and UNKNOWN types) are cut out of the text first, longest
  first (`tokenizer_st_partition`, done in one pass by `special`); without
  `parse_special` only the USER_DEFINED ones are;
* BOS/EOS are added as `tokenizer.ggml.add_bos_token` / `add_eos_token` say, with llama.cpp's
  defaults per vocabulary and pre-tokenizer when the keys are absent;
* detokenizing follows `token_to_piece` + `detokenize`, and `StreamDecoder` gives the same text
  piece by piece without ever splitting a UTF-8 character;
* the end-of-generation set follows llama.cpp's heuristics by token text.
"""
from __future__ import annotations

import codecs
import re
from array import array
from collections.abc import Iterable, Mapping
from typing import NamedTuple

import numpy as np

from ..hparams import MAX_VOCAB, Meta, ModelMetadataError, is_integer
from .bpe import PRE_TOKENIZERS, BPEModel, byte_decode
from .special import SpecialPartitioner
from .spm import SPMModel
from .ugm import UGMModel
from .wpm import WPMModel
from .vocab import Vocab

# llama_token_attr bits
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
ATTR_NORMALIZED = 1 << 6
ATTR_LSTRIP = 1 << 7
ATTR_RSTRIP = 1 << 8
ATTR_SINGLE_WORD = 1 << 9

# tokenizer.ggml.token_type values (llama_token_type) → attributes
_TYPE_TO_ATTR = np.array([ATTR_UNDEFINED, ATTR_NORMAL, ATTR_UNKNOWN, ATTR_CONTROL,
                          ATTR_USER_DEFINED, ATTR_UNUSED, ATTR_BYTE], dtype=np.int64)

_SPECIAL_ATTRS = ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN

_KEY = "tokenizer.ggml."
_VOCAB_TYPES = {"llama": "spm", "gpt2": "bpe", "gemma4": "bpe", "bert": "wpm", "t5": "ugm"}
_SPECIAL_NAMES = ("bos", "eos", "eot", "eom", "unk", "sep", "pad", "mask", "fim_pre", "fim_suf",
                  "fim_mid", "fim_pad", "fim_rep", "fim_sep")
# (special token, key under tokenizer.ggml.): later keys override earlier ones, as in llama.cpp
_SPECIAL_KEYS = (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("eot", "eot_token_id"),
                 ("eom", "eom_token_id"), ("unk", "unknown_token_id"),
                 ("sep", "seperator_token_id"), ("pad", "padding_token_id"),
                 ("mask", "mask_token_id"), ("fim_pre", "fim_pre_token_id"),
                 ("fim_suf", "fim_suf_token_id"), ("fim_mid", "fim_mid_token_id"),
                 ("fim_pad", "fim_pad_token_id"), ("fim_rep", "fim_rep_token_id"),
                 ("fim_sep", "fim_sep_token_id"), ("fim_pre", "prefix_token_id"),
                 ("fim_suf", "suffix_token_id"), ("fim_mid", "middle_token_id"))
_SPECIAL_KEY_OF = {name: key for name, key in reversed(_SPECIAL_KEYS)}

# Texts llama.cpp recognises (src/llama-vocab.cpp, llama_vocab::impl::load).
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
              "<end_of_utterance>")
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                "▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                "▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                "▁<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
              "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
              "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
              "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[")

# detokenize's clean_spaces passes, as byte regexes (see _clean_spaces)
_CLEAN_PUNCT = re.compile(rb" (?=[?!.,])")
_CLEAN_QUOTE = re.compile(rb" ' ")
_CLEAN_CONTRACTION = re.compile(rb" (?='(?:[sm]|re|ve))")


def _clean_spaces(text: bytes) -> bytes:
    """llama.cpp's three clean-up passes: drop the space before ? ! . , ; turn " ' " into "'";
    drop the space before 's 'm 're 've."""
    text = _CLEAN_PUNCT.sub(b"", text)
    text = _CLEAN_QUOTE.sub(b"'", text)
    return _CLEAN_CONTRACTION.sub(b"", text)


def _raw_bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _load_vocab(meta: Meta) -> Vocab:
    """tokenizer.ggml.tokens as a Vocab: packed straight from the file when the metadata can
    (no str per token), else from the list; empty texts become "[EMPTY_<id>]" as in llama.cpp.
    A text given twice is an error (llama.cpp would silently map it to its last id)."""
    key = _KEY + "tokens"
    packed = meta.md.packed_strings(key) if key in meta.md and \
        hasattr(meta.md, "packed_strings") else None
    try:
        if packed is not None and 1 <= len(packed[1]) - 1 <= MAX_VOCAB and \
                (np.diff(packed[1]) > 0).all():
            return Vocab(*packed)
        tokens = meta.strings(key, lo=1)
        return Vocab.from_texts(t or f"[EMPTY_{i}]" for i, t in enumerate(tokens))
    except ModelMetadataError:
        raise
    except ValueError as e:  # a duplicate text
        raise ModelMetadataError(f"GGUF metadata {key}: {e}") from None


def _vocab_type(meta: Meta) -> str:
    """The kind of vocabulary tokenizer.ggml.model names: "spm", "bpe", "wpm" or "ugm"."""
    key = _KEY + "model"
    model = meta.str(key)
    if model not in _VOCAB_TYPES:
        raise ModelMetadataError(
            f"unsupported tokenizer model: {model!r} ({key}; llamatui handles 'gpt2' and "
            "'gemma4' BPE, 'llama' SentencePiece, 'bert' WordPiece and 't5' Unigram "
            "vocabularies)")
    return _VOCAB_TYPES[model]


def _token_attrs(meta: Meta, n: int) -> np.ndarray:
    """The llama_token_attr of each token from tokenizer.ggml.token_type (NORMAL without it;
    a type llama.cpp does not know is UNDEFINED, as there)."""
    types = meta.numbers(_KEY + "token_type", None, kind="int", min_len=n)
    if types is None:
        return np.full(n, ATTR_NORMAL, dtype=np.int64)
    types = types[:n]
    bad = (types < 0) | (types >= len(_TYPE_TO_ATTR))
    attrs = _TYPE_TO_ATTR[np.where(bad, 0, types)]
    attrs[bad] = ATTR_UNDEFINED
    return attrs


def _special_ids(meta: Meta, defaults: dict, n: int) -> dict:
    """Special token ids: llama.cpp's defaults for the vocabulary type, then the metadata's; an
    id outside the vocabulary is ignored (llama.cpp warns "bad special token" and keeps the
    default), a value that is not an integer is an error."""
    ids = {name: defaults.get(name) for name in _SPECIAL_NAMES}
    for name in ids:
        if ids[name] is not None and ids[name] >= n:
            ids[name] = None
    for name, key in _SPECIAL_KEYS:
        value = meta.md.get(_KEY + key)
        if value is None:
            continue
        if not is_integer(value):
            raise meta.fail(_KEY + key, value, "a token id (an integer)")
        if 0 <= value < n:
            ids[name] = int(value)
    return ids


def _charsmap(meta: Meta) -> bytes | None:
    """tokenizer.ggml.precompiled_charsmap: an array of bytes (int8 or uint8 in the file)."""
    values = meta.numbers(_KEY + "precompiled_charsmap", None, kind="int", lo=-128, hi=255)
    return None if values is None else (values & 0xFF).astype(np.uint8).tobytes()


class _TypeDefaults(NamedTuple):
    """What llama.cpp assumes for a vocabulary type (and BPE pre-tokenizer) when the metadata
    does not say otherwise."""
    special_ids: dict[str, int]
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    clean_spaces: bool
    pre: str  # the pre-tokenizer in effect
    pre_cfg: object | None  # its configuration (BPE only)


def _type_defaults(vocab_type: str, model: str, pre: str) -> _TypeDefaults:
    """llama.cpp's defaults per vocabulary type (llama_vocab::impl::load); an unknown BPE
    pre-tokenizer is an error."""
    if vocab_type == "spm":
        return _TypeDefaults({"bos": 1, "eos": 2, "unk": 0}, True, False, True, False, pre, None)
    if vocab_type == "wpm":
        return _TypeDefaults({"bos": 101, "unk": 100, "sep": 102, "pad": 0, "mask": 103}, True,
                             False, False, True, pre, None)
    if vocab_type == "ugm":
        return _TypeDefaults({"eos": 1, "unk": 2, "pad": 0}, False, True, False, False, pre, None)
    defaults = {}
    if model == "gemma4":
        pre = "gemma4"  # llama.cpp ignores the key for this model
    else:
        defaults = {"bos": 11, "eos": 11}
    pre_cfg = PRE_TOKENIZERS.get(pre)
    if pre_cfg is None:
        raise ModelMetadataError(
            f"unknown pre-tokenizer type: {pre!r} ({_KEY}pre; known: "
            f"{', '.join(sorted(k for k in PRE_TOKENIZERS if k))})")
    if pre_cfg.no_bos:
        defaults.pop("bos", None)
    return _TypeDefaults(defaults, pre_cfg.add_bos, False, False, pre_cfg.clean_spaces, pre,
                         pre_cfg)


def _spm_byte_ids(vocab: Vocab) -> list[int | None]:
    """The token of each byte value: `<0xAB>`, or else the byte itself as a one-character
    token (bytes above 0x7F as the surrogate escapes the reader gives undecodable bytes)."""
    byte_ids: list[int | None] = []
    for b in range(256):
        tid = vocab.get(f"<0x{b:02X}>")
        if tid is None:
            tid = vocab.get(chr(b) if b < 0x80 else chr(0xDC00 + b))
        byte_ids.append(tid)
    return byte_ids


class Tokenizer:
    """A GGUF vocabulary with llama.cpp's tokenize / detokenize behaviour."""

    def __init__(self, metadata: Mapping):
        """Every tokenizer.ggml.* value is checked for type and range as it is read: a broken
        one raises ModelMetadataError naming the key, the value and what was expected. (The
        keys are read in llama.cpp's order, so the first broken one is the one named.)"""
        meta = Meta(metadata, "")
        self.vocab_type: str = _vocab_type(meta)
        self.model: str = meta.str(_KEY + "model")
        defaults = _type_defaults(self.vocab_type, self.model, meta.str(_KEY + "pre", ""))
        self.pre: str = defaults.pre
        self.add_space_prefix: bool = meta.bool(_KEY + "add_space_prefix",
                                                defaults.add_space_prefix)
        self.clean_spaces: bool = defaults.clean_spaces
        # SentencePiece-style BPE (Gemma 4) escapes spaces as U+2581 like SPM does
        pre_cfg = defaults.pre_cfg
        self.escape_whitespaces: bool = pre_cfg is not None and pre_cfg.escape_whitespaces

        attr_np = self._load_tokens(meta)
        # special token ids: defaults, then metadata (ignored when out of range)
        ids = _special_ids(meta, defaults.special_ids, self.n_vocab)
        self._set_add_bos_eos(meta, ids, defaults)
        self._detect_special(ids)
        self._ids = ids
        self._cache_special_tokens(attr_np)
        self._set_strip_attrs(meta)
        self._partitioners: dict[bool, SpecialPartitioner] = {}  # by parse_special, built on use
        self._pieces: dict[int, bytes] = {}  # filled as tokens are detokenized
        self._build_model(meta, pre_cfg, attr_np)
        self._nl_id: int | None = None

    def _load_tokens(self, meta: Meta) -> np.ndarray:
        """The vocabulary, its scores and its attributes (returned as an array as well)."""
        self._vocab = vocab = _load_vocab(meta)
        n = len(vocab)
        self.n_vocab: int = n
        # llama.cpp reads the first n scores (NaN would make the merging order meaningless)
        scores = meta.numbers(_KEY + "scores", None, min_len=n)
        # array('f'): a Python float per token would take 8 MiB for Gemma 3
        self._scores = array("f", scores[:n].tobytes() if scores is not None else bytes(4 * n))
        attr_np = _token_attrs(meta, n)
        self._attr = array("q", attr_np.astype(np.int64).tobytes())
        self._touched: set[int] = set()  # ids whose attributes the heuristics below changed
        self._control_ids: list[int] = np.nonzero(attr_np & ATTR_CONTROL)[0].tolist()
        return attr_np

    def _set_add_bos_eos(self, meta: Meta, ids: dict, defaults: _TypeDefaults) -> None:
        """add_bos / add_eos from the metadata or the defaults; adding a token the vocabulary
        lacks is an error."""
        add_bos = meta.bool(_KEY + "add_bos_token", defaults.add_bos)
        add_eos = meta.bool(_KEY + "add_eos_token", defaults.add_eos)
        if defaults.pre_cfg is not None and defaults.pre_cfg.force_bos:
            add_bos = True  # llama.cpp's Gemma 4 workaround
        self.add_bos: bool = add_bos
        self.add_eos: bool = add_eos
        for flag, name in ((add_bos, "bos"), (add_eos, "eos")):
            if flag and ids[name] is None:
                raise ModelMetadataError(
                    f"{_KEY}add_{name}_token is true, but the vocabulary has no {name.upper()} "
                    f"token ({_KEY}{name}_token_id is absent or outside its "
                    f"{self.n_vocab} tokens)")

    def _cache_special_tokens(self, attr_np: np.ndarray) -> None:
        """The special tokens (by their attributes after _detect_special), longest text in
        bytes first, as tokenize cuts them out of the text in that order."""
        vocab = self._vocab
        candidates = set(np.nonzero(attr_np & _SPECIAL_ATTRS)[0].tolist()) | self._touched
        special = sorted(i for i in candidates if self._attr[i] & _SPECIAL_ATTRS)
        special.sort(key=lambda i: -len(_raw_bytes(vocab.text(i))))
        self._special_ids: list[int] = special
        self._special_texts: list[str] = [vocab.text(i) for i in special]

    def _build_model(self, meta: Meta, pre_cfg, attr_np: np.ndarray) -> None:
        """The vocabulary type's tokenizer model, with the keys only it reads."""
        vocab, unk = self._vocab, self._ids["unk"]
        self._bpe = self._spm = self._wpm = self._ugm = None
        if self.vocab_type == "bpe":
            self._bpe = BPEModel(vocab, meta.strings(_KEY + "merges"), pre_cfg)
        elif self.vocab_type == "spm":
            self._byte_ids = _spm_byte_ids(vocab)
            self._spm = SPMModel(vocab, self._scores, self._byte_ids, unk)
        elif self.vocab_type == "wpm":
            lowercase = meta.bool(_KEY + "normalizer.lowercase", True)
            self._wpm = WPMModel(vocab, unk, lowercase,
                                 meta.bool(_KEY + "normalizer.strip_accents", lowercase))
        else:
            charsmap = _charsmap(meta)
            merge_spaces = meta.bool(_KEY + "remove_extra_whitespaces", False)
            self._ugm = UGMModel(vocab, self._scores, attr_np, self._attr, unk, charsmap,
                                 self.add_space_prefix, merge_spaces)

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_metadata(cls, metadata: Mapping) -> "Tokenizer":
        return cls(metadata)

    @classmethod
    def from_gguf(cls, path) -> "Tokenizer":
        from ..gguf import GGUFFile
        with GGUFFile.open(path) as f:
            return cls(f.metadata)

    def _detect_special(self, ids: dict) -> None:
        """EOT/EOM/FIM detection by text, 'unused' marking and the end-of-generation set."""
        tok, attr = self._vocab, self._attr

        def found(texts):
            present = [tok.get(t) for t in texts if t in tok]
            return min(present) if present else None

        touched = self._touched

        def promote(tid):
            if not attr[tid] & ATTR_CONTROL:
                attr[tid] |= ATTR_CONTROL
                touched.add(tid)

        # llama.cpp takes the first match in hash-map order; we take the lowest id.
        for name, texts in [("eot", _EOT_TEXTS), ("eom", _EOM_TEXTS)] + list(_FIM_TEXTS.items()):
            if ids[name] is None:
                tid = found(texts)
                if tid is not None:
                    ids[name] = tid
                    promote(tid)

        for tid in set(self._control_ids) | touched:
            a = attr[tid]
            if a & ATTR_CONTROL and not a & ATTR_UNUSED and "unused" in self._vocab.text(tid):
                attr[tid] = a | ATTR_UNUSED

        eog: set[int] = set()
        for name in ("fim_pad", "fim_rep", "fim_sep"):
            if ids[name] is not None:
                eog.add(ids[name])
        for text in _EOG_TEXTS:
            tid = tok.get(text)
            if tid is not None:
                eog.add(tid)
                promote(tid)
        for text in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):  # gpt-oss
            tid = tok.get(text)
            if tid is not None:
                attr[tid] = ATTR_USER_DEFINED
                touched.add(tid)
        for name in ("eos", "eot", "eom"):
            if ids[name] is not None:
                eog.add(ids[name])
        texts = {self._vocab.text(t): t for t in eog}
        # o200k_harmony / solar-open: "<|end|>" is not end-of-generation there
        calls = "<|call|>" in texts or "<|calls|>" in texts
        if "<|end|>" in texts and calls and ("<|return|>" in texts or "<|flush|>" in texts):
            eog.discard(texts["<|end|>"])
            attr[texts["<|end|>"]] = ATTR_USER_DEFINED
            touched.add(texts["<|end|>"])
        if "<|tool_response>" in texts and "</s>" in texts:
            eog.discard(texts["</s>"])
            attr[texts["</s>"]] = ATTR_NORMAL
            touched.add(texts["</s>"])
        self._eog: frozenset[int] = frozenset(eog)

    def _set_strip_attrs(self, meta: Meta) -> None:
        """The per-model LSTRIP/RSTRIP attributes llama.cpp sets by name."""
        name = meta.str("general.name", "").lower()
        pre = self.pre
        arch = meta.str("general.architecture", "")
        tok, attr = self._vocab, self._attr
        if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
                s in arch for s in ("nomic-bert-moe", "jina-bert-v3")):
            if "<mask>" in tok:
                attr[tok.get("<mask>")] |= ATTR_LSTRIP
        elif "phi-3" in name or "phi3" in name:
            for tid in self._special_ids:
                attr[tid] |= ATTR_RSTRIP
            for text, on in (("</s>", True), ("<unk>", False), ("<s>", False),
                             ("<|endoftext|>", False)):
                if text in tok:
                    if on:
                        attr[tok.get(text)] |= ATTR_RSTRIP
                    else:
                        attr[tok.get(text)] &= ~ATTR_RSTRIP
        elif "modern-bert" in name and "[MASK]" in tok:
            attr[tok.get("[MASK]")] |= ATTR_LSTRIP

    # ------------------------------------------------------------------ attributes

    @property
    def bos_id(self) -> int | None:
        return self._ids["bos"]

    @property
    def eos_id(self) -> int | None:
        return self._ids["eos"]

    @property
    def eot_id(self) -> int | None:
        return self._ids["eot"]

    @property
    def unk_id(self) -> int | None:
        return self._ids["unk"]

    @property
    def pad_id(self) -> int | None:
        return self._ids["pad"]

    @property
    def eog_ids(self) -> frozenset[int]:
        return self._eog

    @property
    def nl_id(self) -> int | None:
        """llama.cpp's linefeed token: the `<0x0A>` byte token (SPM) or the first id of "\\n"."""
        if self._nl_id is None:
            if self.vocab_type == "spm":
                self._nl_id = self._byte_ids[10] if self._byte_ids[10] is not None else self.pad_id
            elif self.vocab_type == "wpm":
                self._nl_id = self.pad_id
            else:
                ids = self.encode("\n", add_special=False)
                self._nl_id = ids[0] if ids else self.pad_id
        return self._nl_id

    def special_id(self, name: str) -> int | None:
        """Id of a special token by llama.cpp's name (bos eos eot eom unk sep pad mask fim_*)."""
        return self._ids[name]

    def is_eog(self, token_id: int) -> bool:
        return token_id in self._eog

    def is_control(self, token_id: int) -> bool:
        return bool(self._attr[token_id] & ATTR_CONTROL)

    def token_attr(self, token_id: int) -> int:
        return self._attr[token_id]

    @property
    def vocab(self) -> Vocab:
        """The token texts: vocab[id] → text, vocab.get(text) → id."""
        return self._vocab

    def token_text(self, token_id: int) -> str:
        """The token's text as stored in the vocabulary."""
        return self._vocab.text(token_id)

    def token_score(self, token_id: int) -> float:
        return self._scores[token_id]

    def token_to_id(self, text: str) -> int | None:
        return self._vocab.get(text)

    def __len__(self) -> int:
        return self.n_vocab

    def __repr__(self) -> str:
        return (f"Tokenizer({self.model}/{self.pre or '-'}, n_vocab={self.n_vocab}, "
                f"bos={self.bos_id}, eos={self.eos_id}, add_bos={self.add_bos})")

    # ------------------------------------------------------------------ tokenize

    def _partition(self, text: str, parse_special: bool) -> list:
        """tokenizer_st_partition: ints are special tokens, (start, end) pairs raw text."""
        part = self._partitioners.get(parse_special)
        if part is None:
            part = self._partitioners[parse_special] = self._partitioner(parse_special)
        return part.partition(text)

    def _partitioner(self, parse_special: bool) -> SpecialPartitioner:
        """The special tokens tokenizing looks for, in llama.cpp's order; without
        `parse_special`, CONTROL and UNKNOWN tokens are left in the text."""
        attrs = self._attr
        skip = 0 if parse_special else ATTR_CONTROL | ATTR_UNKNOWN
        keep = [(tid, s) for tid, s in zip(self._special_ids, self._special_texts)
                if not attrs[tid] & skip]
        return SpecialPartitioner([s for _, s in keep], [tid for tid, _ in keep],
                                  [bool(attrs[tid] & ATTR_LSTRIP) for tid, _ in keep],
                                  [bool(attrs[tid] & ATTR_RSTRIP) for tid, _ in keep])

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """llama_tokenize(text, add_special, parse_special)."""
        frags = self._partition(text, parse_special) if text else []
        ids = self._ids
        out: list[int] = []
        if add_special and (self.add_bos or self.vocab_type == "wpm"):
            out.append(self._required("bos"))
        if self.vocab_type == "spm":
            prev_special = True
            spm = self._spm
            for frag in frags:
                if frag.__class__ is int:
                    out.append(frag)
                    prev_special = True
                    continue
                s = text[frag[0]:frag[1]]
                if self.add_space_prefix and prev_special:
                    s = " " + s
                out.extend(spm.encode(s.replace(" ", "\u2581")))
                prev_special = False
        elif self.vocab_type == "bpe":
            bpe = self._bpe
            escape = self.escape_whitespaces
            for frag in frags:
                if frag.__class__ is int:
                    out.append(frag)
                else:
                    s = text[frag[0]:frag[1]]
                    out.extend(bpe.encode(s.replace(" ", "\u2581") if escape else s))
        else:
            model = self._wpm or self._ugm
            for frag in frags:
                if frag.__class__ is int:
                    out.append(frag)
                else:
                    out.extend(model.encode(text[frag[0]:frag[1]]))
        if add_special and self.vocab_type == "wpm":
            out.append(self._required("sep"))  # WordPiece ends with SEP, not EOS
            return out
        if add_special and self.add_eos:
            out.append(ids["eos"])
        return out

    def _required(self, name: str) -> int:
        tid = self._ids[name]
        if tid is None:
            raise ModelMetadataError(f"{self.model} vocabulary has no {name.upper()} token to "
                                     f"add (tokenizer.ggml.{_SPECIAL_KEY_OF[name]})")
        return tid

    def __call__(self, text: str, add_special: bool = True,
                 parse_special: bool = False) -> list[int]:
        return self.encode(text, add_special, parse_special)

    # ------------------------------------------------------------------ detokenize

    def _piece(self, token_id: int) -> bytes:
        """The piece llama.cpp caches for a token (token_to_piece with special=true)."""
        piece = self._pieces.get(token_id)
        if piece is None:
            attr, text = self._attr[token_id], self._vocab.text(token_id)
            if attr & _SPECIAL_ATTRS:
                piece = _raw_bytes(text)
            elif attr & ATTR_NORMAL:
                if self.vocab_type != "bpe" or self.escape_whitespaces:
                    piece = _raw_bytes(text.replace("\u2581", " "))
                else:
                    piece = byte_decode(text)
            elif attr & ATTR_BYTE:
                piece = bytes([_hex_byte(text)])
            else:
                piece = b""
            self._pieces[token_id] = piece
        return piece

    def token_to_piece(self, token_id: int, special: bool = True, lstrip: int = 0) -> bytes:
        """llama_token_to_piece: the token's bytes; CONTROL/UNKNOWN tokens give nothing unless
        `special`; up to `lstrip` leading spaces are dropped."""
        if not 0 <= token_id < self.n_vocab:
            raise IndexError(f"token id {token_id} out of range (n_vocab={self.n_vocab})")
        if not special and self._attr[token_id] & (ATTR_UNKNOWN | ATTR_CONTROL):
            return b""
        piece = self._piece(token_id)
        if lstrip:
            i = 0
            while i < lstrip and i < len(piece) and piece[i] == 0x20:
                i += 1
            piece = piece[i:]
        return piece

    def detokenize(self, ids: Iterable[int], remove_special: bool = False,
                   unparse_special: bool = True) -> bytes:
        """llama_detokenize: the text's bytes (they may end inside a UTF-8 character)."""
        ids = list(ids)
        remove_space = self.add_space_prefix
        if remove_special and self.add_bos and ids and ids[0] == self.bos_id:
            remove_space = False
            ids = ids[1:]
        if remove_special and self.add_eos and ids and ids[-1] == self.eos_id:
            ids = ids[:-1]
        parts = []
        for tid in ids:
            parts.append(self.token_to_piece(tid, unparse_special, 1 if remove_space else 0))
            remove_space = False
        text = b"".join(parts)
        if self.clean_spaces:
            text = _clean_spaces(text)
        return text

    def decode(self, ids: Iterable[int], remove_special: bool = False,
               unparse_special: bool = True, errors: str = "replace") -> str:
        """Detokenize to str. The defaults match the golden `detokenized` of llama.cpp: special
        tokens are printed as their text and nothing is removed."""
        return self.detokenize(ids, remove_special, unparse_special).decode("utf-8", errors)

    def stream_decoder(self, remove_special: bool = False, unparse_special: bool = True,
                       verbatim: bool = False, preserved: frozenset[int] = frozenset()
                       ) -> "StreamDecoder":
        return StreamDecoder(self, remove_special, unparse_special, verbatim, preserved)


def _hex_byte(text: str) -> int:
    """token_to_byte: the value of "<0xXX>" (strtol of text[3:5], 0 when not hex)."""
    digits = text[3:5]
    value = 0
    for ch in digits:
        d = "0123456789abcdef".find(ch.lower())
        if d < 0:
            break
        value = value * 16 + d
    return value


class StreamDecoder:
    """Detokenizes one token at a time: `feed(id)` returns the text that is now final, `flush()`
    the rest. The pieces joined equal `Tokenizer.decode` of all the ids with the same flags; a
    multi-byte UTF-8 character is never split, and text that clean-up could still change (a
    trailing space before a possible "," say) is held back until the next token decides it.

    verbatim: the pieces exactly as llama_token_to_piece gives them (llama-server streams them
    so), without detokenize's clean-up or its leading-space strip: the bytes a grammar checked.
    preserved: token ids shown even when special tokens are not (llama-server's
    accept_special_token: a chat format's preserved_tokens, such as Gemma 4's `<|turn>`).
    """

    def __init__(self, tokenizer: Tokenizer, remove_special: bool = False,
                 unparse_special: bool = True, verbatim: bool = False,
                 preserved: frozenset[int] = frozenset()):
        self.tokenizer = tokenizer
        self.remove_special = remove_special
        self.unparse_special = unparse_special
        self.preserved = frozenset(preserved)
        self._clean_spaces = tokenizer.clean_spaces and not verbatim
        self._space_prefix = tokenizer.add_space_prefix and not verbatim
        self._first = True
        self._remove_space = self._space_prefix
        self._held_eos = False
        self._pending = b""  # bytes the clean-up passes may still change
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, token_id: int) -> str:
        tok = self.tokenizer
        if self._first:
            self._first = False
            if self.remove_special and tok.add_bos and token_id == tok.bos_id:
                self._remove_space = False
                return ""
        out = ""
        if self._held_eos:
            self._held_eos = False
            out = self._emit(tok.eos_id)
        if self.remove_special and tok.add_eos and token_id == tok.eos_id:
            self._held_eos = True  # dropped if it turns out to be the last token
            return out
        return out + self._emit(token_id)

    def flush(self) -> str:
        """The held-back text; the decoder starts afresh afterwards."""
        self._held_eos = False
        out = self._commit(len(self._pending)) if self._pending else ""
        out += self._utf8.decode(b"", final=True)
        self._first = True
        self._remove_space = self._space_prefix
        return out

    def _emit(self, token_id: int) -> str:
        piece = self.tokenizer.token_to_piece(
            token_id, self.unparse_special or token_id in self.preserved,
            1 if self._remove_space else 0)
        self._remove_space = False
        if not self._clean_spaces:
            return self._utf8.decode(piece)
        self._pending += piece
        return self._commit(self._safe_cut(self._pending))

    @staticmethod
    def _safe_cut(p: bytes) -> int:
        """Longest prefix whose cleaned text no later byte can change: it must end in a byte
        that is neither a space nor an apostrophe, and not in " 'r" / " 'v" (" 're", " 've")."""
        c = len(p)
        while c > 0:
            ch = p[c - 1]
            if ch != 0x20 and ch != 0x27 and not (
                    ch in (0x72, 0x76) and c >= 3 and p[c - 2] == 0x27 and p[c - 3] == 0x20):
                return c
            c -= 1
        return 0

    def _commit(self, cut: int) -> str:
        if cut == 0:
            return ""
        head, self._pending = self._pending[:cut], self._pending[cut:]
        # A leading non-space byte stands for the text already committed (or the start).
        return self._utf8.decode(_clean_spaces(b"X" + head)[1:])
