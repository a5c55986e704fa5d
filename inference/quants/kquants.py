"""K-quants: 256-element super-blocks of 16 or 8 sub-blocks (ggml-common.h layouts): their
classes, dequantization kernels here, row quantizers in `kquants_quantize` (Q8_K has none: ggml
makes it only from activations).

Bit layouts, for element e of a super-block:
  Q2_K  2-bit q: byte 32*(e//128) + e%32 of qs, bits 2*((e%128)//32); sub-block e//16.
  Q3_K  as Q2_K, minus 4 unless bit e//32 of hmask[e%32] is set; 6-bit scales packed in 12 bytes.
  Q4_K  4-bit q: byte 32*(e//64) + e%32 of qs, nibble (e//32)%2; sub-block e//32, 6-bit scale/min.
  Q5_K  as Q4_K plus bit e//32 of qh[e%32] as the fifth bit.
  Q6_K  low 4 bits: ql[64*(e//128) + e%64], nibble (e%128)//64; high 2 bits: qh[32*(e//128) + e%32],
        bits 2*((e%128)//32); minus 32; int8 scale per sub-block e//16.
  Q8_K  float32 d, int8 qs[256], int16 bsums[16] (bsums are only used by dot products).
Float32 arithmetic in gguf-py's order: scale = d * sub-scale first, then scale * q (- dmin * min).
Inner loops run to a length taken from `out.shape[1]` so that LLVM vectorizes them (see legacy.py).
"""
import numpy as np
from numba import njit, prange

from . import kquants_quantize as rows
from .base import F16_TO_F32, QuantType
from .legacy import half_at


@njit(cache=True, parallel=True)
def q2_k(blocks, table, out):
    # block: scales[16] (low nibble scale, high nibble min), qs[64], d fp16, dmin fp16
    sub = out.shape[1] // 16
    for i in prange(blocks.shape[0]):
        d = half_at(blocks, i, 80, table)
        dmin = half_at(blocks, i, 82, table)
        for s in range(16):
            sc = np.int32(blocks[i, s])
            dl = d * np.float32(sc & 0xF)
            ml = dmin * np.float32(sc >> 4)
            base = 16 + 32 * (s // 8) + 16 * (s % 2)
            shift = 2 * ((s % 8) // 2)
            for t in range(sub):
                q = (np.int32(blocks[i, base + t]) >> shift) & 3
                out[i, sub * s + t] = dl * np.float32(q) - ml


@njit(cache=True, inline="always")
def q3_k_scale(blocks, i, k):
    """Sub-block k's 6-bit scale, minus 32: low 4 bits from bytes 96..103, high 2 from 104..107."""
    if k < 8:
        low = np.int32(blocks[i, 96 + k]) & 0xF
    else:
        low = np.int32(blocks[i, 96 + k - 8]) >> 4
    high = (np.int32(blocks[i, 104 + k % 4]) >> (2 * (k // 4))) & 3
    return (low | (high << 4)) - 32


@njit(cache=True, parallel=True)
def q3_k(blocks, table, out):
    # block: hmask[32], qs[64], scales[12], d fp16
    sub = out.shape[1] // 16
    for i in prange(blocks.shape[0]):
        d = half_at(blocks, i, 108, table)
        for s in range(16):
            dl = d * np.float32(q3_k_scale(blocks, i, s))
            base = 32 + 32 * (s // 8) + 16 * (s % 2)
            shift = 2 * ((s % 8) // 2)
            hbase = 16 * (s % 2)
            hbit = s // 2
            for t in range(sub):
                low = (np.int32(blocks[i, base + t]) >> shift) & 3
                high = (np.int32(blocks[i, hbase + t]) >> hbit) & 1
                out[i, sub * s + t] = dl * np.float32(low - 4 + 4 * high)


@njit(cache=True, inline="always")
def k_scale_min(blocks, i, offset, sb):
    """Sub-block sb's 6-bit scale and min from the 12 bytes at `offset` (Q4_K and Q5_K)."""
    if sb < 4:
        sc = np.int32(blocks[i, offset + sb]) & 63
        mn = np.int32(blocks[i, offset + sb + 4]) & 63
    else:
        packed = np.int32(blocks[i, offset + sb + 4])
        sc = (packed & 0xF) | ((np.int32(blocks[i, offset + sb - 4]) >> 6) << 4)
        mn = (packed >> 4) | ((np.int32(blocks[i, offset + sb]) >> 6) << 4)
    return sc, mn


@njit(cache=True, parallel=True)
def q4_k(blocks, table, out):
    # block: d fp16, dmin fp16, scales[12], qs[128]
    sub = out.shape[1] // 8
    for i in prange(blocks.shape[0]):
        d = half_at(blocks, i, 0, table)
        dmin = half_at(blocks, i, 2, table)
        for sb in range(8):
            sc, mn = k_scale_min(blocks, i, 4, sb)
            dl = d * np.float32(sc)
            ml = dmin * np.float32(mn)
            base = 16 + 32 * (sb // 2)
            shift = 4 * (sb % 2)
            for l in range(sub):
                q = (np.int32(blocks[i, base + l]) >> shift) & 0xF
                out[i, sub * sb + l] = dl * np.float32(q) - ml


@njit(cache=True, parallel=True)
def q5_k(blocks, table, out):
    # block: d fp16, dmin fp16, scales[12], qh[32], qs[128]
    sub = out.shape[1] // 8
    for i in prange(blocks.shape[0]):
        d = half_at(blocks, i, 0, table)
        dmin = half_at(blocks, i, 2, table)
        for sb in range(8):
            sc, mn = k_scale_min(blocks, i, 4, sb)
            dl = d * np.float32(sc)
            ml = dmin * np.float32(mn)
            base = 48 + 32 * (sb // 2)
            shift = 4 * (sb % 2)
            for l in range(sub):
                q = ((np.int32(blocks[i, base + l]) >> shift) & 0xF) \
                    | (((np.int32(blocks[i, 16 + l]) >> sb) & 1) << 4)
                out[i, sub * sb + l] = dl * np.float32(q) - ml


@njit(cache=True, parallel=True)
def q6_k(blocks, table, out):
    # block: ql[128], qh[64], scales[16] int8, d fp16
    sub = out.shape[1] // 16
    for i in prange(blocks.shape[0]):
        d = half_at(blocks, i, 208, table)
        for s in range(16):
            sc = (np.int32(blocks[i, 192 + s]) ^ 0x80) - 0x80
            dl = d * np.float32(sc)
            half = s // 8  # which 128-element half
            r = 16 * (s % 8)  # offset of the sub-block inside its half
            lo_base = 64 * half + r % 64
            lo_shift = 4 * (r // 64)
            hi_base = 128 + 32 * half + r % 32
            hi_shift = 2 * (r // 32)
            for t in range(sub):
                lo = (np.int32(blocks[i, lo_base + t]) >> lo_shift) & 0xF
                hi = (np.int32(blocks[i, hi_base + t]) >> hi_shift) & 3
                out[i, sub * s + t] = dl * np.float32((lo | (hi << 4)) - 32)


@njit(cache=True, parallel=True)
def q8_k(blocks, d, out):
    # block: d float32 (passed in `d`, one per block), qs[256] int8, bsums[16] int16; y = d * q
    n = out.shape[1]
    for i in prange(blocks.shape[0]):
        di = d[i]
        for j in range(n):
            q = (np.int32(blocks[i, 4 + j]) ^ 0x80) - 0x80
            out[i, j] = di * np.float32(q)


class _KQuant(QuantType):
    kernel = None  # kernel(blocks, fp16 table, out)

    @classmethod
    def run(cls, blocks, out):
        cls.kernel(blocks, F16_TO_F32, out)


class Q2_K(_KQuant):
    kernel = staticmethod(q2_k)
    row_kernel = staticmethod(rows.q2_k_rows)


class Q3_K(_KQuant):
    kernel = staticmethod(q3_k)
    row_kernel = staticmethod(rows.q3_k_rows)


class Q4_K(_KQuant):
    kernel = staticmethod(q4_k)
    row_kernel = staticmethod(rows.q4_k_rows)


class Q5_K(_KQuant):
    kernel = staticmethod(q5_k)
    row_kernel = staticmethod(rows.q5_k_rows)


class Q6_K(_KQuant):
    kernel = staticmethod(q6_k)
    row_kernel = staticmethod(rows.q6_k_rows)


class Q8_K(QuantType):
    @staticmethod
    def run(blocks, out):
        # The float32 scale's 4 bytes, copied as bytes (NaN payloads survive), then reinterpreted.
        d = np.ascontiguousarray(blocks[:, :4]).view(np.float32).reshape(-1)
        q8_k(blocks, d, out)
