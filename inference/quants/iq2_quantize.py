"""Row quantizers for IQ2_XXS, IQ2_XS and IQ2_S (ggml-quants.c's quantize_row_iq2_xxs_impl,
_xs_impl and _s_impl); their classes are in `iq2.py`.

Each group of 8 values is quantized to levels 0..2 (value 2*l + 1) and snapped onto the type's
grid: `kmap[u]` (u: the 8 levels, 2 bits each) is the grid point of those levels, or, for a
point off the grid, -(1 + offset) of its list of nearest grid points in `kneighbours` (a count,
then the indices), of which the one nearest in the weighted distance wins. `grid_tables` builds
these as ggml's iq2xs_init_impl does, once per type and process (a fraction of a second; they
are kept in memory, as ggml keeps them until ggml_quantize_free).

ggml quantizes IQ2_XXS and IQ2_XS only with importance weights (it asserts them); IQ2_S
without them weights each value by sigma2 / 4 + x**2. The C is followed operation by operation
in float32 (see `numeric`): the bytes are ggml_quantize_chunk's.
"""
import threading

import numpy as np
from numba import njit

from ..catalog import GGML_TYPES
from .grids import IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID
from .numeric import F0, F1, GROUP_MAX_EPS, fp32_to_fp16, nearest_int, put_u16
from .search import make_qp_quants

# the grid magnitudes 8, 25, 43 are levels 0, 1, 2 (value 2*l + 1 in the quantizers' units)
GRID_BYTES = (0x08, 0x19, 0x2B)
KMAP_SIZE = 43692  # one past the largest u of levels 0..2 (0xAAAA), as ggml's kmap_size
K_MAX_Q = 3
GROUP_MAX_EPS_IQ2_S = np.float32(1e-8)
_HALF = np.float32(0.5)
_TENTH = np.float32(0.1)
_QUARTER = np.float32(0.25)
_IQ2_S_D = np.float32(0.9875)  # IQ2_S stores d a little smaller than max_scale / 31
_FAR = 1 << 30  # above any squared distance of two grid points
_FLT_MAX = np.float32(3.4028234663852886e38)
IQ2_XXS_BYTES = GGML_TYPES["IQ2_XXS"].type_size
IQ2_XS_BYTES = GGML_TYPES["IQ2_XS"].type_size
IQ2_S_BYTES = GGML_TYPES["IQ2_S"].type_size


# ================================================================== grid map and neighbours

def grid_levels(grid: np.ndarray) -> np.ndarray:
    """(n, 8) int64: the levels 0..2 of each grid point (ggml's kgrid_2bit_* unpacked)."""
    magnitudes = grid.view(np.uint8).reshape(-1, 8)
    levels = np.searchsorted(np.array(GRID_BYTES, np.uint8), magnitudes).astype(np.int64)
    assert np.array_equal(np.array(GRID_BYTES, np.uint8)[levels], magnitudes)
    return levels


@njit(cache=True)
def _nearest(pos, u, nwant, d2, flat):
    """Appends to `flat` the grid points at the `nwant` smallest squared distances from u's
    point (levels 2 bits each), in ggml's order (distance, then index); returns their count."""
    for j in range(pos.shape[0]):
        s = 0
        for k in range(8):
            diff = pos[j, k] - (2 * ((u >> (2 * k)) & 3) + 1)
            s += diff * diff
        d2[j] = s
    count = 0
    last = -1
    for _ in range(nwant):
        best = _FAR
        for j in range(pos.shape[0]):
            if last < d2[j] < best:
                best = d2[j]
        if best == _FAR:
            break
        for j in range(pos.shape[0]):
            if d2[j] == best:
                flat.append(j)
                count += 1
        last = best
    return count


@njit(cache=True)
def _neighbours(pos, kmap, nwant):
    """kneighbours as ggml stores it: for every u off the grid, the count of its nearest grid
    points, then their indices; kmap[u] becomes -(1 + offset of the count)."""
    d2 = np.empty(pos.shape[0], np.int64)
    flat = [0]  # a list of ints (numba types it from its first item)
    flat.pop()
    for u in range(KMAP_SIZE):
        if kmap[u] < 0:
            kmap[u] = -(len(flat) + 1)
            flat.append(0)
            flat[-kmap[u] - 1] = _nearest(pos, u, nwant, d2, flat)
    return np.array(flat, np.uint16)


def build_grid_tables(grid: np.ndarray, nwant: int):
    """iq2xs_init_impl: (pos (n, 8) float32 grid values 2*l + 1, kmap int32, kneighbours
    uint16)."""
    levels = grid_levels(grid)
    kmap = np.full(KMAP_SIZE, -1, np.int32)
    kmap[(levels << (2 * np.arange(8))).sum(axis=1)] = np.arange(len(levels), dtype=np.int32)
    pos = 2 * levels + 1
    neighbours = _neighbours(pos, kmap, nwant)
    return pos.astype(np.float32), kmap, neighbours


# type -> (grid, how many distinct distances iq2xs_init_impl keeps)
_GRIDS = {"IQ2_XXS": (IQ2XXS_GRID, 2), "IQ2_XS": (IQ2XS_GRID, 2), "IQ2_S": (IQ2S_GRID, 1)}
_tables: dict = {}
_tables_lock = threading.Lock()


def grid_tables(type_name: str):
    """The type's (pos, kmap, kneighbours), built on first use and kept."""
    with _tables_lock:
        if type_name not in _tables:
            _tables[type_name] = build_grid_tables(*_GRIDS[type_name])
        return _tables[type_name]


# ================================================================== shared steps

@njit(cache=True, error_model="numpy")
def best_neighbour(tables, off, xval, waux, o, scale, L):
    """iq2_find_best_neighbour for the group of 8 at `o`, whose list starts at kneighbours[off]:
    the grid index nearest in sum(waux * (scale * q - x)**2); its levels go to L[o:o+8]."""
    pos, _, neighbours = tables
    best_d2 = _FLT_MAX
    index = -1
    for j in range(1, np.int64(neighbours[off]) + 1):
        g = np.int64(neighbours[off + j])
        d2 = F0
        for i in range(8):
            diff = np.float32(np.float32(scale * pos[g, i]) - xval[o + i])
            d2 = np.float32(d2 + np.float32(np.float32(waux[o + i] * diff) * diff))
        if d2 < best_d2:
            best_d2 = d2
            index = g
    for i in range(8):
        L[o + i] = (np.int64(pos[index, i]) - 1) // 2
    return index


@njit(cache=True, error_model="numpy")
def snap_group(tables, xval, waux, o, iscale, scale, L):
    """Levels of the 8 values at `o` for inverse scale `iscale` into L[o:o+8], snapped onto the
    grid (nearest neighbour at `scale` when off it): (grid index, whether it was on the grid)."""
    _, kmap, _ = tables
    u = 0
    for i in range(8):
        l = nearest_int(np.float32(_HALF * np.float32(np.float32(iscale * xval[o + i]) - F1)))
        l = max(0, min(K_MAX_Q - 1, l))
        L[o + i] = l
        u |= l << (2 * i)
    index = np.int64(kmap[u])
    if index >= 0:
        return index, True
    return best_neighbour(tables, -index - 1, xval, waux, o, scale, L), False


@njit(cache=True, error_model="numpy")
def grid_index_of(tables, L, o):
    """The grid index of the levels L[o:o+8] (ggml aborts when they are off the grid)."""
    _, kmap, _ = tables
    u = 0
    for i in range(8):
        u |= np.int64(L[o + i]) << (2 * i)
    return np.int64(kmap[u])


@njit(cache=True, error_model="numpy")
def fit(weight, xval, L, n):
    """sum(w * x * q) and sum(w * q * q) over n values, q = 2 * L + 1."""
    sumqx = F0
    sumq2 = F0
    for i in range(n):
        w = weight[i]
        q = np.float32(2 * np.int64(L[i]) + 1)
        sumqx = np.float32(sumqx + np.float32(np.float32(w * xval[i]) * q))
        sumq2 = np.float32(sumq2 + np.float32(np.float32(w * q) * q))
    return sumqx, sumq2


@njit(cache=True, error_model="numpy")
def abs_and_signs(xb, weight, xval, k, even):
    """xval[8k:8k+8] = |xb[8k:8k+8]|; returns the sign bits. With `even` (XXS, XS: 7 stored
    bits), an odd count of minus signs flips the value of least w * x**2."""
    nflip = 0
    s = 0
    for i in range(8):
        if xb[8 * k + i] >= F0:
            xval[8 * k + i] = xb[8 * k + i]
        else:
            xval[8 * k + i] = -xb[8 * k + i]
            nflip += 1
            s |= 1 << i
    if even and nflip % 2:
        imin = 0
        vmin = np.float32(np.float32(weight[8 * k] * xb[8 * k]) * xb[8 * k])
        for i in range(1, 8):
            ax = np.float32(np.float32(weight[8 * k + i] * xb[8 * k + i]) * xb[8 * k + i])
            if ax < vmin:
                vmin = ax
                imin = i
        xval[8 * k + imin] = -xval[8 * k + imin]
        s ^= 1 << imin
    return s & 127 if even else s


@njit(cache=True, error_model="numpy")
def sum_squares(xbl):
    """sum(x**2) over the 256 values of a super-block, in ggml's order."""
    sumx2 = F0
    for i in range(256):
        sumx2 = np.float32(sumx2 + np.float32(xbl[i] * xbl[i]))
    return sumx2


@njit(cache=True, error_model="numpy")
def importance(weight, waux, xb, qw, o, n, sigma2):
    """weight = qw * sqrt(sigma2 + x**2) over n values (qw from o), waux = sqrt(weight)."""
    for i in range(n):
        weight[i] = np.float32(qw[o + i] * np.sqrt(np.float32(sigma2 + np.float32(xb[i] * xb[i]))))
        waux[i] = np.sqrt(weight[i])


@njit(cache=True, error_model="numpy")
def plain_weights(weight, waux, xb, sigma2):
    """IQ2_S without importance weights: weight = sigma2 / 4 + x**2 over 16 values, waux =
    sqrt(weight)."""
    for i in range(16):
        weight[i] = np.float32(np.float32(_QUARTER * sigma2) + np.float32(xb[i] * xb[i]))
        waux[i] = np.sqrt(weight[i])


@njit(cache=True, error_model="numpy")
def group_max(xval, n):
    """The largest of xval[:n] by C's MAX (a > b ? a : b, so NaNs fall as they do in ggml)."""
    vmax = xval[0]
    for i in range(1, n):
        vmax = vmax if vmax > xval[i] else xval[i]
    return vmax


@njit(cache=True, error_model="numpy")
def scale_nibble(iscale, scale):
    """The 4-bit sub-block scale: nearest_int((iscale * scale - 1) / 2) clamped to 0..15."""
    l = nearest_int(np.float32(_HALF * np.float32(np.float32(iscale * scale) - F1)))
    return max(0, min(15, l))


# ================================================================== IQ2_XXS

@njit(cache=True, error_model="numpy")
def iq2_xxs_sub_block(tables, xval, weight, waux, L, Laux):
    """The scale of one sub-block of 32 (levels in L), as the loop body of
    quantize_row_iq2_xxs_impl: make_qp_quants' scale, 13 trial scales around it, a final snap."""
    if group_max(xval, 32) < GROUP_MAX_EPS:
        return F0, False
    scale = make_qp_quants(32, K_MAX_Q + 1, xval, L, weight)
    eff_max = np.float32(scale * np.float32(K_MAX_Q))
    if eff_max <= F0:
        return F0, False
    best = F0
    for step in range(-6, 7):
        iscale = np.float32(np.float32(np.float32(2 * K_MAX_Q - 1)
                                       + np.float32(np.float32(step) * _TENTH)) / eff_max)
        this_scale = np.float32(F1 / iscale)
        for k in range(4):
            snap_group(tables, xval, waux, 8 * k, iscale, this_scale, Laux)
        sumqx, sumq2 = fit(weight, xval, Laux, 32)
        if sumq2 > F0 and np.float32(sumqx * sumqx) > np.float32(best * sumq2):
            scale = np.float32(sumqx / sumq2)
            best = np.float32(scale * sumqx)
            L[:] = Laux
    if scale > F0:
        iscale = np.float32(F1 / scale)
        for k in range(4):
            snap_group(tables, xval, waux, 8 * k, iscale, scale, L)
        sumqx, sumq2 = fit(weight, xval, L, 32)
        if sumq2 > F0:
            scale = np.float32(sumqx / sumq2)
    return scale, True


@njit(cache=True, error_model="numpy")
def iq2_xxs_block(tables, xbl, qw, out, o):
    weight = np.empty(32, np.float32)
    waux = np.empty(32, np.float32)
    xval = np.empty(32, np.float32)
    L = np.zeros(32, np.uint8)
    Laux = np.zeros(32, np.uint8)
    signs = np.zeros(4, np.int64)
    q2 = np.zeros(16, np.int64)
    scales = np.zeros(8, np.float32)
    sigma2 = np.float32(sum_squares(xbl) / np.float32(256))
    max_scale = F0
    for ib in range(8):
        xb = xbl[32 * ib:32 * ib + 32]
        importance(weight, waux, xb, qw, 32 * ib, 32, sigma2)
        for k in range(4):
            signs[k] = abs_and_signs(xb, weight, xval, k, True)
        scale, nonzero = iq2_xxs_sub_block(tables, xval, weight, waux, L, Laux)
        if not nonzero:
            scales[ib] = F0
            continue
        if scale < F0:
            scale = -scale
            for k in range(4):
                signs[k] = ~signs[k] & 127
        for k in range(4):
            q2[2 * ib] |= grid_index_of(tables, L, 8 * k) << (8 * k)
            q2[2 * ib + 1] |= signs[k] << (7 * k)
        scales[ib] = scale
        max_scale = max_scale if max_scale > scale else scale
    put_iq2_xxs(out, o, q2, scales, max_scale)


@njit(cache=True, error_model="numpy")
def put_iq2_xxs(out, o, q2, scales, max_scale):
    """d = max_scale / 31 and q2[16] (u32, the sub-blocks' scales added in their top bits) as
    block_iq2_xxs at out[o]; all zeros when max_scale is 0."""
    out[o:o + IQ2_XXS_BYTES] = 0
    if max_scale == F0:
        return
    d = np.float32(max_scale / np.float32(31))
    put_u16(out, o, fp32_to_fp16(d))
    iscale = np.float32(F1 / d)
    for ib in range(8):
        q2[2 * ib + 1] |= scale_nibble(iscale, scales[ib]) << 28
    for j in range(16):
        for b in range(4):
            out[o + 2 + 4 * j + b] = (q2[j] >> (8 * b)) & 0xFF


@njit(cache=True, nogil=True, error_model="numpy")
def iq2_xxs_kernel(x, qw, out, tables):
    for r in range(x.shape[0]):
        for ibl in range(x.shape[1] // 256):
            iq2_xxs_block(tables, x[r, 256 * ibl:256 * ibl + 256], qw[256 * ibl:],
                          out[r], IQ2_XXS_BYTES * ibl)


def iq2_xxs_rows(x, qw, use_qw, out):
    """quantize_iq2_xxs (importance weights required, as in ggml)."""
    if not use_qw:
        raise ValueError("IQ2_XXS needs an importance matrix (ggml quantizes it only with one)")
    iq2_xxs_kernel(x, qw, out, grid_tables("IQ2_XXS"))


# ================================================================== IQ2_XS and IQ2_S

@njit(cache=True, error_model="numpy")
def iq2_16_sub_block(tables, xval, weight, waux, L, Laux):
    """The scale of one sub-block of 16 (levels in L), as the loop body of
    quantize_row_iq2_xs_impl / _s_impl: 19 trial scales around max / 5, then the groups left
    off the grid snapped again at the chosen scale."""
    vmax = group_max(xval, 16)
    L[:] = 0
    best = F0
    scale = np.float32(vmax / np.float32(2 * K_MAX_Q - 1))
    on_grid0 = True
    on_grid1 = True
    for step in range(-9, 10):
        iscale = np.float32(np.float32(np.float32(2 * K_MAX_Q - 1)
                                       + np.float32(np.float32(step) * _TENTH)) / vmax)
        this_scale = np.float32(F1 / iscale)
        _, aux0 = snap_group(tables, xval, waux, 0, iscale, this_scale, Laux)
        _, aux1 = snap_group(tables, xval, waux, 8, iscale, this_scale, Laux)
        sumqx, sumq2 = fit(weight, xval, Laux, 16)
        if sumq2 > F0 and np.float32(sumqx * sumqx) > np.float32(best * sumq2):
            scale = np.float32(sumqx / sumq2)
            best = np.float32(scale * sumqx)
            L[:] = Laux
            on_grid0 = aux0
            on_grid1 = aux1
    if (not on_grid0 or not on_grid1) and scale > F0:
        iscale = np.float32(F1 / scale)
        if not on_grid0:
            snap_group(tables, xval, waux, 0, iscale, scale, L)
        if not on_grid1:
            snap_group(tables, xval, waux, 8, iscale, scale, L)
        sumqx, sumq2 = fit(weight, xval, L, 16)
        if sumq2 > F0:
            scale = np.float32(sumqx / sumq2)
    return scale


@njit(cache=True, error_model="numpy")
def iq2_16_block(tables, xbl, qw, use_qw, is_s, fields):
    """The sub-blocks of 16 of one super-block of IQ2_XS (is_s False) or IQ2_S: fills
    `fields` = (scales[16] float32, grid[32], signs[32]: per sub-block, and per group of 8) and
    returns max_scale; a sub-block left at zero has grid -1 at its first group."""
    scales, grid, signs = fields
    weight = np.empty(16, np.float32)
    waux = np.empty(16, np.float32)
    xval = np.empty(16, np.float32)
    L = np.zeros(16, np.int64)
    Laux = np.zeros(16, np.int64)
    sumx2 = sum_squares(xbl)
    if is_s:
        sigma2 = np.float32(np.float32(np.float32(2) * sumx2) / np.float32(256))
    else:
        sigma2 = np.float32(sumx2 / np.float32(256))
    eps = GROUP_MAX_EPS_IQ2_S if is_s else GROUP_MAX_EPS
    max_scale = F0
    for ib in range(16):
        xb = xbl[16 * ib:16 * ib + 16]
        if use_qw:
            importance(weight, waux, xb, qw, 16 * ib, 16, sigma2)
        else:
            plain_weights(weight, waux, xb, sigma2)
        for k in range(2):
            signs[2 * ib + k] = abs_and_signs(xb, weight, xval, k, not is_s)
        if group_max(xval, 16) < eps:
            scales[ib] = F0
            grid[2 * ib] = -1
            continue
        scale = iq2_16_sub_block(tables, xval, weight, waux, L, Laux)
        if scale < F0:
            scale = -scale
            for k in range(2):
                signs[2 * ib + k] = ~signs[2 * ib + k] & (127 if not is_s else 255)
        for k in range(2):
            grid[2 * ib + k] = grid_index_of(tables, L, 8 * k)
        scales[ib] = scale
        max_scale = max_scale if max_scale > scale else scale
    return max_scale


@njit(cache=True, error_model="numpy")
def put_scales(out, o, scales, iscale):
    """scales[8] at out[o]: two 4-bit sub-block scales a byte, the even one low."""
    for ib in range(16):
        l = scale_nibble(iscale, scales[ib])
        if ib % 2 == 0:
            out[o + ib // 2] = l
        else:
            out[o + ib // 2] |= l << 4


@njit(cache=True, error_model="numpy")
def iq2_xs_block(tables, xbl, qw, out, o):
    fields = (np.zeros(16, np.float32), np.zeros(32, np.int64), np.zeros(32, np.int64))
    max_scale = iq2_16_block(tables, xbl, qw, True, False, fields)
    scales, grid, signs = fields
    out[o:o + IQ2_XS_BYTES] = 0
    if max_scale == F0:
        return
    for j in range(32):
        if grid[j - j % 2] >= 0:  # a sub-block below GROUP_MAX_EPS keeps its zeros
            put_u16(out, o + 2 + 2 * j, grid[j] | (signs[j] << 9))
    d = np.float32(max_scale / np.float32(31))
    put_u16(out, o, fp32_to_fp16(d))
    put_scales(out, o + 66, scales, np.float32(F1 / d))


@njit(cache=True, nogil=True, error_model="numpy")
def iq2_xs_kernel(x, qw, out, tables):
    for r in range(x.shape[0]):
        for ibl in range(x.shape[1] // 256):
            iq2_xs_block(tables, x[r, 256 * ibl:256 * ibl + 256], qw[256 * ibl:],
                         out[r], IQ2_XS_BYTES * ibl)


def iq2_xs_rows(x, qw, use_qw, out):
    """quantize_iq2_xs (importance weights required, as in ggml)."""
    if not use_qw:
        raise ValueError("IQ2_XS needs an importance matrix (ggml quantizes it only with one)")
    iq2_xs_kernel(x, qw, out, grid_tables("IQ2_XS"))


@njit(cache=True, error_model="numpy")
def iq2_s_block(tables, xbl, qw, use_qw, out, o):
    fields = (np.zeros(16, np.float32), np.zeros(32, np.int64), np.zeros(32, np.int64))
    max_scale = iq2_16_block(tables, xbl, qw, use_qw, True, fields)
    scales, grid, signs = fields
    out[o:o + IQ2_S_BYTES] = 0
    for j in range(32):
        if grid[j - j % 2] >= 0:  # written as ggml writes them, even when max_scale is 0
            out[o + 2 + j] = grid[j] & 255
            out[o + 66 + j // 4] |= (grid[j] >> 8) << (2 * (j % 4))
            out[o + 34 + j] = signs[j]
    if max_scale == F0:
        return
    d = np.float32(max_scale / np.float32(31))
    put_u16(out, o, fp32_to_fp16(np.float32(d * _IQ2_S_D)))
    put_scales(out, o + 74, scales, np.float32(F1 / d))


@njit(cache=True, nogil=True, error_model="numpy")
def iq2_s_kernel(x, qw, use_qw, out, tables):
    for r in range(x.shape[0]):
        for ibl in range(x.shape[1] // 256):
            iq2_s_block(tables, x[r, 256 * ibl:256 * ibl + 256], qw[256 * ibl:] if use_qw else qw,
                        use_qw, out[r], IQ2_S_BYTES * ibl)


def iq2_s_rows(x, qw, use_qw, out):
    """quantize_iq2_s, with or without importance weights."""
    iq2_s_kernel(x, qw, use_qw, out, grid_tables("IQ2_S"))
