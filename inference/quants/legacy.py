"""The original 32-element block types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (ggml-common.h layouts):
their classes, dequantization kernels here, row quantizers in `legacy_quantize`.

Within a block of 32, element j < 16 comes from the low nibble of quant byte j and element j + 16
from its high nibble; Q5_x take the fifth bit of element j from bit j of a little-endian uint32.
Each kernel's float32 expression is gguf-py's, in gguf-py's order.

Kernel style (all of llamatui.inference.quants): one prange over blocks, and inner loops whose trip
count comes from `out.shape[1]` rather than a literal. With a literal, LLVM unrolls the loop
completely into scalar code; with a run-time count its loop vectorizer takes it.
"""
import numpy as np
from numba import njit, prange

from . import legacy_quantize as rows
from .base import F16_TO_F32, QuantType


@njit(cache=True, inline="always")
def half_at(blocks, i, offset, table):
    """The fp16 at byte `offset` of block `i`, as float32."""
    return table[np.int32(blocks[i, offset]) | (np.int32(blocks[i, offset + 1]) << 8)]


@njit(cache=True, parallel=True)
def q4_0(blocks, table, out):
    # block: d fp16, qs[16]; y = d * (nibble - 8)
    half = out.shape[1] // 2
    for i in prange(blocks.shape[0]):
        d = half_at(blocks, i, 0, table)
        for j in range(half):
            b = np.int32(blocks[i, 2 + j])
            out[i, j] = d * np.float32((b & 0xF) - 8)
            out[i, j + half] = d * np.float32((b >> 4) - 8)


@njit(cache=True, inline="always")
def scaled_plus_min(d, q, m):
    """d * q + m as numpy evaluates it: when both d * q and m are NaN, x86 returns the first
    operand's NaN, but LLVM may swap the operands of a commutative add, so pick it explicitly."""
    p = d * np.float32(q)
    return p if p != p else p + m


@njit(cache=True, parallel=True)
def q4_1(blocks, table, out):
    # block: d fp16, m fp16, qs[16]; y = d * nibble + m
    half = out.shape[1] // 2
    for i in prange(blocks.shape[0]):
        d = half_at(blocks, i, 0, table)
        m = half_at(blocks, i, 2, table)
        for j in range(half):
            b = np.int32(blocks[i, 4 + j])
            out[i, j] = scaled_plus_min(d, b & 0xF, m)
            out[i, j + half] = scaled_plus_min(d, b >> 4, m)


@njit(cache=True, inline="always")
def u32_at(blocks, i, offset):
    """The little-endian uint32 at byte `offset` of block `i` (as a non-negative int64)."""
    return (np.int64(blocks[i, offset]) | (np.int64(blocks[i, offset + 1]) << 8)
            | (np.int64(blocks[i, offset + 2]) << 16) | (np.int64(blocks[i, offset + 3]) << 24))


@njit(cache=True, parallel=True)
def q5_0(blocks, table, out):
    # block: d fp16, qh u32, qs[16]; y = d * ((nibble | high bit << 4) - 16)
    half = out.shape[1] // 2
    for i in prange(blocks.shape[0]):
        d = half_at(blocks, i, 0, table)
        qh = u32_at(blocks, i, 2)
        for j in range(half):
            b = np.int32(blocks[i, 6 + j])
            lo = (b & 0xF) | np.int32(((qh >> j) & 1) << 4)
            hi = (b >> 4) | np.int32(((qh >> (j + half)) & 1) << 4)
            out[i, j] = d * np.float32(lo - 16)
            out[i, j + half] = d * np.float32(hi - 16)


@njit(cache=True, parallel=True)
def q5_1(blocks, table, out):
    # block: d fp16, m fp16, qh u32, qs[16]; y = d * (nibble | high bit << 4) + m
    half = out.shape[1] // 2
    for i in prange(blocks.shape[0]):
        d = half_at(blocks, i, 0, table)
        m = half_at(blocks, i, 2, table)
        qh = u32_at(blocks, i, 4)
        for j in range(half):
            b = np.int32(blocks[i, 8 + j])
            lo = (b & 0xF) | np.int32(((qh >> j) & 1) << 4)
            hi = (b >> 4) | np.int32(((qh >> (j + half)) & 1) << 4)
            out[i, j] = scaled_plus_min(d, lo, m)
            out[i, j + half] = scaled_plus_min(d, hi, m)


@njit(cache=True, parallel=True)
def q8_0(blocks, table, out):
    # block: d fp16, qs[32] int8; y = q * d
    n = out.shape[1]
    for i in prange(blocks.shape[0]):
        d = half_at(blocks, i, 0, table)
        for j in range(n):
            q = (np.int32(blocks[i, 2 + j]) ^ 0x80) - 0x80  # uint8 bits as int8
            out[i, j] = np.float32(q) * d


class _Legacy(QuantType):
    kernel = None  # kernel(blocks, fp16 table, out)

    @classmethod
    def run(cls, blocks, out):
        cls.kernel(blocks, F16_TO_F32, out)


class Q4_0(_Legacy):
    kernel = staticmethod(q4_0)
    row_kernel = staticmethod(rows.q4_0_rows)


class Q4_1(_Legacy):
    kernel = staticmethod(q4_1)
    row_kernel = staticmethod(rows.q4_1_rows)


class Q5_0(_Legacy):
    kernel = staticmethod(q5_0)
    row_kernel = staticmethod(rows.q5_0_rows)


class Q5_1(_Legacy):
    kernel = staticmethod(q5_1)
    row_kernel = staticmethod(rows.q5_1_rows)


class Q8_0(_Legacy):
    kernel = staticmethod(q8_0)
    row_kernel = staticmethod(rows.q8_0_rows)
    uses_imatrix = False
