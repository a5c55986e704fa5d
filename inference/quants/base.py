"""What every ggml type's class shares: its geometry from the catalog, its place in QUANT_TYPES,
dequantization of blocks, quantization of rows, and the backends' kernels registered against it.

A type is a class named after it (`class Q4_0(QuantType)`, see gguf-py's quants.py): subclassing
registers it in QUANT_TYPES with `block_size` / `type_size` read from `catalog.GGML_TYPES`.

- Dequantizing: the class's `run(blocks, out)` fills a `(n_blocks, block_size)` float32 matrix
  from a `(n_blocks, type_size)` uint8 one. The arithmetic lives in small numba kernels beside
  each class; every kernel receives its blocks as a read-only C-contiguous uint8 matrix and
  writes into a writable C-contiguous float32 matrix, so numba compiles one specialization per
  kernel whoever calls it (read-only and writable arrays are distinct types to numba, and an
  mmap'd model is read-only). Results are bit for bit those of gguf-py's
  `gguf.quants.dequantize` (and ggml's `dequantize_row_*`): float32 arithmetic in the same order,
  no fast-math, so no fused multiply-adds.
- Quantizing: `row_kernel(rows, imatrix, use_imatrix, out)`, ggml's quantize_row_* for a batch of
  rows (serial numba, GIL released); `quantize_rows` spreads batches over threads.
- Backends: a backend's kernel modules call `register_kernels(backend, kernels)` for each type
  they compute ("cpu", "cpu_int8", "cpu_packed", "cuda"); `quants.kernels_of(backend)` lists them,
  and what the engine computes is derived from that.
"""
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from ..catalog import GGML_TYPES

# Below this many elements a kernel runs on the calling thread alone: waking the pool's other
# threads costs more than they save, and on a busy machine a descheduled worker can stall a
# one-row embedding lookup for milliseconds.
SERIAL_BELOW = 1 << 16
# Rows are quantized in batches of at least this many values (below, a thread costs more than
# it saves).
MIN_VALUES_PER_BATCH = 1 << 16

# fp16 -> fp32 for every one of the 65536 half bit patterns, made by numpy's own conversion (the
# one gguf-py uses), so subnormals, infinities and NaN payloads come out identical. 256 KiB: it
# stays in cache while a kernel looks up one or two scales per block.
F16_TO_F32 = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
F16_TO_F32.flags.writeable = False

# The 16 non-linear levels of IQ4_NL and IQ4_XS (ggml's kvalues_iq4nl).
IQ4_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                      dtype=np.float32)
IQ4_LEVELS.flags.writeable = False

# The one registry: ggml type name -> its class (filled by subclassing QuantType).
QUANT_TYPES: dict[str, type["QuantType"]] = {}


class QuantType:
    """Base of the type classes; a subclass names its ggml type: `class Q4_0(QuantType)` (a name
    starting with `_` marks an intermediate base shared by several types)."""

    name: str
    block_size: int  # elements per block
    type_size: int  # bytes per block
    kernels: dict[str, object]  # backend -> its kernels for this type (see register_kernels)
    uses_imatrix = True  # whether an importance matrix changes what row_kernel writes
    row_kernel = None  # row_kernel(rows, imatrix, use_imatrix, out); None: not quantizable

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__name__.startswith("_"):  # a shared intermediate base, not a ggml type
            return
        ggml = GGML_TYPES[cls.__name__]
        cls.name = ggml.name
        cls.block_size = ggml.block_size
        cls.type_size = ggml.type_size
        cls.kernels = {}
        QUANT_TYPES[cls.name] = cls

    def __init__(self):
        raise TypeError("type classes are used through their classmethods, not instances")

    @classmethod
    def span(cls, n_values: int) -> tuple[int, int]:
        """(values, bytes) of a kernel's step over a row: whole blocks holding `n_values` values,
        or one block when a block is longer (Q4_0.span(64) == (64, 36), Q4_K.span(64) ==
        (256, 144), F16.span(32) == (32, 64))."""
        values = max(n_values, cls.block_size)
        if values % cls.block_size:
            raise ValueError(f"{cls.name}: {n_values} values are not whole blocks")
        return values, values // cls.block_size * cls.type_size

    @classmethod
    def register_kernels(cls, backend: str, kernels):
        """Record `backend`'s kernels for this type (called by the backend's kernel modules when
        they are imported); returns them."""
        cls.kernels[backend] = kernels
        return kernels

    # ------------------------------------------------------------------------- dequantizing

    @classmethod
    def as_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        """`blocks` checked, as the read-only C-contiguous uint8 matrix that kernels take."""
        if not isinstance(blocks, np.ndarray) or blocks.dtype != np.uint8:
            raise ValueError(f"{cls.name}: blocks must be a uint8 array, got "
                             f"{getattr(blocks, 'dtype', type(blocks).__name__)}")
        if blocks.ndim != 2 or blocks.shape[1] != cls.type_size:
            raise ValueError(f"{cls.name}: blocks must have shape (n_blocks, {cls.type_size}), "
                             f"got {blocks.shape}")
        view = np.ascontiguousarray(blocks).view(np.ndarray)  # a memmap is a plain array to numba
        view.flags.writeable = False
        return view

    @classmethod
    def out_for(cls, n_blocks: int, out: np.ndarray | None) -> np.ndarray:
        """A fresh (n_blocks, block_size) float32 result, or the caller's `out` once checked."""
        shape = (n_blocks, cls.block_size)
        if out is None:
            return np.empty(shape, dtype=np.float32)
        if not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.shape != shape \
                or not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError(f"{cls.name}: out must be a writable C-contiguous float32 array of "
                             f"shape {shape}, got {getattr(out, 'dtype', type(out).__name__)} "
                             f"{getattr(out, 'shape', '')}")
        return out

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """(n_blocks, type_size) uint8 -> (n_blocks, block_size) float32 (written into `out` when
        given: reusing a buffer spares the page faults of a fresh one, a large share of the time
        of a large tensor)."""
        blocks = cls.as_blocks(blocks)
        out = cls.out_for(blocks.shape[0], out)
        if out.size >= SERIAL_BELOW:
            cls.run(blocks, out)
        elif out.size:
            n_threads = numba.get_num_threads()  # per calling thread in numba
            numba.set_num_threads(1)
            try:
                cls.run(blocks, out)
            finally:
                numba.set_num_threads(n_threads)
        return out

    @staticmethod
    def run(blocks: np.ndarray, out: np.ndarray) -> None:
        """Fill `out` from `blocks` (both checked); each type defines it."""
        raise NotImplementedError

    # ------------------------------------------------------------------------- quantizing

    @classmethod
    def quantize_rows(cls, rows: np.ndarray, imatrix: np.ndarray | None, out: np.ndarray) -> None:
        """Write ggml's bytes for float32 `rows` (n_rows, n_cols, C-contiguous) into `out`
        (n_rows, row_bytes). An importance matrix (n_cols,) is passed on only to the types it
        changes (ggml_quantize_chunk ignores it for F16, BF16 and Q8_0)."""
        use_imatrix = imatrix is not None and cls.uses_imatrix
        qw = imatrix if use_imatrix else np.zeros(0, np.float32)
        run_in_batches(cls.row_kernel, rows, qw, use_imatrix, out)


def run_in_batches(kernel, rows, qw, use_qw, out) -> None:
    """`kernel(rows[a:b], qw, use_qw, out[a:b])` over batches of rows on numba's thread count.

    The kernels are serial and release the GIL, so batches run on a thread pool (as fast as
    numba's prange, for less first-run compile time). Rows never depend on each
    other: the bytes do not depend on the number of threads."""
    n_rows = rows.shape[0]
    n_threads = numba.config.NUMBA_NUM_THREADS
    n_batches = min(n_rows, max(1, rows.size // MIN_VALUES_PER_BATCH), 4 * n_threads)
    workers = min(n_batches, n_threads)
    if workers <= 1:
        kernel(rows, qw, use_qw, out)
        return
    bounds = np.linspace(0, n_rows, n_batches + 1).astype(np.int64)
    with ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(kernel, rows[a:b], qw, use_qw, out[a:b])
                   for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        for future in futures:
            future.result()
