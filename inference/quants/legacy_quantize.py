"""Row quantizers for the 32-element block types Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0.

Without importance weights these are ggml's quantize_row_*_ref (round by truncating after adding
8.5 / 16.5 / 0.5; Q8_0 uses roundf). With importance weights Q4_0/Q5_0 search symmetric scales
(make_qx_quants) and Q4_1/Q5_1 affine ones (make_qkx3_quants), weighting each value by
``imatrix[i] * sqrt(sigma2 + x[i]**2)`` with sigma2 the row's mean square. Q8_0 ignores them.
Each ``*_rows`` kernel quantizes a batch of rows without the GIL (`base.run_in_batches` spreads
the batches over threads); the classes in `legacy.py` name them.
"""
import numpy as np
from numba import njit

from ..catalog import GGML_TYPES
from .numeric import F0, F1, fp32_to_fp16, put_u16, round_away
from .search import make_qkx3_quants, make_qx_quants

# Bytes per block (catalog geometry; compile-time constants of the kernels below).
Q4_0_BYTES, Q4_1_BYTES, Q5_0_BYTES, Q5_1_BYTES, Q8_0_BYTES = (
    GGML_TYPES[t].type_size for t in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"))

_FLT_MAX = np.float32(np.finfo(np.float32).max)
_HALF = np.float32(0.5)
_M09 = np.float32(-0.9)
_P005 = np.float32(0.05)


@njit(cache=True, error_model="numpy")
def row_sigma2(x):
    """Mean square of a whole row, summed in order in float32 (sum_x2/n_per_row)."""
    s = F0
    for j in range(x.shape[0]):
        s = np.float32(s + np.float32(x[j] * x[j]))
    return np.float32(s / np.float32(x.shape[0]))


@njit(cache=True, error_model="numpy")
def block_weights(xb, qw, sigma2, weight):
    for j in range(xb.shape[0]):
        weight[j] = np.float32(qw[j] * np.sqrt(np.float32(sigma2 + np.float32(xb[j] * xb[j]))))


@njit(cache=True, error_model="numpy")
def absmax_signed(xb):
    """The value of largest magnitude (the first one on ties), like the ref quantizers' scan."""
    amax = F0
    vmax = F0
    for j in range(xb.shape[0]):
        v = xb[j]
        if amax < abs(v):
            amax = abs(v)
            vmax = v
    return vmax


@njit(cache=True, error_model="numpy")
def min_max(xb):
    vmin = _FLT_MAX
    vmax = -_FLT_MAX
    for j in range(xb.shape[0]):
        v = xb[j]
        if v < vmin:
            vmin = v
        if v > vmax:
            vmax = v
    return vmin, vmax


@njit(cache=True, error_model="numpy")
def put_q5_high_bits(out, pos, lo, hi):
    """Q5 layout: 16 bytes of nibbles at pos+4 and the 5th bits as a little-endian uint32 at pos."""
    qh = 0
    for j in range(16):
        xi0 = lo[j]
        xi1 = hi[j]
        out[pos + 4 + j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4)
        qh |= ((xi0 & 0x10) >> 4) << j
        qh |= ((xi1 & 0x10) >> 4) << (j + 16)
    for k in range(4):
        out[pos + k] = (qh >> (8 * k)) & 0xFF


# ---- Q4_0: d (fp16), 16 bytes of nibbles; value = (q - 8) * d

@njit(cache=True, error_model="numpy")
def q4_0_row_ref(x, out):
    for ib in range(x.shape[0] // 32):
        xb = x[32 * ib:32 * ib + 32]
        o = Q4_0_BYTES * ib
        d = np.float32(absmax_signed(xb) / np.float32(-8.0))
        idd = np.float32(F1 / d) if d != F0 else F0
        put_u16(out, o, fp32_to_fp16(d))
        for j in range(16):
            x0 = np.float32(xb[j] * idd)
            x1 = np.float32(xb[j + 16] * idd)
            xi0 = min(15, int(np.float32(x0 + np.float32(8.5))))
            xi1 = min(15, int(np.float32(x1 + np.float32(8.5))))
            out[o + 2 + j] = (xi0 | (xi1 << 4)) & 0xFF


@njit(cache=True, error_model="numpy")
def q4_0_row_imatrix(x, qw, out):
    sigma2 = row_sigma2(x)
    weight = np.empty(32, np.float32)
    L = np.empty(32, np.int32)
    for ib in range(x.shape[0] // 32):
        xb = x[32 * ib:32 * ib + 32]
        o = Q4_0_BYTES * ib
        block_weights(xb, qw[32 * ib:32 * ib + 32], sigma2, weight)
        d = make_qx_quants(32, 8, xb, L, weight, True)
        put_u16(out, o, fp32_to_fp16(d))
        for j in range(16):
            out[o + 2 + j] = (L[j] | (L[j + 16] << 4)) & 0xFF


@njit(cache=True, nogil=True, error_model="numpy")
def q4_0_rows(x, qw, use_qw, out):
    for r in range(x.shape[0]):
        if use_qw:
            q4_0_row_imatrix(x[r], qw, out[r])
        else:
            q4_0_row_ref(x[r], out[r])


# ---- Q4_1: d, m (fp16), 16 bytes of nibbles; value = q * d + m

@njit(cache=True, error_model="numpy")
def q4_1_row_ref(x, out):
    for ib in range(x.shape[0] // 32):
        xb = x[32 * ib:32 * ib + 32]
        o = Q4_1_BYTES * ib
        vmin, vmax = min_max(xb)
        d = np.float32(np.float32(vmax - vmin) / np.float32(15.0))
        idd = np.float32(F1 / d) if d != F0 else F0
        put_u16(out, o, fp32_to_fp16(d))
        put_u16(out, o + 2, fp32_to_fp16(vmin))
        for j in range(16):
            x0 = np.float32(np.float32(xb[j] - vmin) * idd)
            x1 = np.float32(np.float32(xb[j + 16] - vmin) * idd)
            xi0 = min(15, int(np.float32(x0 + _HALF)))
            xi1 = min(15, int(np.float32(x1 + _HALF)))
            out[o + 4 + j] = (xi0 | (xi1 << 4)) & 0xFF


@njit(cache=True, error_model="numpy")
def q4_1_row_imatrix(x, qw, out):
    sigma2 = row_sigma2(x)
    weight = np.empty(32, np.float32)
    L = np.empty(32, np.uint8)
    Laux = np.empty(32, np.uint8)
    for ib in range(x.shape[0] // 32):
        xb = x[32 * ib:32 * ib + 32]
        o = Q4_1_BYTES * ib
        block_weights(xb, qw[32 * ib:32 * ib + 32], sigma2, weight)
        d, the_min = make_qkx3_quants(32, 15, xb, weight, L, Laux, (_M09, _P005, 36, False))
        put_u16(out, o, fp32_to_fp16(d))
        put_u16(out, o + 2, fp32_to_fp16(-the_min))
        for j in range(16):
            out[o + 4 + j] = (L[j] | (L[j + 16] << 4)) & 0xFF


@njit(cache=True, nogil=True, error_model="numpy")
def q4_1_rows(x, qw, use_qw, out):
    for r in range(x.shape[0]):
        if use_qw:
            q4_1_row_imatrix(x[r], qw, out[r])
        else:
            q4_1_row_ref(x[r], out[r])


# ---- Q5_0: d (fp16), qh (uint32 of 5th bits), 16 bytes of nibbles; value = (q - 16) * d

@njit(cache=True, error_model="numpy")
def q5_0_row_ref(x, out):
    lo = np.empty(16, np.int64)
    hi = np.empty(16, np.int64)
    for ib in range(x.shape[0] // 32):
        xb = x[32 * ib:32 * ib + 32]
        o = Q5_0_BYTES * ib
        d = np.float32(absmax_signed(xb) / np.float32(-16.0))
        idd = np.float32(F1 / d) if d != F0 else F0
        put_u16(out, o, fp32_to_fp16(d))
        for j in range(16):
            x0 = np.float32(xb[j] * idd)
            x1 = np.float32(xb[j + 16] * idd)
            lo[j] = min(31, int(np.float32(x0 + np.float32(16.5))))
            hi[j] = min(31, int(np.float32(x1 + np.float32(16.5))))
        put_q5_high_bits(out, o + 2, lo, hi)


@njit(cache=True, error_model="numpy")
def q5_0_row_imatrix(x, qw, out):
    sigma2 = row_sigma2(x)
    weight = np.empty(32, np.float32)
    L = np.empty(32, np.int32)
    for ib in range(x.shape[0] // 32):
        xb = x[32 * ib:32 * ib + 32]
        o = Q5_0_BYTES * ib
        block_weights(xb, qw[32 * ib:32 * ib + 32], sigma2, weight)
        d = make_qx_quants(32, 16, xb, L, weight, True)
        put_u16(out, o, fp32_to_fp16(d))
        put_q5_high_bits(out, o + 2, L[:16], L[16:])


@njit(cache=True, nogil=True, error_model="numpy")
def q5_0_rows(x, qw, use_qw, out):
    for r in range(x.shape[0]):
        if use_qw:
            q5_0_row_imatrix(x[r], qw, out[r])
        else:
            q5_0_row_ref(x[r], out[r])


# ---- Q5_1: d, m (fp16), qh, 16 bytes of nibbles; value = q * d + m

@njit(cache=True, error_model="numpy")
def q5_1_row_ref(x, out):
    lo = np.empty(16, np.int64)
    hi = np.empty(16, np.int64)
    for ib in range(x.shape[0] // 32):
        xb = x[32 * ib:32 * ib + 32]
        o = Q5_1_BYTES * ib
        vmin, vmax = min_max(xb)
        d = np.float32(np.float32(vmax - vmin) / np.float32(31.0))
        idd = np.float32(F1 / d) if d != F0 else F0
        put_u16(out, o, fp32_to_fp16(d))
        put_u16(out, o + 2, fp32_to_fp16(vmin))
        for j in range(16):
            x0 = np.float32(np.float32(xb[j] - vmin) * idd)
            x1 = np.float32(np.float32(xb[j + 16] - vmin) * idd)
            lo[j] = int(np.float32(x0 + _HALF)) & 0xFF
            hi[j] = int(np.float32(x1 + _HALF)) & 0xFF
        put_q5_high_bits(out, o + 4, lo, hi)


@njit(cache=True, error_model="numpy")
def q5_1_row_imatrix(x, qw, out):
    sigma2 = row_sigma2(x)
    weight = np.empty(32, np.float32)
    L = np.empty(32, np.uint8)
    Laux = np.empty(32, np.uint8)
    for ib in range(x.shape[0] // 32):
        xb = x[32 * ib:32 * ib + 32]
        o = Q5_1_BYTES * ib
        block_weights(xb, qw[32 * ib:32 * ib + 32], sigma2, weight)
        d, the_min = make_qkx3_quants(32, 31, xb, weight, L, Laux, (_M09, _P005, 36, False))
        put_u16(out, o, fp32_to_fp16(d))
        put_u16(out, o + 2, fp32_to_fp16(-the_min))
        put_q5_high_bits(out, o + 4, L[:16], L[16:])


@njit(cache=True, nogil=True, error_model="numpy")
def q5_1_rows(x, qw, use_qw, out):
    for r in range(x.shape[0]):
        if use_qw:
            q5_1_row_imatrix(x[r], qw, out[r])
        else:
            q5_1_row_ref(x[r], out[r])


# ---- Q8_0: d (fp16), 32 int8; value = q * d. Importance weights are ignored.

@njit(cache=True, error_model="numpy")
def q8_0_row(x, out):
    for ib in range(x.shape[0] // 32):
        xb = x[32 * ib:32 * ib + 32]
        o = Q8_0_BYTES * ib
        amax = F0
        for j in range(32):
            a = abs(xb[j])
            amax = amax if amax > a else a
        d = np.float32(amax / np.float32(127.0))
        idd = np.float32(F1 / d) if d != F0 else F0
        put_u16(out, o, fp32_to_fp16(d))
        for j in range(32):
            out[o + 2 + j] = int(round_away(np.float32(xb[j] * idd))) & 0xFF


@njit(cache=True, nogil=True, error_model="numpy")
def q8_0_rows(x, qw, use_qw, out):
    for r in range(x.shape[0]):
        q8_0_row(x[r], out[r])
