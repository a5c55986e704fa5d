"""The one catalog of facts: ggml tensor types, llama.cpp's quantization mixes, and the model
architectures this engine runs. Everyone reads these tables (engine, quantizer, recommender, Hub
listing, CLI) instead of keeping a copy; nothing here imports numba or numpy, so light tools and
the model manager can read it without loading the kernels.

- `GGML_TYPES` / `GGML_TYPES_BY_ID`: every ggml type a GGUF file may name (ggml.h's
  `ggml_type`), with its block geometry, so a file using one we cannot compute still opens. The
  geometry's one home: a type's class in inference/quants reads it from here, and the backends'
  kernels from the class. Which types the engine computes is derived from the kernels the
  backends register against those classes (`llamatui.inference.engine_types()`, support.py).
- `MIXES`: llama.cpp's `llama_ftype` mixes ("Q4_K_M"...), best first (llama-quantize's
  perplexity order), each with its `general.file_type` number, the ggml type most of its tensors
  get, and the types its matrices use.
- `ARCHITECTURES`: `general.architecture` → the file under `inference/archs/` that implements it
  (imported only when a model of that family loads, like vLLM's lazy registry) and the facts the
  hyperparameter reader needs before any code of the family runs.

Adding a family: write `inference/archs/<name>.py` (see archs/base.py) and add one `Arch(...)`
line to ARCHITECTURES below.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

# ----------------------------------------------------------------------------- ggml types


@dataclass(frozen=True)
class GGMLType:
    id: int
    name: str
    block_size: int  # elements per block
    type_size: int  # bytes per block

    def row_bytes(self, n_elements: int) -> int:
        return n_elements // self.block_size * self.type_size


_QK_K = 256
GGML_TYPES_BY_ID: dict[int, GGMLType] = {t.id: t for t in (
    GGMLType(0, "F32", 1, 4),
    GGMLType(1, "F16", 1, 2),
    GGMLType(2, "Q4_0", 32, 18),
    GGMLType(3, "Q4_1", 32, 20),
    GGMLType(6, "Q5_0", 32, 22),
    GGMLType(7, "Q5_1", 32, 24),
    GGMLType(8, "Q8_0", 32, 34),
    GGMLType(9, "Q8_1", 32, 36),
    GGMLType(10, "Q2_K", _QK_K, 84),
    GGMLType(11, "Q3_K", _QK_K, 110),
    GGMLType(12, "Q4_K", _QK_K, 144),
    GGMLType(13, "Q5_K", _QK_K, 176),
    GGMLType(14, "Q6_K", _QK_K, 210),
    GGMLType(15, "Q8_K", _QK_K, 292),
    GGMLType(16, "IQ2_XXS", _QK_K, 66),
    GGMLType(17, "IQ2_XS", _QK_K, 74),
    GGMLType(18, "IQ3_XXS", _QK_K, 98),
    GGMLType(19, "IQ1_S", _QK_K, 50),
    GGMLType(20, "IQ4_NL", 32, 18),
    GGMLType(21, "IQ3_S", _QK_K, 110),
    GGMLType(22, "IQ2_S", _QK_K, 82),
    GGMLType(23, "IQ4_XS", _QK_K, 136),
    GGMLType(24, "I8", 1, 1),
    GGMLType(25, "I16", 1, 2),
    GGMLType(26, "I32", 1, 4),
    GGMLType(27, "I64", 1, 8),
    GGMLType(28, "F64", 1, 8),
    GGMLType(29, "IQ1_M", _QK_K, 56),
    GGMLType(30, "BF16", 1, 2),
    GGMLType(34, "TQ1_0", _QK_K, 54),
    GGMLType(35, "TQ2_0", _QK_K, 66),
    GGMLType(39, "MXFP4", 32, 17),
    GGMLType(40, "NVFP4", 64, 36),
    GGMLType(41, "Q1_0", 128, 18),
)}
GGML_TYPES: dict[str, GGMLType] = {t.name: t for t in GGML_TYPES_BY_ID.values()}

# ----------------------------------------------------------------------------- quantization mixes


@dataclass(frozen=True)
class Mix:
    """A llama.cpp quantization mix (`llama_ftype`): the name llama-quantize and the Hub's file
    names use, its `general.file_type` number, the ggml type most tensors get, and every type its
    matrices use (llama-quantize raises some tensors: output and attn_v to Q6_K, say)."""
    name: str
    file_type: int | None  # None: a name the Hub uses with no llama_ftype of its own
    default_type: str
    types: frozenset[str]
    quantizable: bool = False  # llamatui quantize writes it (quantizer/model.py has its rules)


def _mix(name, file_type, default_type, *raised, q=False) -> Mix:
    return Mix(name, file_type, default_type, frozenset((default_type, *raised)), q)


# Best first: llama-quantize's table of perplexity increase (tools/quantize/quantize.cpp).
MIXES: tuple[Mix, ...] = (
    _mix("F32", 0, "F32", q=True),
    _mix("BF16", 32, "BF16", q=True),
    _mix("F16", 1, "F16", q=True),
    _mix("Q8_0", 7, "Q8_0", q=True),
    _mix("Q6_K", 18, "Q6_K", q=True),
    _mix("Q5_K_M", 17, "Q5_K", "Q6_K", q=True),
    _mix("Q5_1", 9, "Q5_1", "Q6_K", q=True),
    _mix("Q5_K_S", 16, "Q5_K", "Q6_K", q=True),
    _mix("Q5_0", 8, "Q5_0", "Q6_K", q=True),
    _mix("Q4_K_M", 15, "Q4_K", "Q6_K", q=True),
    _mix("Q4_K_S", 14, "Q4_K", "Q6_K", q=True),
    _mix("Q4_1", 3, "Q4_1", "Q6_K", q=True),
    _mix("IQ4_NL", 25, "IQ4_NL", "Q6_K", q=True),
    _mix("IQ4_XS", 30, "IQ4_XS", "Q6_K", q=True),
    _mix("Q4_0", 2, "Q4_0", "Q6_K", q=True),
    _mix("MXFP4", 38, "MXFP4", "Q8_0", q=True),  # llama_ftype MXFP4_MOE
    _mix("Q3_K_L", 13, "Q3_K", "Q5_K", "Q6_K", q=True),
    _mix("Q3_K_M", 12, "Q3_K", "Q4_K", "Q6_K", q=True),
    _mix("IQ3_M", 27, "IQ3_S", "Q4_K", "Q6_K", q=True),
    _mix("IQ3_S", 26, "IQ3_S", "Q4_K", "Q6_K", q=True),
    _mix("Q3_K_S", 11, "Q3_K", "Q6_K", q=True),
    _mix("IQ3_XS", 22, "IQ3_S", "IQ3_XXS", "Q4_K", "Q6_K", q=True),
    _mix("IQ3_XXS", 23, "IQ3_XXS", "IQ2_S", "IQ3_S", "Q4_K", "Q5_K", q=True),
    _mix("Q2_K", 10, "Q2_K", "Q3_K", "Q4_K", "Q6_K", q=True),
    _mix("Q2_K_S", 21, "Q2_K", "Q4_K", "Q6_K", q=True),
    _mix("IQ2_M", 29, "IQ2_S", "IQ3_S", "Q4_K", "Q5_K", q=True),
    _mix("IQ2_S", 28, "IQ2_XS", "IQ3_S", "Q4_K", "Q5_K", q=True),  # mostly IQ2_XS, as llama.cpp
    _mix("IQ2_XS", 20, "IQ2_XS", "Q2_K", "Q4_K", "Q5_K", q=True),
    _mix("IQ2_XXS", 19, "IQ2_XXS", "Q2_K", "Q4_K", "Q5_K", q=True),
    _mix("IQ1_M", 31, "IQ1_M", "IQ2_XXS", "Q2_K", "Q4_K", "Q5_K", q=True),
    _mix("IQ1_S", 24, "IQ1_S", "IQ2_XXS", "Q2_K", "Q4_K", "Q5_K", q=True),
    _mix("TQ2_0", 37, "TQ2_0", "Q4_K", "Q6_K", q=True),
    _mix("TQ1_0", 36, "TQ1_0", "Q4_K", "Q6_K", q=True),
)
MIXES_BY_NAME: dict[str, Mix] = {m.name: m for m in MIXES}
# llama-quantize's names where they differ: the short names of the _M mixes, MXFP4's
MIX_ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M", "MXFP4_MOE": "MXFP4"}
MIXES_BY_FILE_TYPE: dict[int, Mix] = {m.file_type: m for m in MIXES if m.file_type is not None}


def mix_name(file_type) -> str:
    """The mix name for a `general.file_type` value: "Q4_K_M", or "type N" / "?"."""
    if file_type is None:
        return "?"
    try:
        mix = MIXES_BY_FILE_TYPE.get(int(file_type))
    except (TypeError, ValueError, OverflowError):
        mix = None
    return mix.name if mix else f"type {file_type}"


# ----------------------------------------------------------------------------- architectures


@dataclass(frozen=True)
class Arch:
    """A model family the engine runs.

    name:          `general.architecture`, also the prefix of its metadata keys
    module:        the file `inference/archs/<module>.py` that holds its forward pass
    title:         how people call it
    rope:          llama_model_rope_type: "norm" (consecutive pairs), "neox" (halves) or "none"
    swa_pattern:   None: llama.cpp gives the family no sliding-window layers (it ignores
                   attention.sliding_window); else the default layer pattern when the file gives
                   none (llama_hparams::set_swa_pattern: layer il slides when il % n < n - 1)
    n_swa:         the window when the file gives none (0: none unless the file sets one)
    rope_base_swa: the RoPE base of sliding-window layers when the file gives none (None: the
                   global rope.freq_base)
    encoder:       bidirectional attention, outputs embeddings (BERT); no text generation
    per_layer_widths: attention.head_count_kv and feed_forward_length may differ between
                   layers (the family reads the arrays itself; HParams keeps the largest)
    """
    name: str
    module: str
    title: str
    rope: str = "norm"
    swa_pattern: int | None = None
    n_swa: int = 0
    rope_base_swa: float | None = None
    encoder: bool = False
    per_layer_widths: bool = False

    def load(self):
        """The family's Architecture object (imports its module, and the kernels, on first use)."""
        return importlib.import_module(f"llamatui.inference.archs.{self.module}").ARCH


ARCHITECTURES: dict[str, Arch] = {a.name: a for a in (
    Arch("llama", "llama", "Llama"),
    Arch("gemma3", "gemma3", "Gemma 3", rope="neox", swa_pattern=6, rope_base_swa=10000.0),
    Arch("gemma4", "gemma4", "Gemma 4", rope="neox", swa_pattern=0, rope_base_swa=10000.0,
         per_layer_widths=True),
    Arch("bert", "bert", "BERT", rope="none", encoder=True),
    Arch("nomic-bert", "nomic_bert", "Nomic BERT", rope="neox", encoder=True),
    Arch("phi3", "phi3", "Phi 3", rope="neox"),
    Arch("gemma2", "gemma2", "Gemma 2", rope="neox", swa_pattern=2, n_swa=4096),
    Arch("olmo2", "olmo2", "OLMo 2", rope="neox", swa_pattern=4),
    Arch("smollm3", "smollm3", "SmolLM3"),
    Arch("granite", "granite", "Granite"),
    Arch("qwen2", "qwen2", "Qwen 2", rope="neox"),
    Arch("qwen3", "qwen3", "Qwen 3", rope="neox"),
    Arch("qwen2moe", "qwen2moe", "Qwen 2 MoE", rope="neox"),
    Arch("qwen3moe", "qwen3moe", "Qwen 3 MoE", rope="neox"),
    Arch("gpt-oss", "gpt_oss", "gpt-oss", rope="neox", swa_pattern=2),
    Arch("qwen35", "qwen35", "Qwen 3.5", rope="neox"),  # IMROPE: NEOX pairs for text
    Arch("qwen35moe", "qwen35moe", "Qwen 3.5 MoE", rope="neox"),
    Arch("mistral3", "mistral3", "Mistral 3"),
)}


class UnsupportedArchitectureError(ValueError):
    """A GGUF file whose `general.architecture` has no forward pass here."""

    def __init__(self, arch):
        self.arch = arch
        super().__init__(f"unsupported model architecture {arch!r}; supported: "
                         f"{', '.join(sorted(ARCHITECTURES))}")

    def __reduce__(self):
        return type(self), (self.arch,)


def get_arch(name) -> Arch:
    """The catalog entry of `general.architecture` = name; UnsupportedArchitectureError if none."""
    try:
        return ARCHITECTURES[name]
    except (KeyError, TypeError):
        raise UnsupportedArchitectureError(name) from None
