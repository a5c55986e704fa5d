"""Row quantizers for the K-quants Q2_K, Q3_K, Q4_K, Q5_K and Q6_K (256-element super-blocks).

Without importance weights: ggml's quantize_row_q*_K_ref. Each sub-block gets a scale (and a min)
from a search, the super-block quantizes those to 4/6/8 bits against an fp16 super-scale, and the
values are quantized again with the fp16-rounded scales. With importance weights: ggml's
quantize_row_q*_K_impl, where the sub-block scales themselves are fitted by weighted searches
(make_qp_quants / make_qx_quants). Offsets below are byte positions in ggml's block structs.
"""
import numpy as np
from numba import njit

from ..catalog import GGML_TYPES
from .numeric import F0, F1, GROUP_MAX_EPS, fp16_to_fp32, fp32_to_fp16, nearest_int, put_u16
from .search import make_q3_quants, make_qkx2_quants, make_qkx3_quants, make_qp_quants, \
    make_qx_quants

# Values and bytes per super-block (catalog geometry; compile-time constants of the kernels below).
QK_K = GGML_TYPES["Q4_K"].block_size
Q2_K_BYTES, Q3_K_BYTES, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES = (
    GGML_TYPES[t].type_size for t in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"))
_F15 = np.float32(15.0)
_F63 = np.float32(63.0)
_M05 = np.float32(-0.5)
_M09 = np.float32(-0.9)
_P01 = np.float32(0.1)
_P005 = np.float32(0.05)


@njit(cache=True, error_model="numpy")
def superblock_sigma2(xs, factor):
    """factor * sum(x**2) / 256 over one super-block, in ggml's order."""
    s = F0
    for j in range(QK_K):
        s = np.float32(s + np.float32(xs[j] * xs[j]))
    return np.float32(np.float32(factor * s) / np.float32(QK_K))


@njit(cache=True, error_model="numpy")
def imatrix_weights(xb, qw, sigma2, weight):
    """weight[l] = qw[l] * sqrt(sigma2 + x[l]**2); returns the sum of the weights."""
    sumw = F0
    for l in range(xb.shape[0]):
        weight[l] = np.float32(qw[l] * np.sqrt(np.float32(sigma2 + np.float32(xb[l] * xb[l]))))
    for l in range(xb.shape[0]):
        sumw = np.float32(sumw + weight[l])
    return sumw


@njit(cache=True, error_model="numpy")
def pack_2bit(L, out, pos):
    """Four 2-bit levels per byte: byte l of each 32-byte group holds L[j+l], L[j+l+32], ..."""
    for j in range(0, QK_K, 128):
        for l in range(32):
            out[pos + j // 4 + l] = (L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4)
                                     | (L[j + l + 96] << 6)) & 0xFF


@njit(cache=True, error_model="numpy")
def requantize_affine(xs, L, d_all, m_all, group, nmax, sc_of, m_of):
    """Quantize again with the fp16-rounded scales: L = clamp(round((x + dm) / d), 0, nmax)."""
    for j in range(QK_K // group):
        d = np.float32(d_all * np.float32(sc_of[j]))
        if d == F0:
            continue
        dm = np.float32(m_all * np.float32(m_of[j]))
        for ii in range(group):
            l = nearest_int(np.float32(np.float32(xs[group * j + ii] + dm) / d))
            L[group * j + ii] = max(0, min(nmax, l))


# ---- Q2_K: scales[16] (4-bit scale | 4-bit min << 4), qs[64], d, dmin (fp16)

@njit(cache=True, error_model="numpy")
def q2_k_finish(xs, L, sc, out, o, dh, dminh):
    """Write scales, d and dmin, requantize with the stored (fp16) values, pack the 2-bit levels."""
    for j in range(16):
        out[o + j] = sc[j]
    put_u16(out, o + 80, dh)
    put_u16(out, o + 82, dminh)
    sc_of = np.empty(16, np.int64)
    m_of = np.empty(16, np.int64)
    for j in range(16):
        sc_of[j] = sc[j] & 0xF
        m_of[j] = sc[j] >> 4
    requantize_affine(xs, L, fp16_to_fp32(dh), fp16_to_fp32(dminh), 16, 3, sc_of, m_of)
    pack_2bit(L, out, o + 16)


@njit(cache=True, error_model="numpy")
def q2_k_row_ref(x, out):
    L = np.empty(QK_K, np.uint8)
    Laux = np.empty(16, np.uint8)
    weights = np.empty(16, np.float32)
    mins = np.empty(16, np.float32)
    scales = np.empty(16, np.float32)
    sc = np.empty(16, np.int64)
    for i in range(x.shape[0] // QK_K):
        xs = x[QK_K * i:QK_K * (i + 1)]
        o = Q2_K_BYTES * i
        max_scale = F0
        max_min = F0
        for j in range(16):
            xb = xs[16 * j:16 * j + 16]
            for l in range(16):
                weights[l] = abs(xb[l])
            scales[j], mins[j] = make_qkx2_quants(16, 3, xb, weights, L[16 * j:16 * j + 16], Laux,
                                                  (_M05, _P01, 15, True))
            if scales[j] > max_scale:
                max_scale = scales[j]
            if mins[j] > max_min:
                max_min = mins[j]
        if max_scale > F0:
            iscale = np.float32(_F15 / max_scale)
            for j in range(16):
                sc[j] = nearest_int(np.float32(iscale * scales[j])) & 0xFF
            dh = fp32_to_fp16(np.float32(max_scale / _F15))
        else:
            for j in range(16):
                sc[j] = 0
            dh = fp32_to_fp16(F0)
        if max_min > F0:
            iscale = np.float32(_F15 / max_min)
            for j in range(16):
                sc[j] = (sc[j] | (nearest_int(np.float32(iscale * mins[j])) << 4)) & 0xFF
            dminh = fp32_to_fp16(np.float32(max_min / _F15))
        else:
            dminh = fp32_to_fp16(F0)
        q2_k_finish(xs, L, sc, out, o, dh, dminh)


@njit(cache=True, error_model="numpy")
def q2_k_row_imatrix(x, qw_row, out):
    L = np.empty(QK_K, np.uint8)
    Laux = np.empty(16, np.uint8)
    weight = np.empty(16, np.float32)
    mins = np.empty(16, np.float32)
    scales = np.empty(16, np.float32)
    sw = np.empty(16, np.float32)
    Ls = np.empty(16, np.uint8)
    Lm = np.empty(16, np.uint8)
    sc = np.empty(16, np.int64)
    for i in range(x.shape[0] // QK_K):
        xs = x[QK_K * i:QK_K * (i + 1)]
        qws = qw_row[QK_K * i:QK_K * (i + 1)]
        o = Q2_K_BYTES * i
        sigma2 = superblock_sigma2(xs, F1)
        for j in range(16):
            xb = xs[16 * j:16 * j + 16]
            sw[j] = imatrix_weights(xb, qws[16 * j:16 * j + 16], sigma2, weight)
            scales[j], mins[j] = make_qkx3_quants(16, 3, xb, weight, L[16 * j:16 * j + 16], Laux,
                                                  (_M09, _P005, 36, False))
        dm = make_qp_quants(16, 15, scales, Ls, sw)
        mm = make_qp_quants(16, 15, mins, Lm, sw)
        for j in range(16):
            sc[j] = (Ls[j] | (Lm[j] << 4)) & 0xFF
        q2_k_finish(xs, L, sc, out, o, fp32_to_fp16(dm), fp32_to_fp16(mm))


@njit(cache=True, nogil=True, error_model="numpy")
def q2_k_rows(x, qw, use_qw, out):
    for r in range(x.shape[0]):
        if use_qw:
            q2_k_row_imatrix(x[r], qw, out[r])
        else:
            q2_k_row_ref(x[r], out[r])


# ---- Q3_K: hmask[32], qs[64], scales[12] (16 six-bit scales), d (fp16)

@njit(cache=True, error_model="numpy")
def q3_k_put_scales(levels, sc):
    """Pack 16 six-bit levels (0..63) into the 12 scale bytes (zeroed first)."""
    for k in range(12):
        sc[k] = 0
    for j in range(16):
        l = levels[j]
        if j < 8:
            sc[j] = l & 0xF
        else:
            sc[j - 8] |= (l & 0xF) << 4
        l >>= 4
        sc[j % 4 + 8] |= l << (2 * (j // 4))
    for k in range(12):
        sc[k] &= 0xFF


@njit(cache=True, error_model="numpy")
def q3_k_finish(xs, L, sc, dh, out, o):
    """Requantize with the stored scales, then write hmask, 2-bit quants, scales and d."""
    d_all = fp16_to_fp32(dh)
    for j in range(16):
        s = (sc[j] & 0xF) if j < 8 else (sc[j - 8] >> 4)
        s = (s | (((sc[8 + j % 4] >> (2 * (j // 4))) & 3) << 4)) - 32
        d = np.float32(d_all * np.float32(s))
        if d == F0:
            continue
        for ii in range(16):
            l = nearest_int(np.float32(xs[16 * j + ii] / d))
            L[16 * j + ii] = max(-4, min(3, l)) + 4
    for k in range(32):
        out[o + k] = 0
    m = 0
    hm = 1
    for j in range(QK_K):
        if L[j] > 3:
            out[o + m] |= hm
            L[j] -= 4
        m += 1
        if m == 32:
            m = 0
            hm <<= 1
    pack_2bit(L, out, o + 32)
    for k in range(12):
        out[o + 96 + k] = sc[k]
    put_u16(out, o + 108, dh)


@njit(cache=True, error_model="numpy")
def q3_k_row_ref(x, out):
    L = np.empty(QK_K, np.int32)
    scales = np.empty(16, np.float32)
    levels = np.empty(16, np.int64)
    sc = np.empty(12, np.int64)
    for i in range(x.shape[0] // QK_K):
        xs = x[QK_K * i:QK_K * (i + 1)]
        max_scale = F0
        amax = F0
        for j in range(16):
            scales[j] = make_q3_quants(16, 4, xs[16 * j:16 * j + 16], L[16 * j:16 * j + 16], True)
            scale = abs(scales[j])
            if scale > amax:
                amax = scale
                max_scale = scales[j]
        if max_scale != F0:
            iscale = np.float32(np.float32(-32.0) / max_scale)
            for j in range(16):
                l = ((nearest_int(np.float32(iscale * scales[j])) + 128) & 0xFF) - 128  # int8_t
                levels[j] = max(-32, min(31, l)) + 32
            q3_k_put_scales(levels, sc)
            dh = fp32_to_fp16(np.float32(F1 / iscale))
        else:
            for k in range(12):
                sc[k] = 0
            dh = fp32_to_fp16(F0)
        q3_k_finish(xs, L, sc, dh, out, Q3_K_BYTES * i)


@njit(cache=True, error_model="numpy")
def q3_k_row_imatrix(x, qw_row, out):
    L = np.empty(QK_K, np.int32)
    scales = np.empty(16, np.float32)
    weight = np.empty(16, np.float32)
    sw = np.empty(16, np.float32)
    Ls = np.empty(16, np.int32)
    sc = np.empty(12, np.int64)
    for i in range(x.shape[0] // QK_K):
        xs = x[QK_K * i:QK_K * (i + 1)]
        qws = qw_row[QK_K * i:QK_K * (i + 1)]
        sigma2 = superblock_sigma2(xs, np.float32(2.0))
        for j in range(16):
            xb = xs[16 * j:16 * j + 16]
            sw[j] = imatrix_weights(xb, qws[16 * j:16 * j + 16], sigma2, weight)
            scales[j] = make_qx_quants(16, 4, xb, L[16 * j:16 * j + 16], weight, True)
        d_block = make_qx_quants(16, 32, scales, Ls, sw, True)
        q3_k_put_scales(Ls, sc)
        q3_k_finish(xs, L, sc, fp32_to_fp16(d_block), out, Q3_K_BYTES * i)


@njit(cache=True, nogil=True, error_model="numpy")
def q3_k_rows(x, qw, use_qw, out):
    for r in range(x.shape[0]):
        if use_qw:
            q3_k_row_imatrix(x[r], qw, out[r])
        else:
            q3_k_row_ref(x[r], out[r])


# ---- Q4_K / Q5_K: d, dmin (fp16), scales[12] (8 six-bit scales and mins), [qh[32]], qs[128]

@njit(cache=True, error_model="numpy")
def put_scales_mins_k4(ls_all, lm_all, out, pos):
    """Pack 8 six-bit scales and 8 six-bit mins into 12 bytes (get_scale_min_k4's layout)."""
    for j in range(8):
        ls = ls_all[j]
        lm = lm_all[j]
        if j < 4:
            out[pos + j] = ls & 0xFF
            out[pos + j + 4] = lm & 0xFF
        else:
            out[pos + j + 4] = ((ls & 0xF) | ((lm & 0xF) << 4)) & 0xFF
            out[pos + j - 4] |= ((ls >> 4) << 6) & 0xFF
            out[pos + j] |= ((lm >> 4) << 6) & 0xFF


@njit(cache=True, error_model="numpy")
def get_scale_min_k4(j, q):
    """The j-th six-bit scale and min from the 12 packed bytes ``q``."""
    if j < 4:
        return np.int64(q[j]) & 63, np.int64(q[j + 4]) & 63
    lo = np.int64(q[j + 4])
    return (lo & 0xF) | ((np.int64(q[j - 4]) >> 6) << 4), (lo >> 4) | ((np.int64(q[j]) >> 6) << 4)


@njit(cache=True, error_model="numpy")
def k4_ref_scales(xs, nmax, sweep, L, scales, mins, scratch):
    """Sub-block search of the Q4_K/Q5_K reference: weights av_x + |x|, make_qkx2_quants.

    ``sweep``: make_qkx2_quants' (rmin, rdelta, nstep, use_mad). ``scratch``: the work buffers
    (weights[32], Laux[32]). Fills L, scales[8] and mins[8]; returns (max_scale, max_min).
    """
    weights, Laux = scratch
    max_scale = F0
    max_min = F0
    for j in range(8):
        xb = xs[32 * j:32 * j + 32]
        sum_x2 = F0
        for l in range(32):
            sum_x2 = np.float32(sum_x2 + np.float32(xb[l] * xb[l]))
        av_x = np.sqrt(np.float32(sum_x2 / np.float32(32.0)))
        for l in range(32):
            weights[l] = np.float32(av_x + abs(xb[l]))
        scales[j], mins[j] = make_qkx2_quants(32, nmax, xb, weights, L[32 * j:32 * j + 32], Laux, sweep)
        if scales[j] > max_scale:
            max_scale = scales[j]
        if mins[j] > max_min:
            max_min = mins[j]
    return max_scale, max_min


@njit(cache=True, error_model="numpy")
def k4_ref_levels(scales, mins, max_scale, max_min, ls_all, lm_all):
    inv_scale = np.float32(_F63 / max_scale) if max_scale > F0 else F0
    inv_min = np.float32(_F63 / max_min) if max_min > F0 else F0
    for j in range(8):
        ls_all[j] = min(63, nearest_int(np.float32(inv_scale * scales[j])) & 0xFF)
        lm_all[j] = min(63, nearest_int(np.float32(inv_min * mins[j])) & 0xFF)


@njit(cache=True, error_model="numpy")
def k4_imatrix_scales(xs, qws, nmax, L, scales, mins, scratch, levels):
    """Sub-block search with importance weights (quantize_row_q4_K_impl / q5_K_impl).

    ``scratch``: the work buffers (weights[32], Laux[32], sw[8]). Fills L, scales[8], mins[8] and
    ``levels = (Ls, Lm)``, make_qp_quants' 6-bit levels of the scales and of the mins; returns
    their super-block scales (d_block, m_block).
    """
    weights, Laux, sw = scratch
    Ls, Lm = levels
    sigma2 = superblock_sigma2(xs, np.float32(2.0))
    for j in range(8):
        xb = xs[32 * j:32 * j + 32]
        sw[j] = imatrix_weights(xb, qws[32 * j:32 * j + 32], sigma2, weights)
        scales[j], mins[j] = make_qkx3_quants(32, nmax, xb, weights, L[32 * j:32 * j + 32], Laux,
                                              (_M09, _P005, 36, False))
    d_block = make_qp_quants(8, 63, scales, Ls, sw)
    m_block = make_qp_quants(8, 63, mins, Lm, sw)
    return d_block, m_block


@njit(cache=True, error_model="numpy")
def k4_requantize(xs, L, out, o, dh, dminh, nmax):
    """Write d and dmin, then requantize with the scales and mins as stored in the block."""
    put_u16(out, o, dh)
    put_u16(out, o + 2, dminh)
    sc_of = np.empty(8, np.int64)
    m_of = np.empty(8, np.int64)
    for j in range(8):
        sc_of[j], m_of[j] = get_scale_min_k4(j, out[o + 4:o + 16])
    requantize_affine(xs, L, fp16_to_fp32(dh), fp16_to_fp32(dminh), 32, nmax, sc_of, m_of)


@njit(cache=True, error_model="numpy")
def q4_k_pack(L, out, pos):
    for j in range(0, QK_K, 64):
        for l in range(32):
            out[pos + j // 2 + l] = (L[j + l] | (L[j + l + 32] << 4)) & 0xFF


@njit(cache=True, error_model="numpy")
def q5_k_pack(L, out, pos):
    """qh[32] at pos (bit pairs per 64 values), then qs[128] of low nibbles."""
    for k in range(32):
        out[pos + k] = 0
    m1 = 1
    m2 = 2
    for n in range(0, QK_K, 64):
        for j in range(32):
            l1 = np.int64(L[n + j])
            if l1 > 15:
                l1 -= 16
                out[pos + j] |= m1
            l2 = np.int64(L[n + j + 32])
            if l2 > 15:
                l2 -= 16
                out[pos + j] |= m2
            out[pos + 32 + n // 2 + j] = (l1 | (l2 << 4)) & 0xFF
        m1 <<= 2
        m2 <<= 2


@njit(cache=True, error_model="numpy")
def qk45_row(x, qw_row, use_qw, out, nmax, type_size, sweep):
    """Q4_K (nmax 15) or Q5_K (nmax 31) for one row, reference or importance-weighted path.

    ``sweep``: the reference path's make_qkx2_quants (rmin, rdelta, nstep, use_mad)."""
    L = np.empty(QK_K, np.uint8)
    Laux = np.empty(32, np.uint8)
    weights = np.empty(32, np.float32)
    mins = np.empty(8, np.float32)
    scales = np.empty(8, np.float32)
    sw = np.empty(8, np.float32)
    Ls = np.empty(8, np.uint8)
    Lm = np.empty(8, np.uint8)
    ls_all = np.empty(8, np.int64)
    lm_all = np.empty(8, np.int64)
    for i in range(x.shape[0] // QK_K):
        xs = x[QK_K * i:QK_K * (i + 1)]
        o = type_size * i
        if use_qw:
            d_block, m_block = k4_imatrix_scales(xs, qw_row[QK_K * i:QK_K * (i + 1)], nmax, L, scales, mins,
                                                 (weights, Laux, sw), (Ls, Lm))
            for j in range(8):
                # ggml's Q5_K clamps the fitted levels to 63; its Q4_K stores them as they are
                ls_all[j] = min(63, Ls[j]) if nmax == 31 else np.int64(Ls[j])
                lm_all[j] = min(63, Lm[j]) if nmax == 31 else np.int64(Lm[j])
        else:
            max_scale, max_min = k4_ref_scales(xs, nmax, sweep, L, scales, mins, (weights, Laux))
            k4_ref_levels(scales, mins, max_scale, max_min, ls_all, lm_all)
            d_block = np.float32(max_scale / _F63)
            m_block = np.float32(max_min / _F63)
        put_scales_mins_k4(ls_all, lm_all, out, o + 4)
        k4_requantize(xs, L, out, o, fp32_to_fp16(d_block), fp32_to_fp16(m_block), nmax)
        if nmax == 15:
            q4_k_pack(L, out, o + 16)
        else:
            q5_k_pack(L, out, o + 16)


@njit(cache=True, nogil=True, error_model="numpy")
def q4_k_rows(x, qw, use_qw, out):
    for r in range(x.shape[0]):
        qk45_row(x[r], qw, use_qw, out[r], 15, Q4_K_BYTES, (np.float32(-1.0), _P01, 20, False))


@njit(cache=True, nogil=True, error_model="numpy")
def q5_k_rows(x, qw, use_qw, out):
    for r in range(x.shape[0]):
        qk45_row(x[r], qw, use_qw, out[r], 31, Q5_K_BYTES, (_M05, _P01, 15, False))


# ---- Q6_K: ql[128], qh[64], scales[16] (int8), d (fp16)

@njit(cache=True, error_model="numpy")
def q6_k_row(x, qw_row, use_qw, out):
    """Reference path and importance-weighted path differ only in make_qx_quants' weights."""
    L = np.empty(QK_K, np.int32)
    scales = np.empty(16, np.float32)
    sc = np.empty(16, np.int64)
    for i in range(x.shape[0] // QK_K):
        xs = x[QK_K * i:QK_K * (i + 1)]
        o = Q6_K_BYTES * i
        max_scale = F0
        max_abs_scale = F0
        for ib in range(16):
            xb = xs[16 * ib:16 * ib + 16]
            if use_qw:
                scale = make_qx_quants(16, 32, xb, L[16 * ib:16 * ib + 16],
                                       qw_row[QK_K * i + 16 * ib:QK_K * i + 16 * ib + 16], True)
            else:
                scale = make_qx_quants(16, 32, xb, L[16 * ib:16 * ib + 16], xb, False)
            scales[ib] = scale
            abs_scale = abs(scale)
            if abs_scale > max_abs_scale:
                max_abs_scale = abs_scale
                max_scale = scale
        if max_abs_scale < GROUP_MAX_EPS:
            for k in range(Q6_K_BYTES):
                out[o + k] = 0
            put_u16(out, o + 208, fp32_to_fp16(F0))
            continue
        iscale = np.float32(np.float32(-128.0) / max_scale)
        dh = fp32_to_fp16(np.float32(F1 / iscale))
        put_u16(out, o + 208, dh)
        for ib in range(16):
            s = min(127, nearest_int(np.float32(iscale * scales[ib])))
            sc[ib] = ((s + 128) & 0xFF) - 128  # int8_t
            out[o + 192 + ib] = s & 0xFF
        d_all = fp16_to_fp32(dh)
        for j in range(16):
            d = np.float32(d_all * np.float32(sc[j]))
            if d == F0:
                continue
            for ii in range(16):
                l = nearest_int(np.float32(xs[16 * j + ii] / d))
                L[16 * j + ii] = max(-32, min(31, l)) + 32
        for j in range(0, QK_K, 128):
            ql = o + j // 2
            qh = o + 128 + j // 4
            for l in range(32):
                q1 = L[j + l] & 0xF
                q2 = L[j + l + 32] & 0xF
                q3 = L[j + l + 64] & 0xF
                q4 = L[j + l + 96] & 0xF
                out[ql + l] = q1 | (q3 << 4)
                out[ql + l + 32] = q2 | (q4 << 4)
                out[qh + l] = ((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4)
                               | ((L[j + l + 96] >> 4) << 6)) & 0xFF


@njit(cache=True, nogil=True, error_model="numpy")
def q6_k_rows(x, qw, use_qw, out):
    for r in range(x.shape[0]):
        q6_k_row(x[r], qw, use_qw, out[r])
