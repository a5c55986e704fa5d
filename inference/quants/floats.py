"""Unquantized types: F32 (returned as is), F16 and BF16 (widened to float32 exactly, and rounded
from float32 exactly like ggml: vectorized numpy, no search involved)."""
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


def fp32_to_fp16_bits(x: np.ndarray) -> np.ndarray:
    """ggml_compute_fp32_to_fp16 on an array: round to nearest even, overflow to inf, NaN to a
    quiet NaN (0x7E00 with the sign)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    with np.errstate(over="ignore"):
        base = (np.abs(x) * np.float32(2.0 ** 112)) * np.float32(2.0 ** -110)
    w = x.view(np.uint32)
    shl1_w = w + w  # uint32 arithmetic wraps like C's
    sign = w & np.uint32(0x80000000)
    bias = np.maximum(shl1_w & np.uint32(0xFF000000), np.uint32(0x71000000))
    base = ((bias >> np.uint32(1)) + np.uint32(0x07800000)).view(np.float32) + base
    bits = base.view(np.uint32)
    nonsign = ((bits >> np.uint32(13)) & np.uint32(0x7C00)) + (bits & np.uint32(0x0FFF))
    nonsign = np.where(shl1_w > np.uint32(0xFF000000), np.uint32(0x7E00), nonsign)
    return ((sign >> np.uint32(16)) | nonsign).astype(np.uint16)


def fp32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """ggml_compute_fp32_to_bf16 on an array: round to nearest even; NaN kept and made quiet."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    is_nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    quiet_nan = (u >> np.uint32(16)) | np.uint32(64)
    return np.where(is_nan, quiet_nan, rounded).astype(np.uint16)


def f16_rows(rows, imatrix, use_imatrix, out):
    """ggml_fp32_to_fp16_row on a batch of rows (the importance matrix does not apply)."""
    out.view(np.uint16)[...] = fp32_to_fp16_bits(rows)


def bf16_rows(rows, imatrix, use_imatrix, out):
    """ggml_fp32_to_bf16_row on a batch of rows (the importance matrix does not apply)."""
    out.view(np.uint16)[...] = fp32_to_bf16_bits(rows)


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
    uses_imatrix = False
    row_kernel = staticmethod(f16_rows)

    @staticmethod
    def run(blocks, out):
        f16_to_f32(_halves(blocks), F16_TO_F32, out.reshape(-1))


class BF16(QuantType):
    uses_imatrix = False
    row_kernel = staticmethod(bf16_rows)

    @staticmethod
    def run(blocks, out):
        bf16_to_f32(_halves(blocks), out.reshape(-1).view(np.uint32))
