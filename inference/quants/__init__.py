"""ggml's tensor types, one class per type (as gguf-py's quants.py): dequantization bit for bit what
gguf-py and ggml compute, quantization byte for byte what ggml_quantize_chunk writes, and the
backends' kernels registered against each type.

    dequantize("Q4_K", raw_bytes, n_elements)      -> float32 vector of n_elements
    dequantize_rows("Q8_0", raw_rows, row_length)  -> float32 (..., row_length)
    quantize("Q4_K", rows_f32, imatrix=None)       -> uint8 (n_rows, row_bytes)
    get_quant_type("Q6_K").dequantize_blocks(blocks)  # (n, type_size) -> (n, block_size)
    kernels_of("cuda")                             -> {type name: that backend's kernels}

Every module of this package is imported here, so a type's file is all it takes to add it: the
class registers itself in QUANT_TYPES (base.QuantType); the catalog line of its geometry already
exists. Every type of `GGML_TYPES` without a class here raises `UnsupportedTypeError`.

Modules: `base` (the class every type derives from), `floats`, `legacy`, `kquants`, `iquants`
(the types, with their dequantization kernels), `*_quantize` (their ggml quantize_row_* kernels),
`numeric` and `search` (ggml's float32 rounding and scale searches), `fp16` (fp16 conversions).
Numba's on-disk cache (cache=True) checks each kernel's own file only: after editing `numeric.py`,
`search.py` or `fp16.py`, touch the modules that use them (or clear __pycache__).
"""
import importlib
import pkgutil

import numpy as np

from ..catalog import GGML_TYPES
from .base import QUANT_TYPES, QuantType


def _load_types() -> None:
    """Import every module of the package (each type's class registers itself on definition),
    then put QUANT_TYPES in ggml's order (by type id)."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    for name in sorted(QUANT_TYPES, key=lambda name: GGML_TYPES[name].id):
        QUANT_TYPES[name] = QUANT_TYPES.pop(name)


_load_types()

SUPPORTED_TYPES: tuple[str, ...] = tuple(QUANT_TYPES)
# The types `quantize` writes.
QUANTIZERS: dict[str, type[QuantType]] = {
    name: qt for name, qt in QUANT_TYPES.items() if qt.row_kernel is not None}


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
    """The class of `type_name` (with `.block_size`, `.type_size`, `.dequantize_blocks`...)."""
    try:
        return QUANT_TYPES[type_name]
    except (KeyError, TypeError):
        raise UnsupportedTypeError(type_name) from None


def kernels_of(backend: str) -> dict[str, object]:
    """Type name -> `backend`'s kernels, for every type the backend registered (in ggml's order;
    complete once the backend's kernel modules are imported)."""
    return {name: qt.kernels[backend] for name, qt in QUANT_TYPES.items() if backend in qt.kernels}


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


def quantize(type_name: str, rows_f32: np.ndarray, imatrix: np.ndarray | None = None) -> np.ndarray:
    """Quantize `rows_f32` (n_rows, n_cols) to ggml type `type_name`, byte for byte as ggml's
    ggml_quantize_chunk does; returns uint8 (n_rows, row_bytes).

    `imatrix` (n_cols,) holds per-column importance weights (llama-imatrix's averages); the types
    that take one use ggml's importance-weighted paths, F16, BF16 and Q8_0 ignore it.
    """
    qt = QUANTIZERS.get(type_name)
    if qt is None:
        raise ValueError(f"cannot quantize to {type_name!r}: supported types are "
                         f"{', '.join(QUANTIZERS)}")
    rows = np.asarray(rows_f32)
    if rows.ndim != 2:
        raise ValueError(f"rows must be a 2-D array (n_rows, n_cols), got shape {rows.shape}")
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    n_rows, n_cols = rows.shape
    if n_cols % qt.block_size:
        raise ValueError(f"{type_name} quantizes blocks of {qt.block_size} values: a row of "
                         f"{n_cols} is not a multiple of {qt.block_size}")
    if imatrix is not None:
        imatrix = np.ascontiguousarray(imatrix, dtype=np.float32)
        if imatrix.shape != (n_cols,):
            raise ValueError(f"imatrix must have shape ({n_cols},) to match the rows, got "
                             f"{imatrix.shape}")
    out = np.empty((n_rows, n_cols // qt.block_size * qt.type_size), dtype=np.uint8)
    if n_rows and n_cols:
        qt.quantize_rows(rows, imatrix, out)
    return out


__all__ = ["QUANT_TYPES", "QUANTIZERS", "SUPPORTED_TYPES", "QuantType", "UnsupportedTypeError",
           "dequantize", "dequantize_rows", "get_quant_type", "kernels_of", "quantize"]
