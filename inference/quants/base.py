"""What every dequantizer shares: its geometry from `GGML_TYPES`, buffer checks, the fp16 table.

A dequantizer is a class named after its ggml type with a `dequantize_blocks(blocks)` classmethod
that turns a `(n_blocks, type_size)` uint8 array into a `(n_blocks, block_size)` float32 array.
The arithmetic lives in small numba kernels beside each class (the class's `run`); every kernel
receives its blocks as a read-only C-contiguous uint8 matrix and writes into a writable
C-contiguous float32 matrix, so numba compiles one specialization per kernel whoever calls it
(read-only and writable arrays are distinct types to numba, and an mmap'd model is read-only).

Results are bit-for-bit those of gguf-py's `gguf.quants.dequantize` (and of ggml's
`dequantize_row_*`): float32 arithmetic in the same order, no fast-math, so no fused
multiply-adds.
"""
import numba
import numpy as np

from ..catalog import GGML_TYPES

# Below this many elements a kernel runs on the calling thread alone: waking the pool's other
# threads costs more than they save, and on a busy machine a descheduled worker can stall a
# one-row embedding lookup for milliseconds.
SERIAL_BELOW = 1 << 16

# fp16 -> fp32 for every one of the 65536 half bit patterns, made by numpy's own conversion (the
# one gguf-py uses), so subnormals, infinities and NaN payloads come out identical. 256 KiB: it
# stays in cache while a kernel looks up one or two scales per block.
F16_TO_F32 = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
F16_TO_F32.flags.writeable = False

# The 16 non-linear levels of IQ4_NL and IQ4_XS (ggml's kvalues_iq4nl).
IQ4_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                      dtype=np.float32)
IQ4_LEVELS.flags.writeable = False


class QuantType:
    """Base of the dequantizer classes; a subclass names its ggml type: `class Q4_0(QuantType)`
    (a name starting with `_` marks an intermediate base shared by several types)."""

    name: str
    block_size: int  # elements per block
    type_size: int  # bytes per block

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__name__.startswith("_"):  # a shared intermediate base, not a ggml type
            return
        ggml = GGML_TYPES[cls.__name__]
        cls.name = ggml.name
        cls.block_size = ggml.block_size
        cls.type_size = ggml.type_size

    def __init__(self):
        raise TypeError("dequantizer classes are used through their classmethods, not instances")

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
        given: reusing a buffer spares the page faults of a fresh one, about half the time of a
        large tensor)."""
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
        """Fill `out` from `blocks` (both checked); each dequantizer defines it."""
        raise NotImplementedError
