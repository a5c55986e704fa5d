"""The row quantizers by ggml type name, and `quantize`, which writes ggml's bytes for rows.

`quantize(type, rows, imatrix)` has ggml_quantize_chunk's semantics: with an importance matrix the
types that take one use ggml's importance-weighted paths, and F16, BF16 and Q8_0 ignore it.

The numba kernels are serial and release the GIL; large inputs are cut into batches of whole rows
run on a thread pool. Rows never depend on each other, so the bytes do not depend on the number of
threads. (Serial kernels on threads rather than numba's prange: the same speed here, and half the
first-run compile time.)
"""
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from llamatui.inference.catalog import GGML_TYPES
from llamatui.quantizer import iquants, kquants, legacy
from llamatui.quantizer.floats import fp32_to_bf16_bits, fp32_to_fp16_bits


class RowQuantizer(ABC):
    """Quantizes whole rows of one ggml type (each row a whole number of blocks)."""

    name = ""
    uses_imatrix = True  # whether an importance matrix changes the result

    @property
    def ggml_type(self):
        return GGML_TYPES[self.name]

    @abstractmethod
    def quantize_rows(self, rows: np.ndarray, imatrix: np.ndarray | None, out: np.ndarray) -> None:
        """Write the bytes of float32 ``rows`` into ``out`` (n_rows, row_bytes)."""


_MIN_VALUES_PER_BATCH = 1 << 16  # below this a thread costs more than it saves


def run_in_batches(kernel, rows, qw, use_qw, out):
    """Run ``kernel(rows[a:b], qw, use_qw, out[a:b])`` over batches of rows on numba's thread count."""
    n_rows = rows.shape[0]
    n_batches = min(n_rows, max(1, rows.size // _MIN_VALUES_PER_BATCH), 4 * numba.config.NUMBA_NUM_THREADS)
    workers = min(n_batches, numba.config.NUMBA_NUM_THREADS)
    if workers <= 1:
        kernel(rows, qw, use_qw, out)
        return
    bounds = np.linspace(0, n_rows, n_batches + 1).astype(np.int64)
    with ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(kernel, rows[a:b], qw, use_qw, out[a:b])
                   for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        for future in futures:
            future.result()


class _KernelQuantizer(RowQuantizer):
    """A type whose rows go through a numba kernel ``kernel(rows, imatrix, use_imatrix, out)``."""

    kernel = None

    def quantize_rows(self, rows, imatrix, out):
        use_qw = imatrix is not None and self.uses_imatrix
        qw = imatrix if use_qw else np.zeros(0, np.float32)
        run_in_batches(type(self).kernel, rows, qw, use_qw, out)


class F16(RowQuantizer):
    name = "F16"
    uses_imatrix = False

    def quantize_rows(self, rows, imatrix, out):
        out.view(np.uint16)[...] = fp32_to_fp16_bits(rows)


class BF16(RowQuantizer):
    name = "BF16"
    uses_imatrix = False

    def quantize_rows(self, rows, imatrix, out):
        out.view(np.uint16)[...] = fp32_to_bf16_bits(rows)


class Q4_0(_KernelQuantizer):
    name = "Q4_0"
    kernel = legacy.q4_0_rows


class Q4_1(_KernelQuantizer):
    name = "Q4_1"
    kernel = legacy.q4_1_rows


class Q5_0(_KernelQuantizer):
    name = "Q5_0"
    kernel = legacy.q5_0_rows


class Q5_1(_KernelQuantizer):
    name = "Q5_1"
    kernel = legacy.q5_1_rows


class Q8_0(_KernelQuantizer):
    name = "Q8_0"
    uses_imatrix = False
    kernel = legacy.q8_0_rows


class Q2_K(_KernelQuantizer):
    name = "Q2_K"
    kernel = kquants.q2_k_rows


class Q3_K(_KernelQuantizer):
    name = "Q3_K"
    kernel = kquants.q3_k_rows


class Q4_K(_KernelQuantizer):
    name = "Q4_K"
    kernel = kquants.q4_k_rows


class Q5_K(_KernelQuantizer):
    name = "Q5_K"
    kernel = kquants.q5_k_rows


class Q6_K(_KernelQuantizer):
    name = "Q6_K"
    kernel = kquants.q6_k_rows


class IQ4_NL(_KernelQuantizer):
    name = "IQ4_NL"
    kernel = iquants.iq4_nl_rows


class IQ4_XS(_KernelQuantizer):
    name = "IQ4_XS"
    kernel = iquants.iq4_xs_rows


QUANTIZERS: dict[str, RowQuantizer] = {q.name: q for q in (
    F16(), BF16(), Q4_0(), Q4_1(), Q5_0(), Q5_1(), Q8_0(),
    Q2_K(), Q3_K(), Q4_K(), Q5_K(), Q6_K(), IQ4_NL(), IQ4_XS(),
)}


def quantize(type_name: str, rows_f32: np.ndarray, imatrix: np.ndarray | None = None) -> np.ndarray:
    """Quantize ``rows_f32`` (n_rows, n_cols) to ggml type ``type_name``, byte for byte as ggml's
    ggml_quantize_chunk does; returns uint8 (n_rows, row_bytes).

    ``imatrix`` (n_cols,) holds per-column importance weights (llama-imatrix's averages).
    """
    quantizer = QUANTIZERS.get(type_name)
    if quantizer is None:
        raise ValueError(f"cannot quantize to {type_name!r}: supported types are {', '.join(QUANTIZERS)}")
    rows = np.asarray(rows_f32)
    if rows.ndim != 2:
        raise ValueError(f"rows must be a 2-D array (n_rows, n_cols), got shape {rows.shape}")
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    n_rows, n_cols = rows.shape
    gtype = quantizer.ggml_type
    if n_cols % gtype.block_size:
        raise ValueError(f"{type_name} quantizes blocks of {gtype.block_size} values: a row of {n_cols} "
                         f"is not a multiple of {gtype.block_size}")
    if imatrix is not None:
        imatrix = np.ascontiguousarray(imatrix, dtype=np.float32)
        if imatrix.shape != (n_cols,):
            raise ValueError(f"imatrix must have shape ({n_cols},) to match the rows, got {imatrix.shape}")
    out = np.empty((n_rows, gtype.row_bytes(n_cols)), dtype=np.uint8)
    if n_rows and n_cols:
        quantizer.quantize_rows(rows, imatrix, out)
    return out
