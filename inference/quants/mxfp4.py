"""MXFP4 (OCP microscaling FP4, gpt-oss's expert weights): its class, dequantization and row
quantizer (small enough to share one module).

Block of 32 (ggml-common.h block_mxfp4): e (E8M0 exponent byte), qs[16]; element j < 16 is the
low nibble of qs[j], element j + 16 its high nibble. A nibble is an E2M1 value; ggml keeps them
doubled as integers (kvalues_mxfp4, grids.KVALUES_FP4) and halves the scale instead:
y = kvalues_mxfp4[nibble] * e8m0_to_fp32_half(e), both factors exact, so the product rounds once.

Quantizing (quantize_row_mxfp4_ref): e = floor(log2(amax)) - 2 + 127, so that amax lands near the
top level (12 halves: 6), then each value takes the first level nearest to it. ggml_quantize_chunk
runs that whether or not importance weights are given (quantize_mxfp4 ignores them).
"""
import numpy as np
from numba import njit, prange

from ..catalog import GGML_TYPES
from .base import QuantType
from .grids import KVALUES_FP4
from .numeric import F0, bits_f32

# kvalues_mxfp4 as float32 (exact: small integers), the table the kernels read
MXFP4_LEVELS = KVALUES_FP4.astype(np.float32)
MXFP4_LEVELS.flags.writeable = False
MXFP4_BYTES = GGML_TYPES["MXFP4"].type_size  # compile-time constant of the quantizer
_TWO = np.float32(2.0)
_BIAS = np.float32(127.0)


@njit(cache=True, inline="always")
def e8m0_half(e):
    """ggml_e8m0_to_fp32_half: 2**(e - 128) as float32 (subnormal for e < 2), from its bits."""
    return bits_f32(0x00200000 << e) if e < 2 else bits_f32((e - 1) << 23)


@njit(cache=True, parallel=True)
def mxfp4(blocks, levels, out):
    # dequantize_row_mxfp4: x0 * d with x0 the level, d the halved scale
    half = out.shape[1] // 2
    for i in prange(blocks.shape[0]):
        d = e8m0_half(np.int64(blocks[i, 0]))
        for j in range(half):
            b = np.int32(blocks[i, 1 + j])
            out[i, j] = levels[b & 0xF] * d
            out[i, j + half] = levels[b >> 4] * d


# ----------------------------------------------------------------------------- quantizing


@njit(cache=True, error_model="numpy")
def exponent_byte(amax):
    """`(uint8_t)(floorf(log2f(amax)) - 2 + 127)` for amax > 0 as x86 computes it: the float goes
    through a 32-bit int (cvttss2si) whose low byte is kept, so a tiny amax wraps around (-24 ->
    232) and an infinite one (the int's 0x80000000) gives 0."""
    v = np.float32(np.float32(np.floor(np.log2(amax)) - _TWO) + _BIAS)
    if not np.isfinite(v):
        return 0
    return int(v) & 0xFF


@njit(cache=True, error_model="numpy")
def best_index(x, d):
    """best_index_mxfp4: the first level l minimizing |kvalues_mxfp4[l] * d - x|."""
    best = 0
    best_err = abs(np.float32(MXFP4_LEVELS[0] * d) - x)
    for i in range(1, 16):
        err = abs(np.float32(MXFP4_LEVELS[i] * d) - x)
        if err < best_err:
            best = i
            best_err = err
    return best


@njit(cache=True, error_model="numpy")
def mxfp4_row(x, out):
    for ib in range(x.shape[0] // 32):
        xb = x[32 * ib:32 * ib + 32]
        o = MXFP4_BYTES * ib
        amax = F0
        for j in range(32):
            if amax < abs(xb[j]):
                amax = abs(xb[j])
        e = exponent_byte(amax) if amax > F0 else 0
        d = e8m0_half(e)
        out[o] = e
        for j in range(16):
            out[o + 1 + j] = best_index(xb[j], d) | (best_index(xb[j + 16], d) << 4)


@njit(cache=True, nogil=True, error_model="numpy")
def mxfp4_rows(x, qw, use_qw, out):
    for r in range(x.shape[0]):
        mxfp4_row(x[r], out[r])


class MXFP4(QuantType):
    row_kernel = staticmethod(mxfp4_rows)
    uses_imatrix = False  # quantize_mxfp4 ignores quant_weights

    @staticmethod
    def run(blocks, out):
        mxfp4(blocks, MXFP4_LEVELS, out)
