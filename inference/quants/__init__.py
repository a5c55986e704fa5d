"""Dequantization of ggml tensor types to float32, bit for bit what gguf-py and ggml compute.

    dequantize("Q4_K", raw_bytes, n_elements)  -> float32 vector of n_elements
    dequantize_rows("Q8_0", raw_rows, row_length) -> float32 (..., row_length)
    get_quant_type("Q6_K").dequantize_blocks(blocks)  # (n, type_size) -> (n, block_size)

Every type of `GGML_TYPES` that has no dequantizer here raises `UnsupportedTypeError`.
"""
import numpy as np

from ..catalog import GGML_TYPES
from .base import QuantType
from .floats import BF16, F16, F32
from .iquants import IQ4_NL, IQ4_XS
from .kquants import Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K
from .legacy import Q4_0, Q4_1, Q5_0, Q5_1, Q8_0

# The one registry: ggml type name -> dequantizer class.
QUANT_TYPES: dict[str, type[QuantType]] = {cls.name: cls for cls in (
    F32, F16, BF16,
    Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
    Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K,
    IQ4_NL, IQ4_XS,
)}
SUPPORTED_TYPES: tuple[str, ...] = tuple(QUANT_TYPES)


class UnsupportedTypeError(ValueError):
    """A ggml type (or a name that is none) that llamatui cannot dequantize."""

    def __init__(self, type_name: str):
        self.type_name = type_name
        known = "a ggml type llamatui cannot dequantize" \
            if isinstance(type_name, str) and type_name in GGML_TYPES \
            else "not a known ggml type"
        super().__init__(f"tensor type {type_name!r} is {known}; "
                         f"supported types: {', '.join(SUPPORTED_TYPES)}")

    def __reduce__(self):  # rebuild from the type name, e.g. across a process pool
        return type(self), (self.type_name,)


def get_quant_type(type_name: str) -> type[QuantType]:
    """The dequantizer for `type_name` (with `.block_size`, `.type_size`, `.dequantize_blocks`)."""
    try:
        return QUANT_TYPES[type_name]
    except (KeyError, TypeError):
        raise UnsupportedTypeError(type_name) from None


def _bytes_of(raw: np.ndarray) -> np.ndarray:
    if not isinstance(raw, np.ndarray):
        raise ValueError(f"raw must be a numpy array, got {type(raw).__name__}")
    if raw.ndim == 0:
        raw = raw.reshape(1)
    return np.ascontiguousarray(raw).view(np.uint8)


def _out_view(out: np.ndarray | None, shape: tuple[int, ...], n_blocks: int,
              qt: type[QuantType]) -> np.ndarray | None:
    """The caller's `out` (which must have `shape`) seen as blocks, or None."""
    if out is None:
        return None
    if not isinstance(out, np.ndarray) or out.shape != shape:
        raise ValueError(f"{qt.name}: out must have shape {shape}, got "
                         f"{getattr(out, 'shape', type(out).__name__)}")
    if not out.flags.c_contiguous:
        raise ValueError(f"{qt.name}: out must be C-contiguous")
    return out.reshape(n_blocks, qt.block_size)


def dequantize(type_name: str, raw: np.ndarray, n_elements: int,
               out: np.ndarray | None = None) -> np.ndarray:
    """The `n_elements` float32 values that `raw` (the tensor's bytes, any shape) encodes.

    A new 1-D array, or `out` (float32, shape (n_elements,)) filled in. For F32 without `out`, the
    result is a view on `raw`'s memory (read-only if `raw` is).
    """
    qt = get_quant_type(type_name)
    n_elements = int(n_elements)
    if n_elements < 0 or n_elements % qt.block_size:
        raise ValueError(f"{type_name}: {n_elements} elements is not a whole number of "
                         f"{qt.block_size}-element blocks")
    n_blocks = n_elements // qt.block_size
    data = _bytes_of(raw).reshape(-1)
    if data.size != n_blocks * qt.type_size:
        raise ValueError(f"{type_name}: {n_elements} elements take {n_blocks * qt.type_size} bytes "
                         f"({n_blocks} blocks of {qt.type_size}), but the buffer has {data.size}")
    blocks_out = _out_view(out, (n_elements,), n_blocks, qt)
    result = qt.dequantize_blocks(data.reshape(n_blocks, qt.type_size), blocks_out)
    return out if out is not None else result.reshape(-1)


def dequantize_rows(type_name: str, raw: np.ndarray, row_length: int,
                    out: np.ndarray | None = None) -> np.ndarray:
    """Rows of `row_length` values from `raw` of shape (..., row_bytes): float32 (..., row_length).

    Handy for picking embedding rows out of a quantized matrix: `dequantize_rows(t, rows[ids], n)`.
    `out`, when given, must have the result's shape and is filled in.
    """
    qt = get_quant_type(type_name)
    row_length = int(row_length)
    if row_length <= 0 or row_length % qt.block_size:
        raise ValueError(f"{type_name}: a row of {row_length} elements is not a whole number of "
                         f"{qt.block_size}-element blocks")
    data = _bytes_of(raw)
    row_bytes = row_length // qt.block_size * qt.type_size
    if data.shape[-1] != row_bytes:
        raise ValueError(f"{type_name}: a row of {row_length} elements takes {row_bytes} bytes, "
                         f"but the buffer's rows have {data.shape[-1]}")
    shape = (*data.shape[:-1], row_length)
    n_blocks = data.size // qt.type_size
    blocks_out = _out_view(out, shape, n_blocks, qt)
    result = qt.dequantize_blocks(data.reshape(n_blocks, qt.type_size), blocks_out)
    return out if out is not None else result.reshape(shape)


__all__ = ["QUANT_TYPES", "SUPPORTED_TYPES", "QuantType", "UnsupportedTypeError", "dequantize",
           "dequantize_rows", "get_quant_type"]
