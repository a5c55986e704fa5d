"""Row quantizers for IQ1_S and IQ1_M (ggml-quants.c's quantize_row_iq1_s_impl and
quantize_row_iq1_m_impl); their classes are in `iq1.py`.

With 3 values per weight (-1, 0, 1, shifted by +-1/8), the best split of a sub-block into the
three is searched exhaustively: the values sorted, every pair of boundaries scored through
prefix sums (qsort in ggml: glibc's merge sort for these sizes, so ties keep their order, as a
stable sort does). Groups of 8 levels off the grid are snapped to the nearest of their listed
neighbours (iq2xs_init_impl's tables for the 2048-point grid, built as `iq3_quantize` builds
IQ3's). ggml quantizes IQ1_S only with importance weights; IQ1_M without them weights each value
by x**2. Float32 throughout, operation by operation (see `numeric`).
"""
import threading

import numpy as np
from numba import njit

from ..catalog import GGML_TYPES
from .grids import IQ1M_DELTA, IQ1S_DELTA, IQ1S_GRID
from .iq3_quantize import block_sigma2, build_grid_tables
from .numeric import F0, F1, fp32_to_fp16, nearest_int, put_u16

KMAP_SIZE = 43692  # one past the largest u of 8 levels 0..2 (2 bits each), as ggml's kmap_size
NWANT = 3  # distinct distances of neighbours iq2xs_init_impl keeps for the IQ1 grid
GROUP_MAX_EPS_IQ1_S = np.float32(1e-12)
GROUP_MAX_EPS_IQ1_M = np.float32(1e-7)
_HALF = np.float32(0.5)
_FIFTEEN = np.float32(15)
_IQ1_S_D = np.float32(1.125)  # ggml's fudge factors on d
_IQ1_M_D = np.float32(1.1125)
_FLT_MAX = np.float32(3.4028234663852886e38)
IQ1_S_BYTES = GGML_TYPES["IQ1_S"].type_size
IQ1_M_BYTES = GGML_TYPES["IQ1_M"].type_size
# IQ1_M's delta signs of a sub-block's two groups by its shift k (+,+ / +,- / -,+ / -,-)
_M_MASKS = np.array([0x00, 0x80, 0x08, 0x88], np.int64)


def _values(delta):
    """ggml's x_p and x_m: the three values shifted up and down by delta."""
    plus = np.array([np.float32(-1) + delta, delta, np.float32(1) + delta], np.float32)
    minus = np.array([np.float32(-1) - delta, -delta, np.float32(1) - delta], np.float32)
    return plus, minus


S_PLUS, S_MINUS = _values(IQ1S_DELTA)
M_PLUS, M_MINUS = _values(IQ1M_DELTA)

_tables = None
_tables_lock = threading.Lock()


def grid_tables():
    """The IQ1 grid's (pos, kmap, kneighbours), built on first use and kept."""
    global _tables
    with _tables_lock:
        if _tables is None:
            levels = IQ1S_GRID.astype("<u8").view(np.int8).reshape(-1, 8).astype(np.int64) + 1
            _tables = build_grid_tables(levels, 2, KMAP_SIZE, NWANT)
        return _tables


# ================================================================== shared steps

@njit(cache=True, error_model="numpy")
def best_neighbour(tables, off, xb, weight, o, scale, xx, L):
    """iq1_find_best_neighbour2 for the group of 8 at `o` (x signed, xx the shifted values),
    whose list starts at kneighbours[off]: the grid index nearest in sum(w * (scale * q - x)**2);
    its levels go to L[o:o+8]."""
    pos, _, neighbours = tables
    best = _FLT_MAX
    index = -1
    for j in range(1, np.int64(neighbours[off]) + 1):
        g = np.int64(neighbours[off + j])
        d2 = F0
        for i in range(8):
            q = xx[(np.int64(pos[g, i]) - 1) // 2]
            diff = np.float32(np.float32(scale * q) - xb[o + i])
            d2 = np.float32(d2 + np.float32(np.float32(weight[o + i] * diff) * diff))
        if d2 < best:
            best = d2
            index = g
    if index < 0:  # ggml then scans the whole grid, reading x past the group: not followed
        raise ValueError("IQ1: no grid neighbour at a finite distance (NaN or inf in the row?)")
    for i in range(8):
        L[o + i] = (np.int64(pos[index, i]) - 1) // 2
    return index


@njit(cache=True, error_model="numpy")
def snap_groups(tables, xb, weight, scale, L, n_groups, values, index):
    """The grid index of each group of 8 levels in L into index (the nearest neighbour when off
    the grid, values[k]: group k's shifted values, x_p or x_m); whether all were on it."""
    _, kmap, _ = tables
    on_grid = True
    for k in range(n_groups):
        u = 0
        for j in range(8):
            u |= np.int64(L[8 * k + j]) << (2 * j)
        g = np.int64(kmap[u])
        if g < 0:
            on_grid = False
            g = best_neighbour(tables, -g - 1, xb, weight, 8 * k, scale, values[k], L)
        index[k] = g
    return on_grid


@njit(cache=True, error_model="numpy")
def refit(tables, xb, weight, n_groups, values, index, scale):
    """The scale refitted to the grid points chosen (ggml's pass after a group left the grid):
    sum(w q x) / sum(w q q), when both are positive."""
    pos = tables[0]
    sumqx = F0
    sumq2 = F0
    for k in range(n_groups):
        xx = values[k]
        for j in range(8):
            w = weight[8 * k + j]
            q = xx[(np.int64(pos[index[k], j]) - 1) // 2]
            sumqx = np.float32(sumqx + np.float32(np.float32(w * q) * xb[8 * k + j]))
            sumq2 = np.float32(sumq2 + np.float32(np.float32(w * q) * q))
    if sumqx > F0 and sumq2 > F0:
        return np.float32(sumqx / sumq2)
    return scale


@njit(cache=True, error_model="numpy")
def weights_of(xb, qw, use_qw, sigma2, weight):
    """weight = qw * sqrt(sigma2 + x**2) with importance weights, else x**2; returns max |x|."""
    vmax = abs(xb[0])
    for i in range(xb.size):
        if use_qw:
            weight[i] = np.float32(qw[i] * np.sqrt(np.float32(sigma2 + np.float32(xb[i] * xb[i]))))
        else:
            weight[i] = np.float32(xb[i] * xb[i])
        if i:
            a = abs(xb[i])
            vmax = vmax if vmax > a else a
    return vmax


@njit(cache=True, error_model="numpy")
def set_levels(order, i1, i2, L):
    """Levels 0 / 1 / 2 for the values below sorted place i1 / below i2 / the rest."""
    for j in range(order.size):
        L[order[j]] = 0 if j < i1 else 1 if j < i2 else 2


@njit(cache=True, error_model="numpy")
def scale_index(iscale, scale):
    """The 3-bit sub-block scale: nearest_int(0.5 * (scale / d - 1)), in 0..7."""
    l = nearest_int(np.float32(_HALF * np.float32(np.float32(iscale * scale) - F1)))
    return max(0, min(7, l))


# ================================================================== IQ1_S

@njit(cache=True, error_model="numpy")
def iq1_s_split(xb, weight, sumx, sumw):
    """The best (i1, i2, shift, scale) of the exhaustive split search of 32 sorted values
    (shift 1: x_p, -1: x_m; i1 < 0 if none scores)."""
    best_score = -_FLT_MAX
    scale = F0
    besti1 = besti2 = -1
    best_shift = 0
    for i1 in range(33):
        for i2 in range(i1, 33):
            a = np.float32(sumx[i1] - sumx[0])
            b = np.float32(sumx[i2] - sumx[i1])
            c = np.float32(sumx[32] - sumx[i2])
            wa = np.float32(sumw[i1] - sumw[0])
            wb = np.float32(sumw[i2] - sumw[i1])
            wc = np.float32(sumw[32] - sumw[i2])
            for shift in (1, -1):
                xx = S_PLUS if shift == 1 else S_MINUS
                sumqx = np.float32(np.float32(np.float32(a * xx[0]) + np.float32(b * xx[1]))
                                   + np.float32(c * xx[2]))
                sumq2 = np.float32(np.float32(np.float32(np.float32(wa * xx[0]) * xx[0])
                                              + np.float32(np.float32(wb * xx[1]) * xx[1]))
                                   + np.float32(np.float32(wc * xx[2]) * xx[2]))
                if sumq2 > F0 and np.float32(sumqx * sumqx) > np.float32(best_score * sumq2):
                    scale = np.float32(sumqx / sumq2)
                    best_score = np.float32(scale * sumqx)
                    besti1 = i1
                    besti2 = i2
                    best_shift = shift
    return besti1, besti2, best_shift, scale


@njit(cache=True, error_model="numpy")
def iq1_s_sub_block(tables, xb, weight, scratch, index):
    """One sub-block of 32 (weights set): (found, scale, shift), the 4 grid indices in index
    (not found: no split scores, the sub-block stays zero)."""
    L, sumx, sumw = scratch
    order = np.argsort(xb, kind="mergesort")
    sumx[0] = F0
    sumw[0] = F0
    for j in range(32):
        i = order[j]
        sumx[j + 1] = np.float32(sumx[j] + np.float32(weight[i] * xb[i]))
        sumw[j + 1] = np.float32(sumw[j] + weight[i])
    i1, i2, shift, scale = iq1_s_split(xb, weight, sumx, sumw)
    if i1 < 0 or i2 < 0 or shift == 0:
        return False, F0, 1
    set_levels(order, i1, i2, L)
    if scale < F0:
        for j in range(32):
            L[j] = 2 - L[j]
        scale = -scale
        shift = -shift
    xx = S_PLUS if shift == 1 else S_MINUS
    values = (xx, xx, xx, xx)
    if not snap_groups(tables, xb, weight, scale, L, 4, values, index):
        scale = refit(tables, xb, weight, 4, values, index, scale)
    return True, scale, shift


@njit(cache=True, error_model="numpy")
def iq1_s_block(tables, xbl, qw, out, o, scratch):
    """quantize_row_iq1_s_impl for one super-block, written to out[o:o + 50]."""
    weight, scales, shifts, qh, index, sub = scratch
    out[o:o + IQ1_S_BYTES] = 0
    sigma2 = block_sigma2(xbl)
    max_scale = F0
    for ib in range(8):
        xb = xbl[32 * ib:32 * ib + 32]
        vmax = weights_of(xb, qw[32 * ib:], True, sigma2, weight)
        scales[ib] = F0
        shifts[ib] = 1
        qh[ib] = 0
        if vmax < GROUP_MAX_EPS_IQ1_S:
            continue
        found, scale, shift = iq1_s_sub_block(tables, xb, weight, sub, index)
        if not found:
            continue
        for k in range(4):
            out[o + 2 + 4 * ib + k] = index[k] & 255
            qh[ib] |= (index[k] >> 8) << (3 * k)
        scales[ib] = scale
        shifts[ib] = shift
        max_scale = max_scale if max_scale > scale else scale
    if max_scale > F0:
        d = np.float32(max_scale / _FIFTEEN)
        put_u16(out, o, fp32_to_fp16(np.float32(d * _IQ1_S_D)))
        iscale = np.float32(F1 / d)
        for ib in range(8):
            qh[ib] |= (scale_index(iscale, scales[ib]) | (8 if shifts[ib] == -1 else 0)) << 12
    for ib in range(8):
        put_u16(out, o + 34 + 2 * ib, qh[ib])


@njit(cache=True, nogil=True, error_model="numpy")
def iq1_s_kernel(x, qw, out, tables):
    scratch = (np.zeros(32, np.float32), np.zeros(8, np.float32), np.zeros(8, np.int64),
               np.zeros(8, np.int64), np.zeros(4, np.int64),
               (np.zeros(32, np.int64), np.zeros(33, np.float32), np.zeros(33, np.float32)))
    for r in range(x.shape[0]):
        for ibl in range(x.shape[1] // 256):
            iq1_s_block(tables, x[r, 256 * ibl:256 * ibl + 256], qw[256 * ibl:], out[r],
                        IQ1_S_BYTES * ibl, scratch)


def iq1_s_rows(x, qw, use_qw, out):
    """quantize_iq1_s (importance weights required, as in ggml)."""
    if not use_qw:
        raise ValueError("IQ1_S needs an importance matrix (ggml quantizes it only with one)")
    iq1_s_kernel(x, qw, out, grid_tables())


# ================================================================== IQ1_M

@njit(cache=True, error_model="numpy")
def iq1_m_prefix(xb, weight, order, px, pw):
    """Prefix sums of w * x and w over the sorted values, kept per half of the 16 (each half
    has its own shift)."""
    for h in range(2):
        px[h, 0] = F0
        pw[h, 0] = F0
    for j in range(16):
        i = order[j]
        h = 0 if i < 8 else 1
        px[h, j + 1] = np.float32(px[h, j] + np.float32(weight[i] * xb[i]))
        px[1 - h, j + 1] = px[1 - h, j]
        pw[h, j + 1] = np.float32(pw[h, j] + weight[i])
        pw[1 - h, j + 1] = pw[1 - h, j]


@njit(cache=True, error_model="numpy")
def _sq(a):
    return np.float32(a * a)


@njit(cache=True, error_model="numpy")
def iq1_m_split(px, pw):
    """The best (i1, i2, k, scale) of the exhaustive split search of 16 sorted values, k the
    halves' shifts (0: +,+  1: +,-  2: -,+  3: -,-; i1 < 0 if none scores)."""
    p2 = M_PLUS[2]
    m2 = M_MINUS[2]
    cp1 = np.float32(_sq(M_PLUS[0]) - _sq(M_PLUS[1]))
    cp2 = np.float32(_sq(M_PLUS[1]) - _sq(M_PLUS[2]))
    cm1 = np.float32(_sq(M_MINUS[0]) - _sq(M_MINUS[1]))
    cm2 = np.float32(_sq(M_MINUS[1]) - _sq(M_MINUS[2]))
    best_score = -_FLT_MAX
    scale = F0
    besti1 = besti2 = best_k = -1
    qx = np.zeros((2, 2), np.float32)  # [half, minus]
    q2 = np.zeros((2, 2), np.float32)
    for i1 in range(17):
        for i2 in range(i1, 17):
            for h in range(2):
                sx = np.float32(px[h, i1] + px[h, i2])
                qx[h, 0] = np.float32(np.float32(px[h, 16] * p2) - sx)
                qx[h, 1] = np.float32(np.float32(px[h, 16] * m2) - sx)
                q2[h, 0] = np.float32(np.float32(np.float32(np.float32(pw[h, 16] * p2) * p2)
                                                 + np.float32(pw[h, i1] * cp1))
                                      + np.float32(pw[h, i2] * cp2))
                q2[h, 1] = np.float32(np.float32(np.float32(np.float32(pw[h, 16] * m2) * m2)
                                                 + np.float32(pw[h, i1] * cm1))
                                      + np.float32(pw[h, i2] * cm2))
            for k in range(4):
                sumqx = np.float32(qx[0, k >> 1] + qx[1, k & 1])
                sumq2 = np.float32(q2[0, k >> 1] + q2[1, k & 1])
                if sumq2 > F0 and np.float32(sumqx * sumqx) > np.float32(best_score * sumq2):
                    scale = np.float32(sumqx / sumq2)
                    best_score = np.float32(scale * sumqx)
                    besti1 = i1
                    besti2 = i2
                    best_k = k
    return besti1, besti2, best_k, scale


@njit(cache=True, error_model="numpy")
def _m_values(k):
    """The shifted values of a sub-block's two groups for shifts k."""
    return (M_PLUS if k < 2 else M_MINUS, M_PLUS if k % 2 == 0 else M_MINUS)


@njit(cache=True, error_model="numpy")
def iq1_m_sub_block(tables, xb, weight, scratch, index):
    """One sub-block of 16 (weights set): (found, scale, k), the 2 grid indices in index."""
    L, px, pw = scratch
    order = np.argsort(xb, kind="mergesort")
    iq1_m_prefix(xb, weight, order, px, pw)
    i1, i2, k, scale = iq1_m_split(px, pw)
    if i1 < 0 or i2 < 0 or k < 0:
        return False, F0, 0
    set_levels(order, i1, i2, L)
    if scale < F0:
        for j in range(16):
            L[j] = 2 - L[j]
        scale = -scale
        k = 3 - k
    values = _m_values(k)
    if not snap_groups(tables, xb, weight, scale, L, 2, values, index):
        scale = refit(tables, xb, weight, 2, values, index, scale)
    return True, scale, k


@njit(cache=True, error_model="numpy")
def iq1_m_final_d(tables, xbl, qw, use_qw, sigma2, out, o, fields, d):
    """The 3-bit scales and delta signs written, then d refitted to the whole block as ggml
    does: sum(w q x) / sum(w q q) with q = shifted value * (2 * scale + 1)."""
    weight, scales, shifts, qh, sc = fields
    pos = tables[0]
    iscale = np.float32(F1 / d)
    sumqx = F0
    sumq2 = F0
    for ib in range(16):
        l = scale_index(iscale, scales[ib])
        sc[ib // 4] |= l << (3 * (ib % 4))
        qh[ib] |= _M_MASKS[shifts[ib]]
        xb = xbl[16 * ib:16 * ib + 16]
        weights_of(xb, qw[16 * ib:] if use_qw else qw, use_qw, sigma2, weight)
        values = _m_values(shifts[ib])
        for k in range(2):
            g = np.int64(out[o + 2 * ib + k]) + ((qh[ib] << (8 - 4 * k)) & 0x700)
            xx = values[k]
            for j in range(8):
                w = weight[8 * k + j]
                q = np.float32(xx[(np.int64(pos[g, j]) - 1) // 2] * np.float32(2 * l + 1))
                sumqx = np.float32(sumqx + np.float32(np.float32(w * q) * xb[8 * k + j]))
                sumq2 = np.float32(sumq2 + np.float32(np.float32(w * q) * q))
    return np.float32(sumqx / sumq2) if sumq2 > F0 else d


@njit(cache=True, error_model="numpy")
def iq1_m_block(tables, xbl, qw, use_qw, out, o, scratch):
    """quantize_row_iq1_m_impl for one super-block, written to out[o:o + 56]."""
    fields, index, sub = scratch
    weight, scales, shifts, qh, sc = fields
    out[o:o + IQ1_M_BYTES] = 0
    qh[:] = 0
    sc[:] = 0
    sigma2 = block_sigma2(xbl)
    max_scale = F0
    for ib in range(16):
        xb = xbl[16 * ib:16 * ib + 16]
        vmax = weights_of(xb, qw[16 * ib:] if use_qw else qw, use_qw, sigma2, weight)
        scales[ib] = F0
        shifts[ib] = 0
        if vmax < GROUP_MAX_EPS_IQ1_M:
            continue
        found, scale, k = iq1_m_sub_block(tables, xb, weight, sub, index)
        if not found:
            continue
        out[o + 2 * ib] = index[0] & 255
        out[o + 2 * ib + 1] = index[1] & 255
        qh[ib] = (index[0] >> 8) | ((index[1] >> 8) << 4)
        scales[ib] = scale
        shifts[ib] = k
        max_scale = max_scale if max_scale > scale else scale
    if max_scale > F0:
        d = iq1_m_final_d(tables, xbl, qw, use_qw, sigma2, out, o, fields,
                          np.float32(max_scale / _FIFTEEN))
        s = fp32_to_fp16(np.float32(d * _IQ1_M_D))
        sc[0] |= (s & 0x000F) << 12
        sc[1] |= (s & 0x00F0) << 8
        sc[2] |= (s & 0x0F00) << 4
        sc[3] |= s & 0xF000
    for ib in range(16):
        out[o + 32 + ib] = qh[ib]
    for j in range(4):
        put_u16(out, o + 48 + 2 * j, sc[j])


@njit(cache=True, nogil=True, error_model="numpy")
def iq1_m_kernel(x, qw, use_qw, out, tables):
    fields = (np.zeros(16, np.float32), np.zeros(16, np.float32), np.zeros(16, np.int64),
              np.zeros(16, np.int64), np.zeros(4, np.int64))
    scratch = (fields, np.zeros(2, np.int64),
               (np.zeros(16, np.int64), np.zeros((2, 17), np.float32),
                np.zeros((2, 17), np.float32)))
    for r in range(x.shape[0]):
        for ibl in range(x.shape[1] // 256):
            iq1_m_block(tables, x[r, 256 * ibl:256 * ibl + 256], qw[256 * ibl:] if use_qw else qw,
                        use_qw, out[r], IQ1_M_BYTES * ibl, scratch)


def iq1_m_rows(x, qw, use_qw, out):
    """quantize_iq1_m, with or without importance weights."""
    iq1_m_kernel(x, qw, use_qw, out, grid_tables())
