"""A model's hyperparameters from its GGUF metadata, every value checked before it is used.

    hp = read_hparams(gguf)          # a GGUFFile, or one opened header-only (the recommender's)

This is llama.cpp's `llama_model::load_hparams` for the keys every family shares (`{arch}.*`,
llama-arch.cpp's LLM_KV names): each value is checked for type and range where it is read, so a
hostile or broken file ends in `ModelMetadataError` naming the key, the value found and what was
expected — never a TypeError deep in the forward pass, nor a cache for a million layers. Only
tensor *shapes* are read (the vocabulary size is token_embd's row count), never tensor data, so
the same reader serves the engine and the memory estimate of a file's first bytes.

A family adds its own keys in its `Architecture.read_hparams(meta, hp)` hook (inference/archs/),
reading them through the same `Meta` checks.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from .catalog import Arch, get_arch
from .gguf import GGUFValueType

__all__ = ["HParams", "Meta", "ModelMetadataError", "POOLING_TYPES", "RecurrentRows",
           "is_integer", "read_hparams", "swa_pattern_layers"]

# llama_pooling_type by its number in `{arch}.pooling_type`: how a sequence's embedding is made
# from its tokens' (none: one per token; rank: a reranker's classification head)
POOLING_TYPES = ("none", "mean", "cls", "last", "rank")

# Ranges a real model stays far inside; past them a value is an error, not an allocation.
MAX_LAYERS = 4096
MAX_WIDTH = 1 << 20  # n_embd, n_ff
MAX_HEADS = 1 << 14
MAX_HEAD_DIM = 1 << 14
MAX_CONTEXT = 1 << 30
MAX_VOCAB = 1 << 24
MAX_EXPERTS = 1 << 14

# rope.scaling.type values llama.cpp knows (llama_rope_scaling_type)
ROPE_SCALINGS = ("none", "linear", "yarn", "longrope")

_REQUIRED = object()


class ModelMetadataError(ValueError):
    """A metadata value (or a tensor's shape) that is missing, of the wrong type or out of range:
    the message names the key, the value found and what was expected."""


def _short(value) -> str:
    if hasattr(value, "__len__") and not isinstance(value, (str, bytes)) and len(value) > 8:
        head = value[:4].tolist() if isinstance(value, np.ndarray) else \
            list(itertools.islice(value, 4))
        return f"{repr(head)[:-1]}, ...] ({len(value)} values)"[:80]
    text = repr(value.tolist() if isinstance(value, np.ndarray) else value)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind(value) -> str:
    return type(value).__name__


def is_integer(value) -> bool:
    """An int (not a bool) or a numpy integer scalar."""
    return isinstance(value, int) and not isinstance(value, bool) or \
        type(value).__module__ == "numpy" and getattr(value, "dtype", None) is not None and \
        value.dtype.kind in "iu" and getattr(value, "ndim", 1) == 0


def _is_number(value) -> bool:
    return is_integer(value) or isinstance(value, float) or \
        type(value).__module__ == "numpy" and getattr(value, "ndim", 1) == 0 and \
        value.dtype.kind == "f"


class Meta:
    """Typed, range-checked reads of a model's metadata. Keys without a dot-prefix are read under
    `{arch}.` (llama.cpp's LLM_KV format); `general.*` and `tokenizer.*` keys are read as given."""

    def __init__(self, metadata: Mapping, arch: str):
        self.md = metadata
        self.arch = arch

    def key(self, name: str) -> str:
        return name if name.startswith(("general.", "tokenizer.", "split.")) else \
            f"{self.arch}.{name}"

    def has(self, name: str) -> bool:
        return self.key(name) in self.md

    def _raw(self, name: str, default):
        key = self.key(name)
        if key in self.md:
            return key, self.md[key], True
        if default is _REQUIRED:
            raise ModelMetadataError(f"GGUF metadata lacks {key!r}")
        return key, default, False

    def fail(self, key: str, value, expected: str) -> ModelMetadataError:
        return ModelMetadataError(f"GGUF metadata {key} = {_short(value)} ({_kind(value)}): "
                                  f"expected {expected}")

    def int(self, name: str, default=_REQUIRED, lo: int = 0, hi: int = MAX_WIDTH):
        """An integer in [lo, hi]; `default` (returned unchecked) when the key is absent."""
        key, value, found = self._raw(name, default)
        if not found:
            return value
        if not is_integer(value) or not lo <= int(value) <= hi:
            raise self.fail(key, value, f"an integer in [{lo}, {hi}]")
        return int(value)

    def float(self, name: str, default=_REQUIRED, lo: float = -math.inf, hi: float = math.inf,
              lo_open: bool = False):
        """A finite number in [lo, hi] ((lo, hi] with lo_open); `default` when absent."""
        key, value, found = self._raw(name, default)
        if not found:
            return value
        ok = _is_number(value) and math.isfinite(float(value)) and \
            (float(value) > lo if lo_open else float(value) >= lo) and float(value) <= hi
        if not ok:
            interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
            raise self.fail(key, value, f"a finite number in {interval}")
        return float(value)

    def bool(self, name: str, default=_REQUIRED) -> bool:
        key, value, found = self._raw(name, default)
        if not found:
            return value
        if not isinstance(value, bool):
            raise self.fail(key, value, "a bool")
        return value

    def str(self, name: str, default=_REQUIRED, choices=None):
        key, value, found = self._raw(name, default)
        if not found:
            return value
        if not isinstance(value, str) or (choices is not None and value not in choices):
            raise self.fail(key, value, "a string" if choices is None else
                            f"one of {', '.join(map(repr, choices))}")
        return value

    def per_layer(self, name: str, n_layer: int, default=_REQUIRED, lo: int = 0,
                  hi: int = MAX_WIDTH) -> tuple[int, ...]:
        """An integer per layer: one value for all, or an array of n_layer values."""
        key, value, found = self._raw(name, default)
        if not found:
            return (value,) * n_layer if value is not None else ()
        if is_integer(value):
            return (self.int(name, lo=lo, hi=hi),) * n_layer
        values = self._array(key, value, n_layer)
        if not all(is_integer(v) and lo <= int(v) <= hi for v in values):
            raise self.fail(key, value, f"integers in [{lo}, {hi}]")
        return tuple(int(v) for v in values)

    def bools_per_layer(self, name: str, n_layer: int) -> tuple[bool, ...]:
        key, value, _ = self._raw(name, _REQUIRED)
        values = self._array(key, value, n_layer)
        if not all(isinstance(v, (bool, np.bool_)) or is_integer(v) and int(v) in (0, 1)
                   for v in values):
            raise self.fail(key, value, f"{n_layer} bools")
        return tuple(bool(v) for v in values)

    def floats(self, name: str, n: int | None = None, default=_REQUIRED) -> tuple[float, ...]:
        """A 1-D array of finite numbers (of length n when given)."""
        key, value, found = self._raw(name, default)
        if not found:
            return value
        values = self._array(key, value, n)
        if not all(_is_number(v) and math.isfinite(float(v)) for v in values):
            raise self.fail(key, value, "an array of finite numbers")
        return tuple(float(v) for v in values)

    def strings(self, name: str, default=_REQUIRED, lo: int = 0, hi: int = MAX_VOCAB) -> list:
        """An array of lo..hi strings (a vocabulary, merges)."""
        key, value, found = self._raw(name, default)
        if not found:
            return value
        declared = getattr(self.md, "types", {}).get(key)
        ok = declared is not None and declared.element is not None and \
            declared.element.type == GGUFValueType.STRING and isinstance(value, list)
        if not ok:  # not what the file reader gives for a string array: look at every element
            ok = all(isinstance(v, str) for v in self._array(key, value, None))
        if not ok or not lo <= len(value) <= hi:
            raise self.fail(key, value, f"an array of {lo} to {hi} strings")
        return value

    def numbers(self, name: str, default=_REQUIRED, kind: str = "float", min_len: int = 0,
                lo: float = -math.inf, hi: float = math.inf) -> np.ndarray:
        """An array of at least `min_len` numbers in [lo, hi] (NaN never), as a numpy array
        (int64 for kind "int", float32 for "float"), checked without a Python loop over a
        large file array."""
        key, value, found = self._raw(name, default)
        if not found:
            return value
        what = f"an array of at least {min_len} {'integers' if kind == 'int' else 'numbers'}" \
            + (f" in [{lo:g}, {hi:g}]" if (lo, hi) != (-math.inf, math.inf) else "")
        if isinstance(value, np.ndarray) and value.ndim == 1:
            ok = value.dtype.kind in ("iu" if kind == "int" else "iuf")
            arr = np.minimum(value, 2**63 - 1).astype(np.int64) if ok and \
                value.dtype == np.uint64 else value
        else:  # a list made by hand: no nested lists, no strings, no bools
            values = self._array(key, value, None)
            ok = all(is_integer(v) if kind == "int" else _is_number(v) for v in values)
            arr = np.array([min(max(int(v), -2**63), 2**63 - 1) for v in values], np.int64) \
                if ok and kind == "int" else np.array(values if ok else [], np.float64)
        if ok and len(arr):
            ok = not (arr.dtype.kind == "f" and np.isnan(arr).any()) and \
                bool(lo <= arr.min()) and bool(arr.max() <= hi)
        if not ok or len(arr) < min_len:
            raise self.fail(key, value, what)
        if kind == "int":
            return arr.astype(np.int64)
        with np.errstate(over="ignore"):
            return arr.astype(np.float32)

    def _array(self, key: str, value, n: int | None) -> list:
        if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or \
                getattr(value, "ndim", 1) != 1:
            raise self.fail(key, value, "an array" + (f" of {n} values" if n else ""))
        if n is not None and len(value) != n:
            raise self.fail(key, value, f"an array of {n} values, one per layer, not {len(value)}")
        return list(value)


@dataclass
class HParams:
    """What the forward pass needs to know about a model (llama_hparams)."""
    arch: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_rot: int
    rms_eps: float
    rope_neox: bool
    rope_freq_base: float
    rope_freq_scale: float = 1.0
    rope_freq_factors: object = None  # float32 per pair (Llama 3.1's rope_freqs), set on load
    # LongRoPE's per-pair factors (Phi 3), set on load: the long ones serve contexts longer
    # than n_ctx_orig (rope_factors_long.weight / rope_factors_short.weight)
    rope_factors_long: object = None
    rope_factors_short: object = None
    rope_scaling: str = "linear"  # "none", "linear", "yarn", "longrope" (llama.cpp's default)
    n_ctx_orig: int = 0  # rope.scaling.original_context_length (n_ctx_train when absent)
    rope_attn_factor: float = 1.0  # rope.scaling.attn_factor: cos and sin are multiplied by it
    # YaRN's ramp and magnitude where a family reads them (llama.cpp's yarn_beta_fast,
    # yarn_beta_slow, rope_yarn_log_mul: defaults for families that do not)
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    rope_yarn_log_mul: float = 0.0
    n_swa: int = 0  # sliding window size; 0: none
    swa_layers: tuple[bool, ...] = ()
    rope_freq_base_swa: float = 10000.0
    rope_freq_scale_swa: float = 1.0
    attn_scale: float = 0.0  # 0: 1/sqrt(head_dim_k)
    final_logit_softcap: float = 0.0
    attn_logit_softcap: float = 0.0
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0
    norm_eps: float = 1e-5  # LayerNorm's (encoders)
    causal: bool = True
    pooling: str = "none"  # one of POOLING_TYPES
    encoder: bool = False  # the catalog's flag: outputs embeddings, never logits
    extra: dict = field(default_factory=dict)  # a family's own values (read in its hook)

    def is_swa(self, il: int) -> bool:
        return bool(self.n_swa > 0 and self.swa_layers and self.swa_layers[il])

    def window(self, il: int) -> int:
        """The sliding window layer il attends within; 0: the whole sequence."""
        return self.n_swa if self.is_swa(il) else 0

    def layer_rope(self, il: int, n_ctx: int | None = None):
        """How layer il rotates Q and K in a context of n_ctx cells (None: the training
        context), as llama.cpp's graphs call ggml_rope_ext: the layer's base and scale
        (llama_model::get_rope_freq_base/_scale), the frequency factors of `rope_factors`, YaRN's
        parameters of `rope_yarn`."""
        from .rope import RopeSpec, Yarn
        ext_factor, attn_factor = self.rope_yarn()
        swa = self.is_swa(il)
        return RopeSpec(self.n_rot, self.rope_freq_base_swa if swa else self.rope_freq_base,
                        self.rope_freq_scale_swa if swa else self.rope_freq_scale,
                        self.rope_neox, self.rope_factors(n_ctx),
                        yarn=Yarn(self.n_ctx_orig, ext_factor, self.yarn_beta_fast,
                                  self.yarn_beta_slow) if ext_factor else None,
                        attn_factor=attn_factor)

    def rope_factors(self, n_ctx: int | None = None):
        """llama_model::get_rope_factors: rope_freqs when the model has them, else LongRoPE's
        long factors when the context (rounded up to 256 cells, as llama_context rounds it) is
        longer than the original one, else the short ones; None when the model has none."""
        if self.rope_freq_factors is not None:
            return self.rope_freq_factors
        n_ctx_seq = -(-(n_ctx or self.n_ctx_train) // 256) * 256
        return self.rope_factors_long if n_ctx_seq > self.n_ctx_orig else self.rope_factors_short

    def rope_yarn(self) -> tuple[float, float]:
        """(ext_factor, attn_factor) as llama_context's constructor sets them from the file:
        YaRN mixes (ext_factor 1) only with rope.scaling.type yarn, and its attention factor
        1 + 0.1·ln(factor) (divided by 1 + 0.1·m·ln(factor) when the family reads a
        rope_yarn_log_mul m: transformers' mscale / mscale_all_dim, mscale taken as 1) is divided
        by 1 + 0.1·ln(factor) here because rope_yarn multiplies that back in; the file's
        rope.scaling.attn_factor multiplies either (float32, as llama.cpp computes)."""
        f32 = np.float32
        ext_factor, attn_factor = 0.0, f32(1.0)
        if self.rope_scaling == "yarn":
            ext_factor = 1.0
            factor = f32(1.0) / f32(self.rope_freq_scale)

            def mscale(m):  # llama_context's get_mscale
                return f32(1.0) if factor <= 1 else f32(0.1) * f32(m) * np.log(factor) + f32(1.0)

            attn_factor = mscale(1.0) / mscale(self.rope_yarn_log_mul) \
                if self.rope_yarn_log_mul else mscale(1.0)
            attn_factor = attn_factor * (f32(1.0) / (f32(1.0) + f32(0.1) * np.log(factor)))
        return ext_factor, float(f32(attn_factor) * f32(self.rope_attn_factor))

    @property
    def kq_scale(self) -> float:
        return self.attn_scale if self.attn_scale else 1.0 / math.sqrt(self.head_dim_k)


def swa_pattern_layers(n_layer: int, n_pattern: int) -> tuple[bool, ...]:
    """llama_hparams::set_swa_pattern: layer il is sliding-window when il % n < n - 1
    (n = 0: every layer)."""
    return tuple(n_pattern == 0 or il % n_pattern < n_pattern - 1 for il in range(n_layer))


def _uniform(meta: Meta, name: str, n_layer: int, varies: bool = False, **bounds) -> int:
    """A count GGUF may give per layer: all layers must agree (our kernels assume it), unless
    the family `varies` it per layer (the catalog's per_layer_widths: its hook reads the array):
    then the largest, which the memory estimates take for every layer."""
    values = meta.per_layer(name, n_layer, **bounds)
    if varies:
        return max(values)
    if len(set(values)) > 1:
        raise ModelMetadataError(f"GGUF metadata {meta.key(name)} differs between layers "
                                 f"({sorted(set(values))}); not supported")
    return values[0]


def _vocab_size(gguf) -> int:
    """token_embd's row count, which must be the vocabulary's size (llama.cpp creates the tensor
    with one row per token of tokenizer.ggml.tokens, and refuses another shape)."""
    tok = gguf.tensors.get("token_embd.weight")
    if tok is None:
        raise ModelMetadataError("the model has no token_embd.weight")
    if len(tok.shape) != 2 or not 0 < tok.shape[0] <= MAX_VOCAB:
        raise ModelMetadataError(f"token_embd.weight has shape {tuple(tok.shape)}: expected "
                                 f"(n_vocab ≤ {MAX_VOCAB}, n_embd)")
    md, key = gguf.metadata, "tokenizer.ggml.tokens"
    if key in md:  # its type is the tokenizer's to check
        n_tokens = md.length(key) if hasattr(md, "length") else \
            len(md[key]) if isinstance(md[key], (list, np.ndarray)) else None
        if n_tokens is not None and n_tokens != tok.shape[0]:
            raise ModelMetadataError(f"token_embd.weight has {tok.shape[0]} rows but {key} has "
                                     f"{n_tokens} tokens: expected one row per token")
    return int(tok.shape[0])


def read_hparams(gguf, arch: Arch | None = None, family: bool = True) -> HParams:
    """The checked hyperparameters of a GGUF model (a GGUFFile, header-only is enough); the
    family's catalog entry supplies its defaults and (unless `family` is False: the memory
    estimate needs only the shared keys, and spares importing the kernels) its `read_hparams`
    hook its own keys."""
    if arch is None:
        arch = get_arch(gguf.metadata.get("general.architecture"))
    meta = Meta(gguf.metadata, arch.name)
    n_layer = meta.int("block_count", lo=1, hi=MAX_LAYERS)
    n_embd = meta.int("embedding_length", lo=1)
    n_head = _uniform(meta, "attention.head_count", n_layer, lo=1, hi=MAX_HEADS)
    n_head_kv = n_head
    if meta.has("attention.head_count_kv"):
        n_head_kv = _uniform(meta, "attention.head_count_kv", n_layer, arch.per_layer_widths,
                             lo=1, hi=MAX_HEADS)
    if n_head % n_head_kv:
        raise ModelMetadataError(f"{n_head} attention heads cannot share {n_head_kv} KV heads "
                                 f"({meta.key('attention.head_count_kv')})")
    head_dim_k = meta.int("attention.key_length", n_embd // n_head, lo=1, hi=MAX_HEAD_DIM)
    head_dim_v = meta.int("attention.value_length", head_dim_k, lo=1, hi=MAX_HEAD_DIM)
    if head_dim_k < 1:
        raise ModelMetadataError(f"{meta.key('embedding_length')} = {n_embd} is smaller than "
                                 f"{n_head} heads")
    n_rot = meta.int("rope.dimension_count", head_dim_k, lo=0, hi=head_dim_k)
    if arch.rope != "none" and (n_rot % 2 or n_rot == 0):
        raise ModelMetadataError(f"GGUF metadata {meta.key('rope.dimension_count')} = {n_rot}: "
                                 f"expected an even number in [2, {head_dim_k}]")
    scaling = meta.str("rope.scaling.type", "linear").lower()
    if scaling not in ROPE_SCALINGS:
        raise meta.fail(meta.key("rope.scaling.type"), scaling,
                        f"one of {', '.join(ROPE_SCALINGS)}")
    factor = meta.float("rope.scaling.factor", 0.0, lo=0.0, hi=1e6) or \
        meta.float("rope.scale_linear", 0.0, lo=0.0, hi=1e6)
    # llama.cpp keeps the scale in float32, and never scales with type "none"
    freq_scale = float(np.float32(1.0) / np.float32(factor)) if factor and scaling != "none" \
        else 1.0
    n_ctx_train = meta.int("context_length", 2048, lo=1, hi=MAX_CONTEXT)
    hp = HParams(
        arch=arch.name, n_vocab=_vocab_size(gguf),
        n_ctx_train=n_ctx_train,
        n_embd=n_embd, n_layer=n_layer,
        n_ff=_uniform(meta, "feed_forward_length", n_layer, arch.per_layer_widths, lo=0) if
        meta.has("feed_forward_length") else 0,
        n_head=n_head, n_head_kv=n_head_kv, head_dim_k=head_dim_k, head_dim_v=head_dim_v,
        n_rot=n_rot,
        rms_eps=meta.float("attention.layer_norm_rms_epsilon", 1e-5, lo=0.0, hi=1.0,
                           lo_open=True),
        norm_eps=meta.float("attention.layer_norm_epsilon", 1e-5, lo=0.0, hi=1.0, lo_open=True),
        rope_neox=arch.rope == "neox",
        rope_freq_base=meta.float("rope.freq_base", 10000.0, lo=0.0, hi=1e12, lo_open=True),
        rope_freq_scale=freq_scale,
        rope_scaling=scaling,
        n_ctx_orig=meta.int("rope.scaling.original_context_length", n_ctx_train, lo=1,
                            hi=MAX_CONTEXT),
        rope_attn_factor=meta.float("rope.scaling.attn_factor", 1.0, lo=0.0, hi=1e6,
                                    lo_open=True),
        n_expert=meta.int("expert_count", 0, lo=0, hi=MAX_EXPERTS),
        n_expert_used=meta.int("expert_used_count", 0, lo=0, hi=MAX_EXPERTS),
        n_ff_exp=meta.int("expert_feed_forward_length", 0, lo=0),
        n_ff_shexp=meta.int("expert_shared_feed_forward_length", 0, lo=0),
        causal=meta.bool("attention.causal", not arch.encoder),
        pooling=POOLING_TYPES[meta.int("pooling_type", 0, lo=0, hi=len(POOLING_TYPES) - 1)],
        encoder=arch.encoder,
    )
    if hp.n_expert_used > hp.n_expert:
        raise ModelMetadataError(f"{meta.key('expert_used_count')} = {hp.n_expert_used} is more "
                                 f"than {meta.key('expert_count')} = {hp.n_expert}")
    _read_sliding_window(meta, arch, hp)
    if family:
        arch.load().read_hparams(meta, hp)
    return hp


@dataclass(frozen=True)
class RecurrentRows:
    """What a hybrid model's recurrent layers keep per sequence (llama.cpp's n_embd_r and
    n_embd_s; recurrent.HybridCache holds them): `layers` the recurrent layers' indices, `conv`
    the shape of one conv state (channels, d_conv - 1), `ssm` the shape of one delta-rule state
    (heads, S_v, S_k); float32 (llama.cpp's default type_r / type_s)."""
    layers: tuple[int, ...]
    conv: tuple[int, int]
    ssm: tuple[int, int, int]

    @property
    def bytes_per_sequence(self) -> int:
        """One sequence's states over every recurrent layer (a checkpoint is one more)."""
        (c0, c1), (h, sv, sk) = self.conv, self.ssm
        return 4 * len(self.layers) * (c0 * c1 + h * sv * sk)


def _read_sliding_window(meta: Meta, arch: Arch, hp: HParams) -> None:
    """The window and which layers slide, for the families llama.cpp gives sliding-window
    layers (the catalog's swa_pattern); the others attend over every cell whatever the file
    says (llama.cpp's llama, phi3... ignore attention.sliding_window)."""
    if arch.swa_pattern is None:
        return
    hp.n_swa = meta.int("attention.sliding_window", arch.n_swa, lo=0, hi=MAX_CONTEXT)
    if meta.has("attention.sliding_window_pattern") and \
            not is_integer(meta.md[meta.key("attention.sliding_window_pattern")]):
        hp.swa_layers = meta.bools_per_layer("attention.sliding_window_pattern", hp.n_layer)
    else:
        pattern = meta.int("attention.sliding_window_pattern", arch.swa_pattern, lo=0,
                           hi=MAX_LAYERS)
        hp.swa_layers = swa_pattern_layers(hp.n_layer, pattern) if hp.n_swa else ()
    base_swa = hp.rope_freq_base if arch.rope_base_swa is None else arch.rope_base_swa
    hp.rope_freq_base_swa = meta.float("rope.freq_base_swa", base_swa, lo=0.0, hi=1e12,
                                       lo_open=True)
