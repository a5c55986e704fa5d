"""The GGUF format's constants, its error, and the types of metadata values."""
from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_NESTING = 8
# llama.cpp's LLM_KV_SPLIT_* keys, written as u16, u16 and i32.
SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS_COUNT = "split.no", "split.count", "split.tensors.count"
MAX_SPLITS = 0xFFFF  # split.count is a u16


class GGUFError(ValueError):
    """A file that is not a valid GGUF file, or a tensor in it that cannot be read; the message
    says what is wrong and where."""


class GGUFValueType(IntEnum):
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# Fixed-size value types: struct format and numpy dtype (little-endian).
SCALAR_FORMATS = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H", GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
SCALAR_SIZES = {t: struct.calcsize(f) for t, f in SCALAR_FORMATS.items()}
SCALAR_DTYPES = {t: np.dtype(f) for t, f in SCALAR_FORMATS.items()}
INTEGER_TYPES = frozenset(t for t in SCALAR_FORMATS
                          if t not in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64,
                                       GGUFValueType.BOOL))


@dataclass(frozen=True)
class ValueType:
    """The declared type of a metadata value: `type`, and for arrays the element type (nested
    arrays give a ValueType as element). An array of arrays whose inner arrays differ in type
    has `ValueType(ARRAY)`, without an element type, as its element: each inner array then
    has its own (see infer_value_type)."""
    type: GGUFValueType
    element: ValueType | None = None
