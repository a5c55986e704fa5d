"""Structure-aware fuzzing of GGUF metadata: tiny models whose metadata values (and a few tensors)
are replaced by values of the wrong type, zero, negative, huge, NaN, infinite, empty, nested or of
the wrong length, or removed, or joined by unexpected keys; each case runs in a worker process
through every reader of metadata a user can reach:

    GGUFFile.open + every value and tensor read      (the file layer)
    models.recommend.estimate_file                    (the recommender, `llamatui ls`/`hw`)
    app.cmd_inspect.run --json                        (`llamatui inspect --json`)
    Engine.load at n_ctx 64 + warm-up decode + generate("ab", max_tokens=1) + (de)tokenize

and its outcome is classified: success, a clear error (one of the project's own ValueError
subclasses, in plain words), or a failure: any other exception, MemoryError, a message in numpy's
or Python's internal wording ("cannot reshape ...", "index ... out of bounds"), a crash, or a
hang (no answer within the per-case timeout).

    cases = make_cases(seed=2024, n=3200)
    results = run_cases(cases, tmp_dir, n_workers=2)

The models are tiny (2 layers, 64 wide, 128 tokens: a case loads in milliseconds): llama with a
GPT-2 BPE vocabulary and with a SentencePiece one, gemma3 (sliding window) with a Unigram (T5)
and with a WordPiece (BERT) one, so every tokenizer's metadata is read. Workers run with
LLAMATUI_AVAILABLE_MEMORY set and an address-space limit, so what the engine should refuse up
front (a cache larger than the machine) cannot succeed by luck nor take the machine down.
"""
from __future__ import annotations

import json
import math
import os
import pathlib
import random
import re
import selectors
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from llamatui.inference import LoadConfig
from llamatui.inference.gguf import GGUFValueType as VT
from llamatui.inference.gguf import GGUFWriter, ValueType, infer_value_type

N_LAYER, N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF, N_VOCAB = 2, 64, 4, 2, 16, 128, 128
CASE_TIMEOUT_S = 20.0
STARTUP_TIMEOUT_S = 1200.0  # a worker's first start may compile the kernels (cold numba cache)
WORKER_AVAILABLE_MEMORY = 1 << 30  # what the workers tell the engine the machine has
WORKER_ADDRESS_SPACE = 4 << 30  # and the most they may map (a worker peaks near 0.5 GiB)

SCALAR_INT_TYPES = (VT.UINT8, VT.INT8, VT.UINT16, VT.INT16, VT.UINT32, VT.INT32, VT.UINT64,
                    VT.INT64)
_INT_RANGES = {VT.UINT8: (0, 255), VT.INT8: (-128, 127), VT.UINT16: (0, 65535),
               VT.INT16: (-32768, 32767), VT.UINT32: (0, 2**32 - 1),
               VT.INT32: (-2**31, 2**31 - 1), VT.UINT64: (0, 2**64 - 1),
               VT.INT64: (-2**63, 2**63 - 1)}
_NP_DTYPES = {VT.UINT8: np.uint8, VT.INT8: np.int8, VT.UINT16: np.uint16, VT.INT16: np.int16,
              VT.UINT32: np.uint32, VT.INT32: np.int32, VT.UINT64: np.uint64, VT.INT64: np.int64,
              VT.FLOAT32: np.float32, VT.FLOAT64: np.float64, VT.BOOL: np.bool_}

# the value classes every key is mutated with (the list); "coverage" counts them
VALUE_CLASSES = ("str", "bool", "float", "int", "array_str", "array_int", "array_float",
                 "nested", "zero", "negative", "huge", "nan", "inf", "empty_array",
                 "wrong_length", "retyped", "elements", "missing", "extra_key", "tensor")


def _t(vtype, element=None) -> ValueType:
    return ValueType(vtype, ValueType(element) if isinstance(element, VT) else element)


STR_ARRAY = _t(VT.ARRAY, VT.STRING)

# ----------------------------------------------------------------------------- the tiny models


def _matrix(rng, n_out, n_in):
    return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)


def _norm(rng, n):
    return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)


def _tensors(rng, gemma: bool) -> list[tuple[str, str, np.ndarray]]:
    """(name, type, float32 data): matrices F16, vectors F32."""
    t = [("token_embd.weight", "F16", rng.standard_normal((N_VOCAB, N_EMBD)).astype(np.float32))]
    q, kv = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    for il in range(N_LAYER):
        p = f"blk.{il}."
        t += [(p + "attn_norm.weight", "F32", _norm(rng, N_EMBD)),
              (p + "attn_q.weight", "F16", _matrix(rng, q, N_EMBD)),
              (p + "attn_k.weight", "F16", _matrix(rng, kv, N_EMBD)),
              (p + "attn_v.weight", "F16", _matrix(rng, kv, N_EMBD)),
              (p + "attn_output.weight", "F16", _matrix(rng, N_EMBD, q)),
              (p + "ffn_norm.weight", "F32", _norm(rng, N_EMBD)),
              (p + "ffn_gate.weight", "F16", _matrix(rng, N_FF, N_EMBD)),
              (p + "ffn_up.weight", "F16", _matrix(rng, N_FF, N_EMBD)),
              (p + "ffn_down.weight", "F16", _matrix(rng, N_EMBD, N_FF))]
        if gemma:
            t += [(p + "attn_q_norm.weight", "F32", _norm(rng, HEAD_DIM)),
                  (p + "attn_k_norm.weight", "F32", _norm(rng, HEAD_DIM)),
                  (p + "post_attention_norm.weight", "F32", _norm(rng, N_EMBD)),
                  (p + "post_ffw_norm.weight", "F32", _norm(rng, N_EMBD))]
    t.append(("output_norm.weight", "F32", _norm(rng, N_EMBD)))
    if not gemma:
        t.append(("output.weight", "F16", _matrix(rng, N_VOCAB, N_EMBD)))
    return t


def _arch_metadata(arch: str, gemma: bool) -> list:
    u32, f32 = _t(VT.UINT32), _t(VT.FLOAT32)
    md = [("context_length", 256, u32), ("embedding_length", N_EMBD, u32),
          ("block_count", N_LAYER, u32), ("feed_forward_length", N_FF, u32),
          ("attention.head_count", N_HEAD, u32), ("attention.head_count_kv", N_HEAD_KV, u32),
          ("rope.freq_base", 10000.0, f32), ("attention.layer_norm_rms_epsilon", 1e-6, f32),
          ("rope.dimension_count", HEAD_DIM, u32)]
    if gemma:
        md += [("attention.key_length", HEAD_DIM, u32), ("attention.value_length", HEAD_DIM, u32),
               ("attention.sliding_window", 8, u32), ("attention.sliding_window_pattern", 2, u32)]
    return [(f"{arch}.{k}", v, t) for k, v, t in md]


def _ids(**ids) -> list:
    return [(f"tokenizer.ggml.{k}_token_id", v, _t(VT.UINT32)) for k, v in ids.items()]


def _gpt2_vocab() -> list:
    specials = ["<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    chars = [chr(c) for c in range(0x21, 0x7F)] + ["\u0120", "\u010a"]  # Ġ (space), Ċ (newline)
    merges = ["a b", "ab c", "\u0120 a", "\u0120a b", "t h", "th e", "\u0120 th", "\u0120th e",
              "e r", "i n", "o n", "a n", "r e", "e s", "o r", "i s", "a t", "e d", "e n", "t o",
              "\u0120 t", "\u0120 s", "i t", "a l", "a r", "s t", "n d", "o u"]
    tokens = specials + chars + [m.replace(" ", "") for m in merges]
    assert len(tokens) == N_VOCAB and len(set(tokens)) == N_VOCAB
    types = [3] * len(specials) + [1] * (N_VOCAB - len(specials))
    return [("tokenizer.ggml.model", "gpt2", None), ("tokenizer.ggml.pre", "default", None),
            ("tokenizer.ggml.tokens", tokens, STR_ARRAY),
            ("tokenizer.ggml.token_type", np.array(types, np.int32), None),
            ("tokenizer.ggml.merges", merges, STR_ARRAY),
            *_ids(bos=0, eos=1, padding=1),
            ("tokenizer.ggml.add_bos_token", False, None),
            ("tokenizer.chat_template", "{% for m in messages %}<|im_start|>{{ m.role }}\n"
             "{{ m.content }}<|im_end|>\n{% endfor %}", None)]


def _spm_vocab() -> list:
    words = ["\u2581", "a", "b", "c", "d", "e", "\u2581a", "ab", "\u2581ab", "\u2581the", "th",
             "he", "\u2581t", "<0x0A>", "<0x20>", "<0x61>"]
    tokens = ["<unk>", "<s>", "</s>"] + words
    tokens += [f"w{i}" for i in range(N_VOCAB - len(tokens))]
    types = [2, 3, 3] + [6 if w.startswith("<0x") else 1 for w in tokens[3:]]
    scores = np.array([0.0, 0.0, 0.0] + [-float(i) for i in range(N_VOCAB - 3)], np.float32)
    return [("tokenizer.ggml.model", "llama", None), ("tokenizer.ggml.tokens", tokens, STR_ARRAY),
            ("tokenizer.ggml.scores", scores, None),
            ("tokenizer.ggml.token_type", np.array(types, np.int32), None),
            *_ids(bos=1, eos=2, unknown=0),
            ("tokenizer.ggml.add_bos_token", True, None),
            ("tokenizer.ggml.add_eos_token", False, None),
            ("tokenizer.ggml.add_space_prefix", True, None)]


def _charsmap() -> np.ndarray:
    """A tiny SentencePiece precompiled_charsmap (llama.cpp's xcda_array_view layout: a u32
    size, u32 nodes of (base << 10 | leaf << 8 | label), NUL-terminated replacements): "x" → "ks",
    "A" → "a", "AB" → "b"."""
    nodes = [0] * 256  # node 0: base 0, so a first byte c is looked up at node c

    def node(base, leaf, label):
        return base << 10 | leaf << 8 | label
    nodes[ord("x")] = node(1, 1, ord("x"))  # "x": leaf; its value at x ^ 1
    nodes[ord("x") ^ 1] = 0  # offset of "ks"
    nodes[ord("A")] = node(2, 1, ord("A"))  # "A": leaf, value at A ^ 2; children from A ^ 2
    nodes[ord("A") ^ 2] = 3  # offset of "a"
    nodes[ord("A") ^ 2 ^ ord("B")] = node(4, 1, ord("B"))  # "AB"
    nodes[ord("A") ^ 2 ^ ord("B") ^ 4] = 5  # offset of "b"
    table = np.array(nodes, "<u4").tobytes()
    blob = len(table).to_bytes(4, "little") + table + b"ks\0a\0b\0"
    return np.frombuffer(blob, np.uint8).copy()


def _ugm_vocab() -> list:
    tokens = ["<pad>", "</s>", "<unk>", "\u2581", "a", "b", "\u2581a", "ab", "\u2581ab", "c"]
    tokens += [f"u{i}" for i in range(N_VOCAB - len(tokens))]
    types = [3, 3, 2] + [1] * (N_VOCAB - 3)
    scores = np.array([0.0, 0.0, 0.0] + [-1.0 - 0.1 * i for i in range(N_VOCAB - 3)], np.float32)
    return [("tokenizer.ggml.model", "t5", None), ("tokenizer.ggml.pre", "default", None),
            ("tokenizer.ggml.tokens", tokens, STR_ARRAY),
            ("tokenizer.ggml.scores", scores, None),
            ("tokenizer.ggml.token_type", np.array(types, np.int32), None),
            *_ids(eos=1, unknown=2, padding=0),
            ("tokenizer.ggml.add_space_prefix", True, None),
            ("tokenizer.ggml.remove_extra_whitespaces", True, None),
            ("tokenizer.ggml.precompiled_charsmap", _charsmap(), None),
            ("tokenizer.ggml.add_eos_token", True, None)]


def _wpm_vocab() -> list:
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "\u2581a", "\u2581b", "\u2581ab", "b",
              "\u2581the"]
    tokens += [f"##p{i}" for i in range(N_VOCAB - len(tokens))]
    types = [3, 2, 3, 3, 3] + [1] * (N_VOCAB - 5)
    return [("tokenizer.ggml.model", "bert", None), ("tokenizer.ggml.tokens", tokens, STR_ARRAY),
            ("tokenizer.ggml.token_type", np.array(types, np.int32), None),
            *_ids(bos=2, seperator=3, unknown=1, padding=0, mask=4),
            ("tokenizer.ggml.normalizer.lowercase", True, None)]


def base_model(name: str) -> tuple[list, list]:
    """(metadata [(key, value, ValueType or None)], tensors [(name, type, float32 data)])."""
    arch, vocab = {"llama-bpe": ("llama", _gpt2_vocab), "llama-spm": ("llama", _spm_vocab),
                   "gemma3-ugm": ("gemma3", _ugm_vocab),
                   "gemma3-wpm": ("gemma3", _wpm_vocab)}[name]
    gemma = arch == "gemma3"
    md = [("general.architecture", arch, None), ("general.name", f"fuzz {name}", None),
          ("general.file_type", 1, _t(VT.UINT32)), ("general.alignment", 32, _t(VT.UINT32)),
          *_arch_metadata(arch, gemma), *vocab()]
    return md, _tensors(np.random.default_rng(7), gemma)


BASES = ("llama-bpe", "llama-spm", "gemma3-ugm", "gemma3-wpm")

# Keys the engine, tokenizer, chat template and recommender read that the bases leave out: the
# fuzz adds them too ("{arch}." is the model's architecture).
OPTIONAL_KEYS = (
    "{arch}.attention.key_length", "{arch}.attention.value_length",
    "{arch}.rope.scaling.type", "{arch}.rope.scaling.factor", "{arch}.rope.scale_linear",
    "{arch}.rope.scaling.original_context_length", "{arch}.final_logit_softcapping",
    "{arch}.attn_logit_softcapping", "{arch}.expert_count", "{arch}.expert_used_count",
    "{arch}.expert_feed_forward_length", "{arch}.expert_shared_feed_forward_length",
    "{arch}.attention.causal", "{arch}.attention.layer_norm_epsilon",
    "{arch}.attention.sliding_window", "{arch}.attention.sliding_window_pattern",
    "{arch}.rope.freq_base_swa",
    "tokenizer.ggml.pre", "tokenizer.ggml.scores", "tokenizer.ggml.merges",
    "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
    "tokenizer.ggml.add_space_prefix", "tokenizer.ggml.remove_extra_whitespaces",
    "tokenizer.ggml.normalizer.lowercase", "tokenizer.ggml.normalizer.strip_accents",
    "tokenizer.ggml.precompiled_charsmap", "tokenizer.chat_template",
    "tokenizer.chat_template.tool_use",
    *(f"tokenizer.ggml.{k}_token_id" for k in (
        "bos", "eos", "eot", "eom", "unknown", "seperator", "padding", "mask", "fim_pre",
        "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep", "prefix", "suffix", "middle")),
    "split.count", "split.no", "split.tensors.count",
)

# ----------------------------------------------------------------------------- mutations


@dataclass
class Case:
    """One mutated model: `edits` change the base's metadata ("set" key value vtype / "del"
    key), `tensor_edits` its tensors; `classes` the value classes used, `label` the summary."""
    index: int
    base: str
    edits: list = field(default_factory=list)
    tensor_edits: list = field(default_factory=list)
    classes: list = field(default_factory=list)
    label: str = ""


def _int_value(rng, v: int, types=SCALAR_INT_TYPES):
    """`v` as one of the integer types that can hold it (INT64 or UINT64 when none)."""
    fits = [t for t in types if _INT_RANGES[t][0] <= v <= _INT_RANGES[t][1]]
    return v, _t(rng.choice(fits or [VT.INT64 if v < 0 else VT.UINT64]))


def _num_array(rng, values, kind: str):
    if kind == "float":
        vt = rng.choice([VT.FLOAT32, VT.FLOAT64])
    elif kind == "bool":
        vt = VT.BOOL
    else:
        lo, hi = (min(values, default=0), max(values, default=0))
        vt = rng.choice([t for t in SCALAR_INT_TYPES if _INT_RANGES[t][0] <= lo
                         and hi <= _INT_RANGES[t][1]] or [VT.INT64])
    return np.array(values, dtype=_NP_DTYPES[vt]), _t(VT.ARRAY, vt)


def _nested(rng):
    if rng.random() < 0.5:
        inner = [np.array(rng.sample(range(-3, 40), rng.randint(0, 3)), np.int32)
                 for _ in range(rng.randint(1, 3))]
        return inner, _t(VT.ARRAY, _t(VT.ARRAY, VT.INT32))
    inner = [["a", "b"][:rng.randint(0, 2)] for _ in range(rng.randint(1, 3))]
    return inner, _t(VT.ARRAY, _t(VT.ARRAY, VT.STRING))


def _retyped(rng, value, vtype):
    """The same value under another GGUF type: ints as other widths, floats, bools; arrays
    with their elements retyped."""
    if vtype.type == VT.ARRAY and vtype.element.type in _NP_DTYPES:
        arr = np.asarray(value)
        target = rng.choice(list(_NP_DTYPES))
        with np.errstate(all="ignore"):
            return arr.astype(_NP_DTYPES[target]), _t(VT.ARRAY, target)
    if vtype.type == VT.ARRAY and vtype.element.type == VT.STRING:
        return _num_array(rng, [len(s) for s in value], "int")
    if isinstance(value, bool):
        return int(value), _t(rng.choice(SCALAR_INT_TYPES))
    if isinstance(value, int):
        choice = rng.random()
        if choice < 0.5:
            return _int_value(rng, value)
        if choice < 0.8:
            return float(value), _t(rng.choice([VT.FLOAT32, VT.FLOAT64]))
        return bool(value), _t(VT.BOOL)
    if isinstance(value, float):
        if rng.random() < 0.5:
            return value, _t(VT.FLOAT64 if vtype.type == VT.FLOAT32 else VT.FLOAT32)
        return _int_value(rng, int(value)) if value.is_integer() else (round(value), _t(VT.INT32))
    return value, vtype  # a string stays a string


def _wrong_length(rng, value, vtype):
    if vtype.type == VT.ARRAY:
        items = list(value)
        n = len(items)
        choice = rng.randrange(4)
        if choice == 0 and n:
            items = items[:-1]
        elif choice == 1:
            items = items[:n // 2]
        elif choice == 2 and n:
            items = items + items[:rng.randint(1, 5)]
        else:
            items = items[:1]
        if vtype.element.type == VT.STRING:
            return items, vtype
        return np.array(items, dtype=np.asarray(value).dtype), vtype
    # a scalar given per layer, with the wrong number of layers (or the right one)
    n = rng.choice([0, 1, N_LAYER - 1, N_LAYER, N_LAYER + 1, 7])
    if isinstance(value, str):
        return [value] * n, STR_ARRAY
    kind = "float" if isinstance(value, float) else "bool" if isinstance(value, bool) else "int"
    return _num_array(rng, [value] * n, kind)


def _elements(rng, key: str, value, vtype):
    """Arrays with bad elements: duplicate, empty or invalid-UTF-8 tokens, malformed merges,
    out-of-range token types, non-finite scores; for scalars an array of odd values."""
    if vtype.type != VT.ARRAY:
        return _num_array(rng, [rng.choice([0, 1, -1, 2**31 - 1, 7])
                                for _ in range(rng.randint(1, 4))], "int")
    items = list(value)
    if not items:
        return value, vtype
    i = rng.randrange(len(items))
    if vtype.element.type == VT.STRING:
        bad = rng.choice(["", items[(i + 1) % len(items)], "\udcff\udcfe", "a b c", " ",
                          "x" * 5000, "<0xZZ>", "<0x", "\u2581" * 3, "[UNK_BYTE_0x]"])
        items[i] = bad
        return items, vtype
    arr = np.array(value).copy()
    if arr.dtype == np.uint8 and len(arr) > 16:  # a byte blob (the charsmap): a few bytes hit
        for j in rng.sample(range(len(arr)), rng.randint(1, 8)):
            arr[j] = rng.randrange(256)
        return arr, vtype
    if arr.dtype.kind == "f":
        arr[i] = rng.choice([np.nan, np.inf, -np.inf, 3e38, -3e38])
    elif arr.dtype.kind in "iu":
        lo, hi = _INT_RANGES[vtype.element.type]
        arr[i] = rng.choice([v for v in (-1, 7, 100, 2**31 - 1, lo, hi) if lo <= v <= hi])
    else:
        arr[i] = not arr[i]
    return arr, vtype


def _value(rng, cls: str, key: str, value, vtype):
    """A replacement value of class `cls` for `key` (whose base value is value/vtype, or None
    when the base lacks it): (value, vtype)."""
    if cls == "str":
        return rng.choice(["", "abc", "1", "nan", "llama", "none", "yarn", "\udcff",
                           "x" * 10000]), _t(VT.STRING)
    if cls == "bool":
        return rng.random() < 0.5, _t(VT.BOOL)
    if cls == "float":
        return rng.choice([0.5, 1.5, 3.0, 1e-7, 64.0]), _t(rng.choice([VT.FLOAT32, VT.FLOAT64]))
    if cls == "int":
        return _int_value(rng, rng.choice([1, 2, 3, 7, 8, 16, 17, 63, 127, 128, 129]))
    if cls == "array_str":
        n = rng.choice([1, 2, N_LAYER, N_VOCAB])
        return [rng.choice(["a", "b", "a b", ""]) + str(i) for i in range(n)], STR_ARRAY
    if cls == "array_int":
        n = rng.choice([1, N_LAYER, N_LAYER + 1, N_VOCAB])
        return _num_array(rng, [rng.choice([0, 1, 2, 3, 8, 16, 1000]) for _ in range(n)], "int")
    if cls == "array_float":
        n = rng.choice([1, N_LAYER, N_VOCAB])
        return _num_array(rng, [rng.choice([0.0, 0.5, -1.0, 1e6]) for _ in range(n)], "float")
    if cls == "nested":
        return _nested(rng)
    if cls == "zero":
        return (0.0, _t(rng.choice([VT.FLOAT32, VT.FLOAT64]))) if rng.random() < 0.25 else \
            _int_value(rng, 0)
    if cls == "negative":
        if rng.random() < 0.3:
            return rng.choice([-1.0, -1e-6, -1e30]), _t(rng.choice([VT.FLOAT32, VT.FLOAT64]))
        return _int_value(rng, rng.choice([-1, -7, -2**31, -2**63]),
                          (VT.INT8, VT.INT16, VT.INT32, VT.INT64))
    if cls == "huge":
        if rng.random() < 0.25:
            if rng.random() < 0.5:
                return rng.choice([1e30, 3.0e38]), _t(VT.FLOAT32)
            return rng.choice([1e30, 1e300]), _t(VT.FLOAT64)
        return _int_value(rng, rng.choice([2**20, 2**31, 2**32, 2**63 - 1, 2**64 - 1]))
    if cls == "nan":
        return math.nan, _t(rng.choice([VT.FLOAT32, VT.FLOAT64]))
    if cls == "inf":
        return rng.choice([math.inf, -math.inf]), _t(rng.choice([VT.FLOAT32, VT.FLOAT64]))
    if cls == "empty_array":
        element = rng.choice([VT.STRING, VT.INT32, VT.FLOAT32, VT.UINT8, VT.BOOL])
        return ([] if element == VT.STRING else np.zeros(0, _NP_DTYPES[element])), \
            _t(VT.ARRAY, element)
    if value is None:  # the classes below change the base's own value
        return _value(rng, rng.choice(["int", "huge", "nan", "array_int", "str"]), key, None,
                      None)
    if cls == "wrong_length":
        return _wrong_length(rng, value, vtype)
    if cls == "retyped":
        return _retyped(rng, value, vtype)
    if cls == "elements":
        return _elements(rng, key, value, vtype)
    raise ValueError(cls)


def _extra_key(rng, arch: str) -> str:
    return rng.choice([f"{arch}.unknown_key", f"{arch}.attention.head_count_extra",
                       "tokenizer.ggml.unknown", f"general.extra{rng.randrange(9)}",
                       f"{arch}.rope.scaling.unknown", "", " ", "\udcff key",
                       f"blk.{rng.randrange(9)}.weird", "tokenizer.ggml.tokens.extra"])


def _tensor_edit(rng, names: list[str]) -> tuple:
    kind = rng.choice(["drop", "drop", "shape", "transpose", "extra", "rename", "type",
                       "fill", "fill"])
    name = rng.choice(names)
    if kind == "drop":
        return ("drop", name)
    if kind == "shape":
        return ("shape", name, rng.choice([-16, -1, 1, 16]))
    if kind == "transpose":
        return ("transpose", name)
    if kind == "extra":
        return ("extra", rng.choice(["blk.7.attn_q.weight", "rope_freqs.weight", "foo",
                                     "blk.0.attn_q.bias", "output.weight"]))
    if kind == "rename":
        return ("rename", name)
    if kind == "fill":  # non-finite weights: one value, or all of them
        return ("fill", name, rng.choice(["nan", "inf", "-inf"]), rng.random() < 0.5)
    return ("type", name, rng.choice(WEIGHT_TYPES + ("I32",)))


# the weight types type edits give tensors (besides I32, which no kernel computes): the workers
# warm up on a model holding each, so that no case waits for a kernel to compile
WEIGHT_TYPES = ("F32", "F16", "BF16", "Q8_0")
WARMUP_TYPES = Case(-1, "llama-bpe", tensor_edits=[
    ("type", "blk.0.attn_q.weight", "Q8_0"), ("type", "blk.0.attn_k.weight", "BF16"),
    ("type", "blk.0.attn_v.weight", "F32"), ("type", "blk.0.attn_norm.weight", "BF16"),
    ("type", "blk.0.ffn_norm.weight", "F16"), ("type", "token_embd.weight", "Q8_0"),
    ("type", "output.weight", "BF16"), ("type", "blk.1.ffn_up.weight", "F32")])


def make_cases(seed: int, n: int) -> list[Case]:
    """n seeded cases spread over the bases; most change one value, a fifth two or three."""
    rng = random.Random(seed)
    bases = {b: base_model(b) for b in BASES}
    cases = []
    classes_by_weight = [c for c in VALUE_CLASSES if c != "tensor"]
    for index in range(n):
        base = BASES[index % len(BASES)]
        md, tensors = bases[base]
        arch = md[0][1]
        present = {k: (v, t if t is not None else infer_value_type(v)) for k, v, t in md}
        keys = list(present) + [k.format(arch=arch) for k in OPTIONAL_KEYS]
        case = Case(index, base)
        for _ in range(1 if rng.random() < 0.8 else rng.randint(2, 3)):
            cls = "tensor" if rng.random() < 0.04 else rng.choice(classes_by_weight)
            if cls == "tensor":
                case.tensor_edits.append(_tensor_edit(rng, [t[0] for t in tensors]))
                case.classes.append(cls)
                continue
            if cls == "missing":
                key = rng.choice(list(present))
                case.edits.append(("del", key))
            elif cls == "extra_key":
                key = _extra_key(rng, arch)
                value, vtype = _value(rng, rng.choice(["int", "str", "array_int", "nested"]),
                                      key, None, None)
                case.edits.append(("set", key, value, vtype))
            else:
                key = rng.choice(keys)
                value, vtype = present.get(key, (None, None))
                value, vtype = _value(rng, cls, key, value, vtype)
                case.edits.append(("set", key, value, vtype))
            case.classes.append(cls)
        case.label = f"#{index} {base}: " + "; ".join(_describe(e) for e in
                                                        case.edits + case.tensor_edits)
        cases.append(case)
    return cases


def _describe(edit) -> str:
    if edit[0] == "set":
        _, key, value, vtype = edit
        kind = vtype.type.name + (f"[{vtype.element.type.name}]" if vtype.element else "")
        shown = repr(value.tolist() if isinstance(value, np.ndarray) else value)
        return f"{key} = {shown[:60]} ({kind})"
    if edit[0] == "del":
        return f"del {edit[1]}"
    return "tensor " + " ".join(map(str, edit))


def write_case(case: Case, path) -> None:
    """The base model with the case's edits, as a GGUF file at `path` (no checks: the writer's
    metadata is set directly, so even general.alignment can lie)."""
    md, tensors = base_model_cached(case.base)
    w = GGUFWriter(path)
    meta = {k: (t if t is not None else infer_value_type(v), v) for k, v, t in md}
    for edit in case.edits:
        if edit[0] == "del":
            meta.pop(edit[1], None)
        else:
            meta[edit[1]] = (edit[3], edit[2])
    w.metadata = meta
    tensors = {name: (ttype, data) for name, ttype, data in tensors}
    for edit in case.tensor_edits:
        kind, name = edit[0], edit[1]
        if kind == "drop":
            tensors.pop(name, None)
        elif kind == "shape" and name in tensors:
            ttype, data = tensors[name]
            rows = max(1, data.shape[0] + edit[2])
            tensors[name] = (ttype, np.resize(data, (rows, *data.shape[1:])))
        elif kind == "transpose" and name in tensors:
            ttype, data = tensors[name]
            tensors[name] = (ttype, np.ascontiguousarray(data.T))
        elif kind == "extra":
            tensors.setdefault(name, ("F32", np.ones(N_EMBD, np.float32)))
        elif kind == "rename" and name in tensors:
            tensors[name.replace("weight", "wieght")] = tensors.pop(name)
        elif kind == "fill" and name in tensors:
            ttype, data = tensors[name]
            data = data.copy()
            data.reshape(-1)[:None if edit[3] else 1] = float(edit[2])
            tensors[name] = (ttype, data)
        elif kind == "type" and name in tensors and \
                tensors[name][1].shape[-1] % (32 if edit[2] == "Q8_0" else 1) == 0:
            tensors[name] = (edit[2], tensors[name][1])
    for name, (ttype, data) in tensors.items():
        w.add_tensor(name, ttype, data.shape, _encode_tensor(ttype, data))
    w.write()


def _encode_tensor(ttype: str, data: np.ndarray) -> np.ndarray:
    if ttype == "F32":
        return data
    if ttype == "F16":
        return data.astype(np.float16)
    if ttype == "BF16":
        return (data.view(np.uint32) >> 16).astype(np.uint16)
    if ttype == "I32":
        return data.astype(np.int32)
    from llamatui.inference.quants import quantize
    return quantize(ttype, data.reshape(-1, data.shape[-1]))


_BASE_CACHE: dict = {}


def base_model_cached(name: str):
    if name not in _BASE_CACHE:
        _BASE_CACHE[name] = base_model(name)
    return _BASE_CACHE[name]


def coverage(cases: list[Case]) -> tuple[Counter, Counter]:
    """How often each value class and each key was used."""
    classes = Counter(c for case in cases for c in case.classes)
    keys = Counter(e[1] for case in cases for e in case.edits)
    return classes, keys


# ----------------------------------------------------------------------------- the worker

# What internal wording looks like: numpy's and Python's own messages, which say nothing about
# the model (an error must name the key or tensor, the value and what was expected).
INTERNAL_WORDING = re.compile(
    r"cannot reshape|could not broadcast|operands could not|invalid literal|index \S+ is out of "
    r"bounds|out of bounds for axis|list index out of range|object of type|is not JSON "
    r"serializable|setting an array element|unhashable|not subscriptable|has no len|object is "
    r"not iterable|unsupported operand|math domain error|division by zero|too many indices|"
    r"must be real number|int too large|too large to convert|cannot convert float|only integer "
    r"scalar|truth value of an array|argument must be|object cannot be interpreted|"
    r"Unable to allocate|array is too big|negative dimensions|maximum supported dimension|"
    r"zero-size array|codec can't|takes \d+ positional|expected str, bytes|can't multiply",
    re.IGNORECASE)


def _clear_error_types() -> tuple:
    from llamatui.inference.catalog import UnsupportedArchitectureError
    from llamatui.inference.chat.template import ChatTemplateError
    from llamatui.inference.gguf import GGUFError
    from llamatui.inference.hparams import ModelMetadataError
    from llamatui.inference.memory import InsufficientMemoryError
    from llamatui.inference.scheduler import ContextFullError, NonFiniteLogitsError
    return (GGUFError, ModelMetadataError, UnsupportedArchitectureError, InsufficientMemoryError,
            ContextFullError, ChatTemplateError, NonFiniteLogitsError)


def _stages(path: str):
    """(stage name, function) for one case's file."""
    import contextlib
    import io
    from argparse import Namespace

    def read():
        from llamatui.inference.gguf import GGUFFile
        with GGUFFile.open(path) as f:
            for key in f.metadata:
                f.metadata[key]
            for t in f.tensors.values():
                t.data

    def estimate():
        from llamatui.models.recommend import estimate_file
        est = estimate_file(path)
        est.as_dict()
        est.breakdown()

    def inspect():
        from llamatui.app.cli import inspect as cmd_inspect
        with contextlib.redirect_stdout(io.StringIO()) as out:
            cmd_inspect.run(Namespace(model=path, json=True))
        json.loads(out.getvalue())

    def engine():
        from llamatui.inference.engine import Engine
        with Engine.load(path, LoadConfig(n_ctx=64, threads=1)) as eng:  # warm-up: one decode
            events = list(eng.generate("ab", max_tokens=1))
            assert events[-1].kind == "done", events[-1]
            eng.detokenize(range(len(eng.tokenizer)))
            eng.tokenize("a b\n<s>ab</s> [UNK] xAB Héllo", parse_special=True)

    return [("read", read), ("estimate", estimate), ("inspect", inspect), ("engine", engine)]


def run_one(path: str) -> dict:
    """Every stage on the file: {stage: ["ok"] | ["clear", type, message] |
    ["failure", type, message]}."""
    clear = _clear_error_types()
    out = {}
    for name, fn in _stages(path):
        try:
            fn()
            out[name] = ["ok"]
        except Exception as e:  # noqa: BLE001 - classified, that is the point
            message = str(e)
            kind = "clear" if isinstance(e, clear) and not INTERNAL_WORDING.search(message) \
                else "failure"
            out[name] = [kind, type(e).__name__, message[:300]]
        except MemoryError as e:
            out[name] = ["failure", type(e).__name__, str(e)[:300]]
    return out


def worker_main() -> None:
    """Reads file paths on stdin, one per line; answers one JSON line per path."""
    import resource
    import warnings
    warnings.simplefilter("ignore")
    resource.setrlimit(resource.RLIMIT_AS, (WORKER_ADDRESS_SPACE, WORKER_ADDRESS_SPACE))
    for base in sys.argv[1:]:  # warm up: load (compile) everything on the unmutated bases
        result = run_one(base)
        if any(r[0] != "ok" for r in result.values()):
            print(json.dumps({"warmup_failed": base, "result": result}), flush=True)
            return
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        path = line.rstrip("\n")
        print(json.dumps(run_one(path)), flush=True)


# ----------------------------------------------------------------------------- the pool


class Worker:
    """One worker process; `ask(path, timeout)` → its JSON answer, or None when it died or did
    not answer in time (it is then killed; the next ask starts a new one)."""

    def __init__(self, base_paths: list[str]):
        self.base_paths = base_paths
        self.proc = None
        self._buf = b""
        self.starts = 0

    def _start(self) -> None:
        env = dict(os.environ, NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1",
                   OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
                   LLAMATUI_AVAILABLE_MEMORY=str(WORKER_AVAILABLE_MEMORY))
        here = str(pathlib.Path(__file__).resolve().parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import metadata_fuzz; metadata_fuzz.worker_main()",
             *self.base_paths], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, env=env)
        self._buf = b""
        self.starts += 1
        answer = self._read(STARTUP_TIMEOUT_S)
        if not answer or not answer.get("ready"):
            self.stop()
            raise RuntimeError(f"a fuzz worker did not start: {answer}")

    def _read(self, timeout: float):
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    return None
                chunk = os.read(fd, 65536)
                if not chunk:
                    return None
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def ensure_started(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self._start()

    def ask(self, path: str, timeout: float):
        self.ensure_started()
        try:
            self.proc.stdin.write(path.encode("utf-8", "surrogateescape") + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            answer = None
        else:
            answer = self._read(timeout)
        if answer is None:
            self.stop()
        return answer

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            for stream in (self.proc.stdin, self.proc.stdout):
                stream.close()
            self.proc = None


@dataclass
class Result:
    case: Case
    stages: dict | None  # None: the worker crashed or hung
    seconds: float
    hung: bool = False
    retried: bool = False  # the first attempt crashed or hung, the second answered

    @property
    def failures(self) -> list[str]:
        if self.stages is None:
            return ["hang (no answer in %.0f s)" % CASE_TIMEOUT_S if self.hung else
                    "worker crashed"]
        return [f"{stage}: {r[1]}: {r[2]}" for stage, r in self.stages.items()
                if r[0] == "failure"]

    @property
    def outcome(self) -> str:
        """"failure", "ok" (every stage succeeded) or "clear <Type>" (the first clear error)."""
        if self.failures:
            return "failure"
        errors = [r[1] for r in self.stages.values() if r[0] == "clear"]
        return f"clear {errors[0]}" if errors else "ok"


def _run_case(worker: Worker, case: Case, path: pathlib.Path, timeout: float) -> Result:
    """The case on the worker; a case that crashes or hangs it runs once more on a fresh one
    (a machine shared with other jobs can stall a process for seconds): only a repeat counts."""
    for attempt in range(2):
        write_case(case, path)
        worker.ensure_started()  # (re)starting is not the case's time
        t0 = time.monotonic()
        answer = worker.ask(str(path), timeout)
        seconds = time.monotonic() - t0
        path.unlink(missing_ok=True)
        if answer is not None:
            break
    return Result(case, answer, seconds, hung=answer is None and seconds >= timeout,
                  retried=attempt > 0)


def run_cases(cases: list[Case], directory, n_workers: int = 2,
              timeout: float = CASE_TIMEOUT_S) -> list[Result]:
    """Runs the cases on `n_workers` worker processes; results in case order."""
    directory = pathlib.Path(directory)
    base_paths = []
    for name, case in [(b, Case(-1, b)) for b in BASES] + [("types", WARMUP_TYPES)]:
        path = directory / f"base-{name}.gguf"
        write_case(case, path)
        base_paths.append(str(path))
    results: list[Result | None] = [None] * len(cases)
    lock = threading.Lock()
    pending = iter(range(len(cases)))
    errors: list[BaseException] = []

    def loop(worker_id: int) -> None:
        worker = Worker(base_paths)
        try:
            while True:
                with lock:
                    i = next(pending, None)
                if i is None or errors:
                    return
                results[i] = _run_case(worker, cases[i], directory / f"w{worker_id}.gguf",
                                       timeout)
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)
        finally:
            worker.stop()

    threads = [threading.Thread(target=loop, args=(k,)) for k in range(n_workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def summary(results: list[Result]) -> str:
    outcomes = Counter(r.outcome for r in results)
    by_class: dict[str, Counter] = {}
    for r in results:
        for cls in set(r.case.classes):
            by_class.setdefault(cls, Counter())[r.outcome.split()[0]] += 1
    lines = [f"{len(results)} cases: " + ", ".join(f"{k} {v}" for k, v in outcomes.most_common())]
    for cls in VALUE_CLASSES:
        c = by_class.get(cls, Counter())
        lines.append(f"  {cls:13s} ok {c['ok']:4d}  clear {c['clear']:4d}  failure "
                     f"{c['failure']:4d}")
    retried = [r.case.index for r in results if r.retried]
    if retried:
        lines.append(f"cases that stalled or crashed once and then answered: {retried}")
    slowest = max(results, key=lambda r: r.seconds)
    lines.append(f"slowest case {slowest.seconds:.2f} s: {slowest.case.label[:120]}")
    return "\n".join(lines)


if __name__ == "__main__":  # python tests/metadata_fuzz.py [N] [SEED]: a run with a report
    import tempfile
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 2024
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        res = run_cases(make_cases(seed, n), tmp)
        print(summary(res))
        print(f"{time.monotonic() - t0:.0f} s")
        seen = Counter()
        for r in res:
            for f in r.failures:
                sig = re.sub(r"\d+", "N", f)[:110]
                seen[sig] += 1
                if seen[sig] <= 2:
                    print("FAIL", r.case.label[:200], "\n    ", f[:300])
        print("\n".join(f"{v:5d} {k}" for k, v in seen.most_common()))
