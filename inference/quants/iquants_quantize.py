"""Row quantizers for IQ4_NL (32-element blocks) and IQ4_XS (256-element super-blocks); their
classes are in `iquants.py`.

Both map values onto ggml's non-linear 16-entry table kvalues_iq4nl. ggml_quantize_chunk runs
quantize_iq4_nl / quantize_iq4_xs with ntry = 7 whether or not importance weights are given;
without them each value is weighted by x**2, with them by ``imatrix * sqrt(sigma2 + x**2)``.
"""
import numpy as np
from numba import njit

from ..catalog import GGML_TYPES
from .base import IQ4_LEVELS
from .numeric import F0, F1, GROUP_MAX_EPS, fp32_to_fp16, nearest_int, put_u16
from .search import best_index_int8, level_midsums

KVALUES_IQ4NL = IQ4_LEVELS.astype(np.int32)
KVALUES_IQ4NL_MIDSUMS = level_midsums(KVALUES_IQ4NL)
NTRY = 7
# Bytes per block (catalog geometry; compile-time constants of the kernels below).
IQ4_NL_BYTES, IQ4_XS_BYTES = GGML_TYPES["IQ4_NL"].type_size, GGML_TYPES["IQ4_XS"].type_size


@njit(cache=True, error_model="numpy")
def iq4_block_scale(xb, weight, Lb, values, midsums, ntry):
    """Best scale for one block of 32 against the table (first pass of quantize_row_iq4_nl_impl)."""
    amax = F0
    vmax = F0
    for j in range(32):
        ax = abs(xb[j])
        if ax > amax:
            amax = ax
            vmax = xb[j]
    if amax < GROUP_MAX_EPS:
        return F0, False
    v0 = np.float32(values[0])
    d = np.float32(-vmax / v0) if ntry > 0 else np.float32(vmax / v0)
    idd = np.float32(F1 / d)
    sumqx = F0
    sumq2 = F0
    for j in range(32):
        al = np.float32(idd * xb[j])
        l = best_index_int8(midsums, al)
        Lb[j] = l
        q = np.float32(values[l])
        w = weight[j]
        sumqx = np.float32(sumqx + np.float32(np.float32(w * q) * xb[j]))
        sumq2 = np.float32(sumq2 + np.float32(np.float32(w * q) * q))
    d = np.float32(sumqx / sumq2) if sumq2 > F0 else F0
    best = np.float32(d * sumqx)
    for itry in range(-ntry, ntry + 1):
        idd = np.float32(np.float32(itry + values[0]) / vmax)
        sumqx = F0
        sumq2 = F0
        for j in range(32):
            al = np.float32(idd * xb[j])
            l = best_index_int8(midsums, al)
            q = np.float32(values[l])
            w = weight[j]
            sumqx = np.float32(sumqx + np.float32(np.float32(w * q) * xb[j]))
            sumq2 = np.float32(sumq2 + np.float32(np.float32(w * q) * q))
        if sumq2 > F0 and np.float32(sumqx * sumqx) > np.float32(best * sumq2):
            d = np.float32(sumqx / sumq2)
            best = np.float32(d * sumqx)
    return d, True


@njit(cache=True, error_model="numpy")
def iq4_superblock(x, qw, use_qw, nsub, table, ntry, scratch, dest):
    """quantize_row_iq4_nl_impl for one super-block of ``nsub`` blocks of 32 at ``x``.

    ggml's arguments grouped: ``table = (values, midsums)`` (kvalues_iq4nl and its
    `level_midsums`), ``scratch = (L, weight, scales)`` (L[32*nsub] int64, weight[32],
    scales[nsub]), ``dest = (out, o)``: the block is written to the bytes ``out`` at ``o``.
    ``qw`` (quant_weights) is read only when ``use_qw``.

    Writes d (fp16) at out[o]; for nsub > 1 (IQ4_XS) also scales_h (uint16) and scales_l[nsub/2],
    then the nibbles; for nsub == 1 (IQ4_NL) the nibbles follow d directly.
    """
    values, midsums = table
    L, weight, scales = scratch
    out, o = dest
    n = 32 * nsub
    sigma2 = F0
    for j in range(n):
        sigma2 = np.float32(sigma2 + np.float32(x[j] * x[j]))
    sigma2 = np.float32(sigma2 * np.float32(np.float32(2.0) / np.float32(n)))
    max_scale = F0
    amax_scale = F0
    for ib in range(nsub):
        xb = x[32 * ib:32 * ib + 32]
        if use_qw:
            for j in range(32):
                weight[j] = np.float32(qw[32 * ib + j] * np.sqrt(np.float32(sigma2 + np.float32(xb[j] * xb[j]))))
        else:
            for j in range(32):
                weight[j] = np.float32(xb[j] * xb[j])
        d, nonzero = iq4_block_scale(xb, weight, L[32 * ib:32 * ib + 32], values, midsums, ntry)
        scales[ib] = d
        if not nonzero:
            continue
        abs_d = abs(d)
        if abs_d > amax_scale:
            amax_scale = abs_d
            max_scale = d
    if nsub > 1:
        d = np.float32(-max_scale / np.float32(32.0))
        put_u16(out, o, fp32_to_fp16(d))
        idd = np.float32(F1 / d) if d != F0 else F0
        scales_h = 0
        for k in range(nsub // 2):
            out[o + 4 + k] = 0
        for ib in range(nsub):
            l = nearest_int(np.float32(idd * scales[ib]))
            l = max(-32, min(31, l))
            dl = np.float32(d * np.float32(l))
            idl = np.float32(F1 / dl) if dl != F0 else F0
            for j in range(32):
                L[32 * ib + j] = best_index_int8(midsums, np.float32(idl * x[32 * ib + j]))
            l += 32
            if ib % 2 == 0:
                out[o + 4 + ib // 2] = l & 0xF
            else:
                out[o + 4 + ib // 2] |= (l & 0xF) << 4
            scales_h |= (l >> 4) << (2 * (ib % 8))
        put_u16(out, o + 2, scales_h)
        q = o + 4 + nsub // 2
    else:
        put_u16(out, o, fp32_to_fp16(scales[0]))
        if ntry > 0:
            idd = np.float32(F1 / scales[0]) if scales[0] != F0 else F0
            for j in range(32):
                L[j] = best_index_int8(midsums, np.float32(idd * x[j]))
        q = o + 2
    for i in range(nsub):
        for j in range(16):
            out[q + 16 * i + j] = (L[32 * i + j] | (L[32 * i + 16 + j] << 4)) & 0xFF


@njit(cache=True, error_model="numpy")
def iq4_row(x, qw, use_qw, out, nsub, type_size):
    values = KVALUES_IQ4NL
    midsums = KVALUES_IQ4NL_MIDSUMS
    n = 32 * nsub
    L = np.zeros(n, np.int64)
    weight = np.empty(32, np.float32)
    scales = np.empty(nsub, np.float32)
    for ibl in range(x.shape[0] // n):
        iq4_superblock(x[n * ibl:n * (ibl + 1)], qw[n * ibl:n * (ibl + 1)] if use_qw else qw, use_qw, nsub,
                       (values, midsums), NTRY, (L, weight, scales), (out, type_size * ibl))


@njit(cache=True, nogil=True, error_model="numpy")
def iq4_nl_rows(x, qw, use_qw, out):
    for r in range(x.shape[0]):
        iq4_row(x[r], qw, use_qw, out[r], 1, IQ4_NL_BYTES)


@njit(cache=True, nogil=True, error_model="numpy")
def iq4_xs_rows(x, qw, use_qw, out):
    for r in range(x.shape[0]):
        iq4_row(x[r], qw, use_qw, out[r], 8, IQ4_XS_BYTES)
