"""TQ1_0 and TQ2_0, ggml's ternary types (BitNet b1.58, TriLMs): their classes, dequantization and
row quantizers (small enough to share one module). Every value is d * t, t in {-1, 0, 1}.

TQ1_0 (ggml-common.h block_tq1_0): qs[48] (5 trits a byte), qh[4] (4 trits a byte), d fp16. A
byte holds its trits as a fraction of 3**5 = 243 scaled to 256: trit n of byte b is
((b * 3**n) & 0xFF) * 3 >> 8. Values 0..159: trit n of qs[m] is value 32n + m (m < 32); values
160..239: trit n of qs[32 + m] is value 160 + 16n + m (m < 16); values 240..255: trit n of qh[j]
is value 240 + 4n + j.
TQ2_0 (block_tq2_0): qs[64], d fp16; value 128h + 32l + m is bits 2l..2l+1 of qs[32h + m], minus 1.

Quantizing (quantize_row_tq1_0_ref / tq2_0_ref): d = the block's largest |x|, t = lroundf(x / d)
(x times 1/d in float32). ggml_quantize_chunk ignores importance weights for both.
"""
import numpy as np
from numba import njit, prange

from ..catalog import GGML_TYPES
from .base import F16_TO_F32, QuantType
from .legacy import half_at
from .numeric import F0, F1, fp32_to_fp16, put_u16, round_away

QK = GGML_TYPES["TQ1_0"].block_size
TQ1_BYTES, TQ2_BYTES = GGML_TYPES["TQ1_0"].type_size, GGML_TYPES["TQ2_0"].type_size
# block_tq1_0's fields (ggml-common.h): qs (5 trits a byte), qh (4 trits a byte), d; qs's first
# 32 bytes hold values 0..159, its last 16 values 160..239, qh values 240..255
TQ1_QS = (QK - 4 * QK // 64) // 5
TQ1_QH = QK // 64
TQ1_D = TQ1_QS + TQ1_QH
TQ1_V32 = 5 * 32  # values in qs's 32-byte part
TQ1_V16 = TQ1_V32 + 5 * 16  # ... and up to the end of its 16-byte part
TQ2_QS = QK // 4  # block_tq2_0: qs (4 values a byte), d
POW3 = np.array([1, 3, 9, 27, 81, 243], dtype=np.int32)  # ggml's pow3
POW3.flags.writeable = False
_LONG_OVERFLOW = np.float32(2.0 ** 63)  # lroundf's range (a long)


@njit(cache=True, inline="always")
def trit(b, n):
    """Trit n (0, 1, 2) of a TQ1_0 byte: ((uint8)(b * 3**n) * 3) >> 8."""
    return (((b * POW3[n]) & 0xFF) * 3) >> 8


@njit(cache=True, parallel=True)
def tq1_0(blocks, table, out):
    for i in prange(blocks.shape[0]):
        d = half_at(blocks, i, TQ1_D, table)
        for n in range(5):
            for m in range(32):
                out[i, 32 * n + m] = np.float32(trit(np.int32(blocks[i, m]), n) - 1) * d
        for n in range(5):
            for m in range(16):
                q = trit(np.int32(blocks[i, 32 + m]), n)
                out[i, TQ1_V32 + 16 * n + m] = np.float32(q - 1) * d
        for n in range(4):
            for j in range(TQ1_QH):
                q = trit(np.int32(blocks[i, TQ1_QS + j]), n)
                out[i, TQ1_V16 + TQ1_QH * n + j] = np.float32(q - 1) * d


@njit(cache=True, parallel=True)
def tq2_0(blocks, table, out):
    for i in prange(blocks.shape[0]):
        d = half_at(blocks, i, TQ2_QS, table)
        for h in range(2):
            for pair in range(4):
                for m in range(32):
                    q = (np.int32(blocks[i, 32 * h + m]) >> (2 * pair)) & 3
                    out[i, 128 * h + 32 * pair + m] = np.float32(q - 1) * d


# ----------------------------------------------------------------------------- quantizing


@njit(cache=True, error_model="numpy")
def block_scale(xb):
    """(fp16 bits of d, 1/d or 0): d = MAX(amax, fabsf(v)) over the block, as ggml's macro takes it
    (a NaN is kept only until the next value)."""
    amax = F0
    for j in range(QK):
        v = abs(xb[j])
        amax = amax if amax > v else v
    return fp32_to_fp16(amax), np.float32(F1 / amax) if amax != F0 else F0


@njit(cache=True, error_model="numpy")
def ternary(x, idd):
    """`(int)lroundf(x * id) + 1`: 0, 1, 2, or what x86 gives out of range (lroundf of NaN or
    of +-inf, where d is tiny, is LONG_MIN, whose low 32 bits are 0)."""
    v = np.float32(x * idd)
    if not abs(v) < _LONG_OVERFLOW:
        return 1
    return int(round_away(v)) + 1


@njit(cache=True, error_model="numpy")
def pack5(xb, start, stride, idd):
    """Five trits (values start + n * stride) as one byte: base 3, the first the most significant,
    then scaled to 256 rounding up (ggml's ceiling division by 243)."""
    q = 0
    for n in range(5):
        q = (q * 3 + ternary(xb[start + n * stride], idd)) & 0xFF
    return (q * 256 + 242) // 243


@njit(cache=True, error_model="numpy")
def tq1_0_row(x, out):
    for ib in range(x.shape[0] // QK):
        xb = x[QK * ib:QK * ib + QK]
        o = TQ1_BYTES * ib
        h, idd = block_scale(xb)
        put_u16(out, o + TQ1_D, h)
        for m in range(32):
            out[o + m] = pack5(xb, m, 32, idd)
        for m in range(16):
            out[o + 32 + m] = pack5(xb, TQ1_V32 + m, 16, idd)
        for j in range(TQ1_QH):
            q = 0
            for n in range(4):
                q = (q * 3 + ternary(xb[TQ1_V16 + j + TQ1_QH * n], idd)) & 0xFF
            q = (q * 3) & 0xFF  # the first trit to the most significant place
            out[o + TQ1_QS + j] = (q * 256 + 242) // 243


@njit(cache=True, error_model="numpy")
def tq2_0_row(x, out):
    for ib in range(x.shape[0] // QK):
        xb = x[QK * ib:QK * ib + QK]
        o = TQ2_BYTES * ib
        h, idd = block_scale(xb)
        put_u16(out, o + TQ2_QS, h)
        for j in range(0, TQ2_QS, 32):
            for m in range(32):
                q = 0
                for n in range(4):
                    q += (ternary(xb[4 * j + m + 32 * n], idd) & 3) << (2 * n)
                out[o + j + m] = q & 0xFF


@njit(cache=True, nogil=True, error_model="numpy")
def tq1_0_rows(x, qw, use_qw, out):
    for r in range(x.shape[0]):
        tq1_0_row(x[r], out[r])


@njit(cache=True, nogil=True, error_model="numpy")
def tq2_0_rows(x, qw, use_qw, out):
    for r in range(x.shape[0]):
        tq2_0_row(x[r], out[r])


class TQ1_0(QuantType):
    row_kernel = staticmethod(tq1_0_rows)
    uses_imatrix = False  # quantize_tq1_0 ignores quant_weights

    @staticmethod
    def run(blocks, out):
        tq1_0(blocks, F16_TO_F32, out)


class TQ2_0(QuantType):
    row_kernel = staticmethod(tq2_0_rows)
    uses_imatrix = False  # quantize_tq2_0 ignores quant_weights

    @staticmethod
    def run(blocks, out):
        tq2_0(blocks, F16_TO_F32, out)
