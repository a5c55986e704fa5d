"""Unquantized types: F32 (returned as is), F16 and BF16 (widened to float32 exactly)."""
import numpy as np
from numba import njit, prange

from .base import F16_TO_F32, QuantType


@njit(cache=True, parallel=True)
def f16_to_f32(halves, table, out):
    """halves: read-only uint16 vector; out: float32 vector of the same length."""
    for i in prange(halves.shape[0]):
        out[i] = table[halves[i]]


@njit(cache=True, parallel=True)
def bf16_to_f32(halves, out_bits):
    """bfloat16 is the top half of a float32: shift its bits into place (NaN payloads kept)."""
    for i in prange(halves.shape[0]):
        out_bits[i] = np.uint32(halves[i]) << np.uint32(16)


def _halves(blocks: np.ndarray) -> np.ndarray:
    return blocks.reshape(-1).view(np.uint16)


class F32(QuantType):
    @classmethod
    def dequantize_blocks(cls, blocks, out=None):
        # No arithmetic: without `out`, a view on the caller's bytes, like gguf-py (read-only if
        # they are).
        blocks = cls.as_blocks(blocks)
        if out is None:
            return blocks.view(np.float32)
        out = cls.out_for(blocks.shape[0], out)
        out.view(np.uint8)[...] = blocks  # bytes, so NaN payloads are kept as they are
        return out


class F16(QuantType):
    @staticmethod
    def run(blocks, out):
        f16_to_f32(_halves(blocks), F16_TO_F32, out.reshape(-1))


class BF16(QuantType):
    @staticmethod
    def run(blocks, out):
        bf16_to_f32(_halves(blocks), out.reshape(-1).view(np.uint32))
