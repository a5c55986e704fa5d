"""Whole-model quantization like llama-quantize: choose each tensor's type, convert, write.

    result = quantize_model("model-f16.gguf", "model-q4_k_m.gguf", "Q4_K_M", imatrix=imatrix)

The type choice is llama.cpp's `llama_tensor_get_type` (src/llama-quant.cpp):

* Only tensors whose name ends in "weight", with at least 2 dimensions, and that are not norms
  or one of the small special tensors llama.cpp leaves alone, are quantized; the rest are copied.
* The file type (the "mix", e.g. Q4_K_M) gives a default ggml type; the mix's rules then raise
  some tensors: `output.weight` (or `token_embd.weight` when the output is tied to it) to Q6_K,
  `attn_v` and `ffn_down` to more bits on the first, last and every third layer
  ("use_more_bits"), `attn_output` for the Q2_K/Q3_K mixes, and so on.
* MXFP4 (llama-quantize's MXFP4_MOE): the experts' 3-D tensors MXFP4, every other weight Q8_0.
* The 1- and 2-bit i-quant mixes (IQ1_S/IQ1_M/IQ2_XXS/IQ2_XS/IQ2_S/IQ2_M) raise attn_v, the
  first n/8 ffn_down and attn_output, put the output at Q5_K and the token embedding at Q2_K or
  IQ3_S; IQ3_XXS/IQ3_XS/IQ3_S/IQ3_M and the ternary TQ1_0/TQ2_0 have their own few rules.
* IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_M and IQ1_S tensors (and Q2_K_S's Q2_K ones) need an
  importance matrix: without one the quantization is refused before anything is written.
* A row length that is not a multiple of the chosen type's block falls back to a type it is:
  Q2_K/Q3_K/TQ1_0/TQ2_0 → Q4_0, Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, the IQ types of 256
  → IQ4_NL, then F16 (a 32-value type straight to F16).
* Tensors are visited in llama.cpp's order (by layer, then by name), which is also the order
  they are written in; the attn_v counter that drives the Q3_K_M / Q4_K_S rules follows it.

The output keeps every metadata key of the input (split keys dropped), then sets
`general.quantization_version` = 2 and `general.file_type` (moved to the end, as gguf does), and,
with an importance matrix, the `quantize.imatrix.*` keys llama-quantize adds.
"""
from __future__ import annotations

import errno
import math
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from llamatui.inference.catalog import GGML_TYPES, MIX_ALIASES, MIXES, Mix
from llamatui.inference.gguf import GGUFFile, GGUFValueType, GGUFWriter, ValueType
from llamatui.inference.quants import QUANTIZERS, dequantize, get_quant_type, quantize

__all__ = ["FTYPES", "ModelFacts", "QuantizeError", "QuantizeResult", "TensorPlan",
           "TensorSpec", "EvalResult", "evaluate_against", "llama_order", "parse_ftype",
           "plan_tensor_types", "quantize_model", "select_tensor_types"]

QUANTIZATION_VERSION = 2  # GGML_QNT_VERSION


class QuantizeError(ValueError):
    """A quantization that cannot be done as asked; the message says why and what to do."""


# ----------------------------------------------------------------------------- file types


# The mixes this quantizer writes, from the catalog (which also names the rest).
FTYPES: dict[str, Mix] = {m.name: m for m in MIXES if m.quantizable}


def parse_ftype(name) -> Mix:
    """A mix this quantizer writes, from its name (any case, llama-quantize's aliases
    Q3_K/Q4_K/Q5_K) or its llama_ftype number."""
    if isinstance(name, Mix):
        name = name.name
    key = str(name).strip().upper()
    key = MIX_ALIASES.get(key, key)
    if key in FTYPES:
        return FTYPES[key]
    if key.isdigit():
        for f in FTYPES.values():
            if f.file_type == int(key):
                return f
    raise QuantizeError(f"unknown quantization type {name!r}; choose one of "
                        f"{', '.join(FTYPES)}")


_NOT_QUANTIZED = {"F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"}


def is_quantized(type_name: str) -> bool:
    """ggml_is_quantized: a block type (not a plain float or integer type)."""
    return type_name not in _NOT_QUANTIZED


def _block_size(type_name: str) -> int:
    return GGML_TYPES[type_name].block_size


def _check_type_name(type_name: str, what: str) -> str:
    name = str(type_name).strip().upper()
    if name not in GGML_TYPES:
        raise QuantizeError(f"{what}: unknown ggml type {type_name!r}")
    if name != "F32" and name not in QUANTIZERS:
        raise QuantizeError(f"{what}: llamatui cannot quantize to {name}; supported: F32, "
                            f"{', '.join(QUANTIZERS)}")
    return name


# ----------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class TensorSpec:
    """What the type choice looks at: a tensor's name, ggml type and shape (numpy order,
    (rows, cols) for a matrix)."""
    name: str
    type: str
    shape: tuple[int, ...]

    @property
    def n_dims(self) -> int:
        """ggml_n_dims: dimensions up to the last one larger than 1 (at least 1)."""
        dims = list(self.shape)
        while len(dims) > 1 and dims[0] == 1:
            dims.pop(0)
        return max(1, len(dims))

    @property
    def n_cols(self) -> int:  # ggml's ne[0]
        return int(self.shape[-1]) if self.shape else 1


@dataclass(frozen=True)
class ModelFacts:
    """The hyperparameters llama.cpp's rules consult."""
    arch: str
    n_layer: int
    n_head: int = 0
    n_head_kv: int = 0
    n_expert: int = 0
    is_70b: bool = False  # llama.cpp's LLM_TYPE_70B (8 query heads per attn_v)

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @classmethod
    def from_metadata(cls, md: Mapping) -> "ModelFacts":
        arch = md.get("general.architecture")
        if not arch:
            raise QuantizeError("the model has no general.architecture in its metadata")
        p = f"{arch}."
        if p + "block_count" not in md:
            raise QuantizeError(f"the model's metadata lacks {p}block_count")

        def first(value, default=0):  # per-layer arrays: layer 0, as n_head(0) does
            if value is None:
                return default
            if isinstance(value, (list, tuple, np.ndarray)):
                return int(value[0]) if len(value) else default
            return int(value)

        n_layer = int(md[p + "block_count"])
        n_head = first(md.get(p + "attention.head_count"))
        n_head_kv = first(md.get(p + "attention.head_count_kv"), n_head)
        return cls(arch=str(arch), n_layer=n_layer, n_head=n_head, n_head_kv=n_head_kv,
                   n_expert=first(md.get(p + "expert_count")),
                   is_70b=arch == "llama" and n_layer == 80 and n_head != n_head_kv)


_LAYER = re.compile(r"blk\.([+-]?\d+)")


def llama_order(name: str) -> tuple[int, str]:
    """Sort key of llama.cpp's model loader (weight_name_comparer): layer number (-1 for tensors
    outside the blocks), then name."""
    m = _LAYER.match(name)
    return (int(m.group(1)) if m else -1, name)


# ----------------------------------------------------------------------------- type choice

_OUTPUT, _TOKEN_EMBD, _ATTN_QKV, _ATTN_KV_B, _ATTN_V, _ATTN_K, _ATTN_Q, _ATTN_OUTPUT, \
    _FFN_UP, _FFN_GATE, _FFN_DOWN, _OTHER = range(12)


def _category(name: str) -> int:
    if name == "output.weight":
        return _OUTPUT
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return _TOKEN_EMBD
    for needle, cat in (("attn_qkv.weight", _ATTN_QKV), ("attn_kv_b.weight", _ATTN_KV_B),
                        ("attn_v.weight", _ATTN_V), ("attn_k.weight", _ATTN_K),
                        ("attn_q.weight", _ATTN_Q), ("attn_output.weight", _ATTN_OUTPUT),
                        ("ffn_up", _FFN_UP), ("ffn_gate", _FFN_GATE), ("ffn_down", _FFN_DOWN)):
        if needle in name:
            return cat
    return _OTHER


def _is_attn_v(cat: int) -> bool:
    return cat in (_ATTN_V, _ATTN_QKV, _ATTN_KV_B)


# Substrings of 2-D weights llama.cpp never quantizes (tensor_allows_quantization).
_NEVER_QUANTIZED = (
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
    "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
    "indexer.q_proj.weight", "time_mix_first.weight", "time_mix_w0.weight",
    "time_mix_w1.weight", "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight",
    "time_mix_v2.weight", "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight",
    "time_mix_g1.weight", "time_mix_g2.weight", "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight", "attn_rel_b.weight",
    ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd",
    ".patch_merger", "a.rvq.codebook", "mm.a.code_embd",
)


def allows_quantization(spec: TensorSpec, leave_output_tensor: bool = False) -> bool:
    """Whether llama-quantize would quantize this tensor at all."""
    name = spec.name
    if spec.n_dims < 2 or not name.endswith("weight"):
        return False
    if leave_output_tensor and name == "output.weight":
        return False
    if name in ("position_embd.weight", "token_types.weight"):
        return False
    return not any(s in name for s in _NEVER_QUANTIZED)


def _use_more_bits(i_layer: int, n_layers: int) -> bool:
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or \
        (i_layer - n_layers // 8) % 3 == 2


_FALLBACK = {"IQ1_S": "IQ4_NL", "IQ1_M": "IQ4_NL", "IQ2_XXS": "IQ4_NL", "IQ2_XS": "IQ4_NL",
             "IQ2_S": "IQ4_NL", "IQ3_XXS": "IQ4_NL", "IQ3_S": "IQ4_NL", "IQ4_XS": "IQ4_NL",
             "Q2_K": "Q4_0", "Q3_K": "Q4_0", "TQ1_0": "Q4_0", "TQ2_0": "Q4_0",
             "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


@dataclass
class _State:
    """quantize_state_impl's counters."""
    facts: ModelFacts
    ftype: Mix
    has_imatrix: bool
    tied_embeddings: bool
    n_attention_wv: int
    i_attention_wv: int = 0
    i_ffn_down: int = 0
    i_ffn_gate: int = 0
    i_ffn_up: int = 0

    def layer_info(self, counter: int, name: str) -> tuple[int, int]:
        n_layer = self.facts.n_layer
        if self.facts.n_expert > 1:  # experts are not consecutive: read the layer off the name
            m = re.match(r"blk\.(-?\d+)\.", name)
            if not m:
                raise QuantizeError(f"failed to determine the layer of tensor {name}")
            layer = int(m.group(1))
            if not 0 <= layer < n_layer:
                raise QuantizeError(f"bad layer {layer} for tensor {name}: must be in "
                                    f"[0, {n_layer})")
            return layer, n_layer
        return counter, n_layer


# The very-low-bit mixes llama.cpp gives rules of their own (attn_v, ffn_down, attn_output).
_VERY_LOW_BIT = frozenset({"IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M"})
# Those whose output (or tied token embedding) gets Q5_K instead of Q6_K.
_OUTPUT_Q5_K = _VERY_LOW_BIT | {"IQ3_XXS"}


def _mix_rules(qs: _State, new: str, spec: TensorSpec, cat: int,
               output_tensor_type: str | None) -> str:
    """llama_tensor_get_type_impl: the mix's type for one tensor, branch by branch in
    llama.cpp's order (the first that matches decides)."""
    facts, f = qs.facts, qs.ftype.name
    if cat == _OUTPUT or (qs.tied_embeddings and cat == _TOKEN_EMBD):
        if output_tensor_type is not None:
            return output_tensor_type
        if f == "MXFP4" or facts.arch == "falcon" or spec.n_cols % _block_size(new):
            return "Q8_0"
        if f in _OUTPUT_Q5_K:
            return "Q5_K"
        return new if new == "Q8_0" else "Q6_K"
    if f == "MXFP4":
        return _mxfp4_moe_type(facts, spec, cat)
    if cat == _TOKEN_EMBD:
        return _token_embd_type(f, new)
    if f in _VERY_LOW_BIT:
        return _very_low_bit_type(qs, new, cat)
    if _is_attn_v(cat):
        new = _attn_v_type(qs, new)
        qs.i_attention_wv += 1
        return new
    if cat in (_ATTN_K, _ATTN_Q):
        if cat == _ATTN_K and facts.n_expert == 8:
            return "Q8_0"
        return {"IQ3_XS": "IQ3_XXS", "IQ3_XXS": "IQ2_S"}.get(f, new)
    if cat == _FFN_DOWN:
        new = _ffn_down_type(qs, new, spec)
        qs.i_ffn_down += 1
        return new
    if cat == _ATTN_OUTPUT:
        return _attn_output_type(qs, new)
    # (attn_qkv is caught by the attn_v branch above, as in llama.cpp)
    if cat in (_FFN_GATE, _FFN_UP):
        counter = qs.i_ffn_gate if cat == _FFN_GATE else qs.i_ffn_up
        i, n = qs.layer_info(counter, spec.name)
        if f == "IQ3_XS" and n // 8 <= i < 7 * n // 8:
            new = "IQ3_XXS"
        if cat == _FFN_GATE:
            qs.i_ffn_gate += 1
        else:
            qs.i_ffn_up += 1
    return new


def _token_embd_type(f: str, new: str) -> str:
    """llama_tensor_get_type_impl's token_embd rule (an untied embedding): the 1- and 2-bit
    mixes raise it (a lookup table gains little from the lowest types)."""
    if f in ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"):
        return "Q2_K"
    if f in ("IQ2_S", "IQ2_M", "IQ3_XXS"):
        return "IQ3_S"
    if f in ("TQ1_0", "TQ2_0"):
        return "Q4_K"
    return new


def _very_low_bit_type(qs: _State, new: str, cat: int) -> str:
    """llama_tensor_get_type_impl's branch for IQ1_S/IQ1_M/IQ2_XXS/IQ2_XS/IQ2_S/IQ2_M. Unlike the
    other mixes' ffn_down rule, the first n/8 ffn_down tensors are counted, not read off the
    name (llama.cpp's i_ffn_down < n_ffn_down/8), and attn_q/ffn_gate/ffn_up keep the default."""
    f, facts = qs.ftype.name, qs.facts
    wider = "IQ3_S" if f in ("IQ2_S", "IQ2_M") else "Q2_K"
    if _is_attn_v(cat):
        new = "Q4_K" if facts.n_gqa >= 4 or facts.n_expert >= 4 else wider
        qs.i_attention_wv += 1
    elif cat == _ATTN_K and facts.n_expert == 8:
        new = "Q4_K"
    elif cat == _FFN_DOWN:
        if qs.i_ffn_down < facts.n_layer // 8:
            new = wider
        qs.i_ffn_down += 1
    elif cat == _ATTN_OUTPUT:
        if facts.n_expert == 8:
            new = "Q5_K"
        elif f in ("IQ1_S", "IQ1_M"):
            new = "IQ2_XXS"
        elif f in ("IQ2_S", "IQ2_M"):
            new = "IQ3_S"
    return new


def _mxfp4_moe_type(facts: ModelFacts, spec: TensorSpec, cat: int) -> str:
    """llama_tensor_get_type_impl's MXFP4_MOE rule: the experts' 3-D tensors (ne[2] > 1) MXFP4,
    every other tensor Q8_0; bailingmoe3's 3-D tensors only when they are ffn experts (its MLA
    projections are 3-D too). No counter advances, as in llama.cpp."""
    n_mats = spec.shape[-3] if len(spec.shape) >= 3 else 1
    experts = facts.arch != "bailingmoe3" or cat in (_FFN_UP, _FFN_GATE, _FFN_DOWN)
    return "MXFP4" if n_mats > 1 and experts else "Q8_0"


def _attn_v_type(qs: _State, new: str) -> str:
    """llama_tensor_get_type_impl's attn_v (and attn_qkv) rules."""
    f, facts = qs.ftype.name, qs.facts
    i, n = qs.i_attention_wv, qs.n_attention_wv
    if f == "Q2_K":
        new = "Q4_K" if facts.n_gqa >= 4 else "Q3_K"
    elif f == "Q2_K_S" and facts.n_gqa >= 4:
        new = "Q4_K"
    elif f == "IQ3_XXS":
        new = "Q4_K" if facts.n_gqa >= 4 else "IQ3_XXS" if qs.has_imatrix else "IQ3_S"
    elif f in ("IQ3_XS", "IQ3_S") and facts.n_gqa >= 4:
        new = "Q4_K"
    elif f == "IQ3_M":
        new = "Q4_K"
    elif f == "Q3_K_M":
        new = "Q5_K" if i < 2 else "Q4_K"
    elif f == "Q3_K_L":
        new = "Q5_K"
    elif f in ("IQ4_NL", "IQ4_XS") and facts.n_gqa >= 4:
        new = "Q5_K"
    elif f in ("Q4_K_M", "Q5_K_M") and _use_more_bits(i, n):
        new = "Q6_K"
    elif f == "Q4_K_S" and i < 4:
        new = "Q5_K"
    if facts.is_70b and new in ("Q3_K", "Q4_K"):
        new = "Q5_K"
    if facts.n_expert == 8:
        new = "Q8_0"
    return new


def _ffn_down_type(qs: _State, new: str, spec: TensorSpec) -> str:
    """llama_tensor_get_type_impl's ffn_down rules."""
    f, falcon = qs.ftype.name, qs.facts.arch == "falcon"
    i, n = qs.layer_info(qs.i_ffn_down, spec.name)
    if f == "Q2_K":
        new = "Q3_K"
    elif f == "Q2_K_S":
        if i < n // 8:
            new = "Q4_K"
    elif f == "IQ3_XXS" and not qs.has_imatrix:
        new = "Q4_K" if i < n // 8 else "Q3_K"
    elif f == "Q3_K_M":
        new = "Q5_K" if i < n // 16 else \
            "Q4_K" if not falcon or _use_more_bits(i, n) else "Q3_K"
    elif f == "IQ3_M" and (i < n // 8 or (qs.facts.n_expert == 8 and _use_more_bits(i, n))):
        new = "Q4_K"
    elif f == "Q3_K_L":
        new = "Q4_K" if falcon else "Q5_K"
    elif f == "Q4_K_M":
        if falcon:
            new = "Q6_K" if i < n // 16 else "Q5_K" if _use_more_bits(i, n) else "Q4_K"
        elif _use_more_bits(i, n):
            new = "Q6_K"
    elif i < n // 8 and f in ("IQ4_NL", "IQ4_XS") and not qs.has_imatrix:
        new = "Q5_K"
    elif f == "Q5_K_M" and _use_more_bits(i, n):
        new = "Q6_K"
    elif f == "Q4_K_S" and not falcon and i < n // 8:
        new = "Q5_K"
    elif f in ("Q4_0", "Q5_0") and qs.has_imatrix and i < n // 8:
        # llama.cpp guards the first ffn_down layers of Q4_0/Q5_0 when it has an imatrix
        new = "Q4_1" if f == "Q4_0" else "Q5_1"
    return new


def _attn_output_type(qs: _State, new: str) -> str:
    """llama_tensor_get_type_impl's attn_output rules."""
    f = qs.ftype.name
    if qs.facts.arch != "falcon":
        if qs.facts.n_expert == 8:
            if f in ("Q2_K", "IQ3_XS", "IQ3_XXS", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S",
                     "Q4_K_M", "IQ3_S", "IQ3_M", "IQ4_XS"):
                new = "Q5_K"
        elif f == "Q2_K":
            new = "Q3_K"
        elif f == "IQ3_XXS":
            new = "IQ3_S"
        elif f in ("Q3_K_M", "IQ3_M"):
            new = "Q4_K"
        elif f == "Q3_K_L":
            new = "Q5_K"
    elif f == "Q3_K_L":
        new = "Q4_K"
    return new


@dataclass(frozen=True)
class TensorPlan:
    """One tensor of the output: its name, shape, type in the input and in the output, and the
    type the rules wanted when its row length forced a fallback."""
    name: str
    shape: tuple[int, ...]
    src_type: str
    dst_type: str
    fallback_from: str | None = None

    @property
    def converts(self) -> bool:
        return self.src_type != self.dst_type


def plan_tensor_types(tensors: Iterable[TensorSpec], facts: ModelFacts, ftype, *,
                      has_imatrix: bool = False, output_tensor_type: str | None = None,
                      token_embedding_type: str | None = None, pure: bool = False,
                      leave_output_tensor: bool = False) -> list[TensorPlan]:
    """llama-quantize's choice of type for every tensor, in llama.cpp's order."""
    ft = parse_ftype(ftype)
    default = ft.default_type
    specs = sorted(tensors, key=lambda s: llama_order(s.name))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise QuantizeError("duplicate tensor names in the model")
    cats = [_category(n) for n in names]
    qs = _State(facts=facts, ftype=ft, has_imatrix=has_imatrix,
                tied_embeddings=_OUTPUT not in cats,
                n_attention_wv=sum(_is_attn_v(c) for c in cats))
    if output_tensor_type is not None:
        output_tensor_type = _check_type_name(output_tensor_type, "--output-tensor-type")
    if token_embedding_type is not None:
        token_embedding_type = _check_type_name(token_embedding_type, "--token-embedding-type")
    plans = []
    for spec, cat in zip(specs, cats):
        fallback_from = None
        if not allows_quantization(spec, leave_output_tensor):
            new = spec.type
        elif token_embedding_type is not None and cat == _TOKEN_EMBD:
            new = token_embedding_type
        elif output_tensor_type is not None and cat == _OUTPUT:
            new = output_tensor_type
        else:
            new = default
            if is_quantized(default):
                if not pure:
                    new = _mix_rules(qs, new, spec, cat, output_tensor_type)
                if spec.n_cols % _block_size(new):
                    fallback_from = new
                    if new not in _FALLBACK and _block_size(new) > 32:
                        raise QuantizeError(f"{spec.name}: rows of {spec.n_cols} values do not "
                                            f"fit {new} blocks of {_block_size(new)}, and no "
                                            f"fallback type is defined for {new}")
                    # a 32-value type has no smaller block to fall back to
                    new = _FALLBACK.get(new, new)
                    if spec.n_cols % _block_size(new):
                        new = "F16"  # an unusual shape: not even blocks of 32
        plans.append(TensorPlan(spec.name, tuple(spec.shape), spec.type, new, fallback_from))
    return plans


def select_tensor_types(tensors: Iterable[TensorSpec], facts: ModelFacts, ftype,
                        **options) -> dict[str, str]:
    """name → the ggml type llama-quantize gives it, in llama.cpp's order. Options as
    `plan_tensor_types`."""
    return {p.name: p.dst_type for p in plan_tensor_types(tensors, facts, ftype, **options)}


def tensor_specs(gguf: GGUFFile) -> list[TensorSpec]:
    return [TensorSpec(t.name, t.type, tuple(t.shape)) for t in gguf.tensors.values()]


# ----------------------------------------------------------------------------- quantizing


@dataclass
class QuantizeResult:
    ftype: Mix
    plans: list[TensorPlan]
    n_elements: int  # all tensors
    src_tensor_bytes: int
    dst_tensor_bytes: int
    file_size: int
    seconds: float
    imatrix_used: list[str] = field(default_factory=list)  # tensors quantized with one

    @property
    def bits_per_weight(self) -> float:
        return self.dst_tensor_bytes * 8 / self.n_elements if self.n_elements else 0.0

    @property
    def src_bits_per_weight(self) -> float:
        return self.src_tensor_bytes * 8 / self.n_elements if self.n_elements else 0.0

    @property
    def n_fallback(self) -> int:
        return sum(p.fallback_from is not None for p in self.plans)

    def type_counts(self) -> Counter:
        return Counter(p.dst_type for p in self.plans)


_SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")
_CHUNK_VALUES = 1 << 22  # rows are converted in pieces of about this many values


def _tensor_bytes(p: TensorPlan, type_name: str) -> int:
    n = int(np.prod(p.shape, dtype=np.int64)) if p.shape else 1
    g = GGML_TYPES[type_name]
    return n // g.block_size * g.type_size


# Types whose quantizer gives garbage without importance weights (tensor_requires_imatrix).
_NEEDS_IMATRIX = frozenset({"IQ3_XXS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_M", "IQ1_S"})


def _requires_imatrix(p: TensorPlan, ftype: Mix) -> bool:
    """tensor_requires_imatrix: the 1- and 2-bit i-quants and IQ3_XXS, and the Q2_K tensors of a
    Q2_K_S file; never the token embedding or the output (llama.cpp has no activations for
    them)."""
    if p.name in ("token_embd.weight", "per_layer_token_embd.weight", "output.weight"):
        return False
    return p.dst_type in _NEEDS_IMATRIX or (p.dst_type == "Q2_K" and ftype.name == "Q2_K_S")


# A destination we cannot write to (read-only, not ours, full): one error naming it.
_CANNOT_WRITE = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT)


def quantize_model(src, dst, ftype, *, imatrix=None, allow_requantize: bool = False,
                   output_tensor_type: str | None = None,
                   token_embedding_type: str | None = None, pure: bool = False,
                   leave_output_tensor: bool = False,
                   progress: Callable[[int, int], None] | None = None,
                   on_tensor: Callable[[int, int, TensorPlan], None] | None = None
                   ) -> QuantizeResult:
    """Quantizes the GGUF model `src` into `dst` as llama-quantize does.

    imatrix:  an `Imatrix` (llamatui.quantizer.imatrix), a path to one (GGUF or legacy .dat),
              or a mapping tensor name → per-column importance (float32).
    progress: `progress(done_bytes, total_bytes)` after each tensor is written.
    on_tensor: `on_tensor(i, n, plan)` before each tensor is converted.

    The file is written to a partial file beside `dst` and renamed at the end: a failed or
    interrupted run leaves nothing under `dst`'s name (an existing `dst` stays as it was), and
    what a killed run left is removed by the next write into that folder (inference.gguf's
    "partial files"). A folder that cannot be written is a QuantizeError naming `dst`.
    A tensor that is already quantized is converted only with `allow_requantize`.
    """
    t0 = time.perf_counter()
    ft = parse_ftype(ftype)
    src, dst = os.fspath(src), os.fspath(dst)
    if os.path.exists(dst) and os.path.samefile(src, dst):
        raise QuantizeError(f"input and output are the same file: {src}")
    folder = os.path.dirname(os.path.abspath(dst))
    if not os.path.isdir(folder):
        raise QuantizeError(f"cannot write {dst}: the folder {folder} does not exist")
    imx, imx_meta = _load_imatrix(imatrix)
    with GGUFFile.open(src) as gguf:
        facts = ModelFacts.from_metadata(gguf.metadata)
        plans = plan_tensor_types(tensor_specs(gguf), facts, ft, has_imatrix=bool(imx),
                                  output_tensor_type=output_tensor_type,
                                  token_embedding_type=token_embedding_type, pure=pure,
                                  leave_output_tensor=leave_output_tensor)
        weights = _check_plans(plans, ft, imx, allow_requantize)

        w = GGUFWriter(dst, alignment=gguf.alignment, version=3)
        w.add_metadata(gguf.metadata, skip=_SPLIT_KEYS + ("general.quantization_version",
                                                          "general.file_type"))
        w.add("general.quantization_version", QUANTIZATION_VERSION, GGUFValueType.UINT32)
        w.add("general.file_type", ft.file_type, GGUFValueType.UINT32)
        for key, (vtype, value) in imx_meta.items():
            w.metadata.pop(key, None)
            w.add(key, value, vtype)
        for p in plans:
            w.add_tensor_info(p.name, p.dst_type, p.shape)

        index = {p.name: i for i, p in enumerate(plans)}

        def source(name: str):
            i = index[name]
            p = plans[i]
            if on_tensor:
                on_tensor(i, len(plans), p)
            t = gguf.tensors[name]
            if not p.converts:
                return t.data
            return _convert(t, p, weights.get(name))

        try:
            w.write(progress=progress, tensor_source=source)
        except OSError as e:
            if e.errno not in _CANNOT_WRITE:
                raise
            raise QuantizeError(f"cannot write {dst}: {e.strerror or os.strerror(e.errno)}"
                                ) from None
        n_elements = sum(t.n_elements for t in gguf.tensors.values())
        src_bytes = sum(t.nbytes for t in gguf.tensors.values())
    return QuantizeResult(
        ftype=ft, plans=plans, n_elements=n_elements, src_tensor_bytes=src_bytes,
        dst_tensor_bytes=sum(_tensor_bytes(p, p.dst_type) for p in plans),
        file_size=os.path.getsize(dst), seconds=time.perf_counter() - t0,
        imatrix_used=sorted(weights))


def _check_plans(plans: Sequence[TensorPlan], ft: Mix, imx: Mapping | None,
                 allow_requantize: bool) -> dict[str, np.ndarray]:
    """Everything that can fail is checked before any byte is written. Returns the importance
    weights per tensor that will use them."""
    weights: dict[str, np.ndarray] = {}
    for p in plans:
        if not p.converts:
            continue
        if p.dst_type != "F32" and p.dst_type not in QUANTIZERS:
            raise QuantizeError(f"{p.name}: llamatui cannot quantize to {p.dst_type}")
        if p.shape[-1] % _block_size(p.dst_type):
            raise QuantizeError(f"{p.name}: rows of {p.shape[-1]} values cannot be stored as "
                                f"{p.dst_type} (blocks of {_block_size(p.dst_type)}); choose "
                                "another type for it")
        if is_quantized(p.src_type) and not allow_requantize:
            raise QuantizeError(
                f"{p.name} is already quantized ({p.src_type}); requantizing it to "
                f"{p.dst_type} compounds two rounding errors and loses quality. Quantize from an "
                "F32/F16/BF16 model, or pass --allow-requantize to do it anyway")
        get_quant_type(p.src_type)  # raises UnsupportedTypeError with the supported list
        w = imx.get(p.name) if imx else None
        if w is not None:
            n_mat = int(np.prod(p.shape[:-2], dtype=np.int64)) if len(p.shape) > 2 else 1
            if w.size != p.shape[-1] * n_mat:
                if p.name in ("token_embd.weight", "per_layer_token_embd.weight"):
                    w = None  # llama.cpp ignores a mismatched token embedding entry
                else:
                    raise QuantizeError(f"imatrix size {w.size} is different from tensor size "
                                        f"{p.shape[-1] * n_mat} for {p.name}")
        if w is not None:
            weights[p.name] = w
        elif _requires_imatrix(p, ft):
            raise QuantizeError(_missing_imatrix_message(p, ft, imx is not None))
    return weights


def _missing_imatrix_message(p: TensorPlan, ft: Mix, have_imatrix: bool) -> str:
    """llama-quantize refuses, before writing anything, a very-low-bit tensor without importance
    weights ("the result will be garbage")."""
    what = f"{ft.name} quantizes {p.name} to {p.dst_type}, which needs an importance matrix"
    if have_imatrix:
        return f"{what}, and the imatrix has no entry for it; make the imatrix from this model"
    return f"{what}; pass --imatrix FILE (make one with `llamatui imatrix`)"


def _convert(t, p: TensorPlan, weights: np.ndarray | None) -> Iterator[np.ndarray]:
    """The converted bytes of tensor `t`, a few million values at a time."""
    n_cols = p.shape[-1]
    rows = t.rows  # (all rows, row bytes) of the source
    n_rows = rows.shape[0]
    rows_per_mat = p.shape[-2] if len(p.shape) >= 2 else 1
    step = max(1, _CHUNK_VALUES // n_cols)
    if weights is not None:
        weights = np.ascontiguousarray(weights, np.float32).reshape(-1, n_cols)
    a = 0
    while a < n_rows:
        b = min(n_rows, a + step)
        if weights is not None and weights.shape[0] > 1:  # per-expert weights: stop at matrices
            b = min(b, (a // rows_per_mat + 1) * rows_per_mat)
        x = _dequantize_rows(p.src_type, rows[a:b], (b - a) * n_cols).reshape(b - a, n_cols)
        if p.dst_type == "F32":
            yield np.ascontiguousarray(x, np.float32)
        else:
            qw = None if weights is None else weights[min(a // rows_per_mat, weights.shape[0] - 1)]
            yield quantize(p.dst_type, x, qw)
        a = b


def _dequantize_rows(type_name: str, raw: np.ndarray, n: int) -> np.ndarray:
    if type_name == "F32":
        return raw.reshape(-1).view(np.float32)
    if type_name == "F16":
        return raw.reshape(-1).view(np.float16).astype(np.float32)
    return dequantize(type_name, raw, n)


def _load_imatrix(imatrix) -> tuple[dict[str, np.ndarray] | None, dict]:
    """(tensor name → importance per column, metadata keys to add to the output)."""
    if imatrix is None:
        return None, {}
    from llamatui.quantizer.imatrix import Imatrix
    meta = {}
    if isinstance(imatrix, (str, os.PathLike)):
        path = os.fspath(imatrix)
        imatrix = Imatrix.load(path)
        meta["quantize.imatrix.file"] = (GGUFValueType.STRING, path[:127])
    if isinstance(imatrix, Imatrix):
        values = imatrix.importance()
        if imatrix.datasets:
            meta["quantize.imatrix.dataset"] = (GGUFValueType.STRING, imatrix.datasets[0][:127])
        meta["quantize.imatrix.entries_count"] = (GGUFValueType.UINT32, len(values))
        if imatrix.chunk_count > 0:
            meta["quantize.imatrix.chunks_count"] = (GGUFValueType.UINT32, imatrix.chunk_count)
    else:
        values = {str(k): np.asarray(v, np.float32).reshape(-1) for k, v in imatrix.items()}
        meta["quantize.imatrix.entries_count"] = (GGUFValueType.UINT32, len(values))
    for name, v in values.items():
        if not np.all(np.isfinite(v)):
            raise QuantizeError(f"the imatrix entry for {name} holds non-finite values")
    if not values:
        return None, {}
    return values, {k: (ValueType(t), v) for k, (t, v) in meta.items()}


# ----------------------------------------------------------------------------- evaluation


@dataclass
class EvalResult:
    """The quantized model against its source on one text."""
    n_ctx: int
    n_chunks: int
    n_scored: int
    ppl_base: float
    ppl: float
    kld_mean: float  # mean KL(base ‖ quantized) over the scored positions, in nats
    kld_stderr: float
    top1_agreement: float  # how often both models' most likely next token agree


def evaluate_against(base_path, quant_path, text: str, n_ctx: int = 128, n_chunks: int = 4,
                     threads: int | None = None) -> EvalResult:
    """Perplexity of both models and the KL divergence of the quantized model's next-token
    distribution from the source's, scored like llama-perplexity --kl-divergence (the second
    half of each chunk of `n_ctx` tokens)."""
    from llamatui.inference.config import LoadConfig
    from llamatui.inference.engine import Engine
    from llamatui.inference.perplexity import log_softmax

    config = LoadConfig(n_ctx=n_ctx, threads=threads, warmup=False)
    base = Engine.load(base_path, config)
    try:
        quant = Engine.load(quant_path, config)
        try:
            tok = base.tokenizer
            tokens = tok.encode(text, add_special=True, parse_special=False)
            total = len(tokens) // n_ctx
            if total < 1:
                raise QuantizeError(f"the evaluation text has {len(tokens)} tokens; at least "
                                    f"{n_ctx} are needed")
            n = min(total, n_chunks) if n_chunks else total
            first = n_ctx // 2
            nll_b = nll_q = 0.0
            kl: list[np.ndarray] = []
            agree = count = 0
            for c in range(n):
                chunk = [int(t) for t in tokens[c * n_ctx:(c + 1) * n_ctx]]
                if tok.add_bos and tok.bos_id is not None:
                    chunk[0] = tok.bos_id
                lb = log_softmax(base.logits(chunk)[first:n_ctx - 1])
                lq = log_softmax(quant.logits(chunk)[first:n_ctx - 1])
                targets = np.asarray(chunk[first + 1:n_ctx])
                idx = np.arange(len(targets))
                nll_b -= float(lb[idx, targets].sum())
                nll_q -= float(lq[idx, targets].sum())
                kl.append((np.exp(lb) * (lb - lq)).sum(axis=-1))
                agree += int((lb.argmax(-1) == lq.argmax(-1)).sum())
                count += len(targets)
        finally:
            quant.close()
    finally:
        base.close()
    kls = np.concatenate(kl)
    std = float(kls.std(ddof=1)) / math.sqrt(len(kls)) if len(kls) > 1 else 0.0
    return EvalResult(n_ctx, n, count, math.exp(nll_b / count), math.exp(nll_q / count),
                      float(kls.mean()), std, agree / count)
