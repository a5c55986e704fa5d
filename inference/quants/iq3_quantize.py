"""Row quantizers for IQ3_XXS and IQ3_S (ggml-quants.c's quantize_row_iq3_xxs_impl and
quantize_row_iq3_s_impl); their classes are in `iq3.py`.

Each group of 4 magnitudes is quantized to levels 0..7 (value 2*l + 1) and snapped onto the
type's grid: `kmap[u]` (u: the 4 levels, 3 bits each) is the grid point of those levels, or,
for a point off the grid, -(1 + offset) of its list of nearest grid points in `kneighbours` (a
count, then the indices), of which the one nearest in the weighted distance wins. `grid_tables`
builds these as ggml's iq3xs_init_impl does, once per grid and process (kept in memory, as
ggml keeps them until ggml_quantize_free).

Without importance weights each value is weighted by x**2, with them by
imatrix * sqrt(sigma2 + x**2). The C is followed operation by operation in float32 (see
`numeric`), its quirks included: IQ3_S's packing of qs and signs does not advance past an
all-zero sub-block, so the following sub-blocks' bytes land 8 (4) bytes early, as ggml writes them.
"""
import threading

import numpy as np
from numba import njit

from ..catalog import GGML_TYPES
from .grids import IQ3S_GRID, IQ3XXS_GRID
from .numeric import F0, F1, fp32_to_fp16, nearest_int, put_u16

KMAP_SIZE = 4096  # 4 levels of 3 bits
K_MAX_Q = 8
GROUP_MAX_EPS_IQ3_XXS = np.float32(1e-8)
_HALF = np.float32(0.5)
_FIFTH = np.float32(0.2)
_FIFTEEN = np.float32(2 * K_MAX_Q - 1)
_THIRTY_ONE = np.float32(31)
_XXS_D = np.float32(1.0125)  # ggml's fudge factors on d = max_scale / 31
_S_D = np.float32(1.033)
_FAR = 1 << 30  # above any squared distance of two grid points
_FLT_MAX = np.float32(3.4028234663852886e38)
IQ3_XXS_BYTES = GGML_TYPES["IQ3_XXS"].type_size
IQ3_S_BYTES = GGML_TYPES["IQ3_S"].type_size

# type -> (grid, the grid bytes of levels 0..7 (gguf-py's grid_map), how many distinct distances
# of neighbours iq3xs_init_impl keeps): ggml-common.h's grids hold dequantized magnitudes, the
# quantizer's (iq3xs_init_impl's kgrid_*) their levels
GRID_MAPS = {"IQ3_XXS": (IQ3XXS_GRID, (0x04, 0x0C, 0x14, 0x1C, 0x24, 0x2C, 0x34, 0x3E), 2),
             "IQ3_S": (IQ3S_GRID, (0x01, 0x03, 0x05, 0x07, 0x09, 0x0B, 0x0D, 0x0F), 3)}


# ================================================================== grid map and neighbours

def grid_levels(grid: np.ndarray, grid_map, n_values: int) -> np.ndarray:
    """(n, n_values) int64: the level of each byte of each grid point (the byte's place in
    `grid_map`)."""
    magnitudes = grid.astype(f"<u{n_values}").view(np.uint8).reshape(-1, n_values)
    levels = np.searchsorted(np.array(grid_map, np.uint8), magnitudes).astype(np.int64)
    assert np.array_equal(np.array(grid_map, np.uint8)[levels], magnitudes)
    return levels


@njit(cache=True)
def _neighbours(pos, kmap, nwant, bits):
    """For every u off the grid (u: a level per `bits` bits): its grid points at the `nwant`
    smallest squared distances, in ggml's order (distance, then index), stored as ggml stores
    them (a count, then the indices); kmap[u] becomes -(1 + offset)."""
    n, n_values = pos.shape
    d2 = np.empty(n, np.int64)
    flat = [0]
    flat.pop()
    for u in range(kmap.size):
        if kmap[u] >= 0:
            continue
        for j in range(n):
            s = 0
            for k in range(n_values):
                diff = pos[j, k] - (2 * ((u >> (bits * k)) & ((1 << bits) - 1)) + 1)
                s += diff * diff
            d2[j] = s
        kmap[u] = -(len(flat) + 1)
        start = len(flat)
        flat.append(0)
        last = -1
        for _ in range(nwant):
            best = _FAR
            for j in range(n):
                if last < d2[j] < best:
                    best = d2[j]
            if best == _FAR:
                break
            for j in range(n):
                if d2[j] == best:
                    flat.append(j)
            last = best
        flat[start] = len(flat) - start - 1
    return np.array(flat, np.uint16)


def build_grid_tables(levels: np.ndarray, bits: int, kmap_size: int, nwant: int):
    """iq3xs_init_impl (and iq2xs_init_impl, of which it is the 4-value copy) for a grid of
    levels (n, n_values): (pos (n, n_values) float32 grid values 2*l + 1, kmap int32,
    kneighbours uint16)."""
    kmap = np.full(kmap_size, -1, np.int32)
    kmap[(levels << (bits * np.arange(levels.shape[1]))).sum(axis=1)] = \
        np.arange(len(levels), dtype=np.int32)
    pos = 2 * levels + 1
    neighbours = _neighbours(pos, kmap, nwant, bits)
    return pos.astype(np.float32), kmap, neighbours


_tables: dict = {}
_tables_lock = threading.Lock()


def grid_tables(type_name: str):
    """The type's (pos, kmap, kneighbours), built on first use and kept."""
    with _tables_lock:
        if type_name not in _tables:
            grid, grid_map, nwant = GRID_MAPS[type_name]
            _tables[type_name] = build_grid_tables(grid_levels(grid, grid_map, 4), 3,
                                                   KMAP_SIZE, nwant)
        return _tables[type_name]


# ================================================================== one sub-block of 32

@njit(cache=True, error_model="numpy")
def best_neighbour(tables, off, xval, waux, o, scale, L):
    """iq3_find_best_neighbour for the group of 4 at `o`, whose list starts at kneighbours[off]:
    the grid index nearest in sum(waux * (scale * q - x)**2); its levels go to L[o:o+4]."""
    pos, _, neighbours = tables
    best_d2 = _FLT_MAX
    index = -1
    for j in range(1, np.int64(neighbours[off]) + 1):
        g = np.int64(neighbours[off + j])
        d2 = F0
        for i in range(4):
            diff = np.float32(np.float32(scale * pos[g, i]) - xval[o + i])
            d2 = np.float32(d2 + np.float32(np.float32(waux[o + i] * diff) * diff))
        if d2 < best_d2:
            best_d2 = d2
            index = g
    if index < 0:
        raise ValueError("IQ3: no grid point is nearest (ggml asserts here: NaN in the row?)")
    for i in range(4):
        L[o + i] = (np.int64(pos[index, i]) - 1) // 2
    return index


@njit(cache=True, error_model="numpy")
def snap_group(tables, xval, waux, o, iscale, scale, L):
    """Levels of the 4 values at `o` for inverse scale `iscale` into L[o:o+4], snapped onto the
    grid (nearest neighbour at `scale` when off it): whether they were on the grid."""
    _, kmap, _ = tables
    u = 0
    for i in range(4):
        l = nearest_int(np.float32(_HALF * np.float32(np.float32(iscale * xval[o + i]) - F1)))
        l = max(0, min(K_MAX_Q - 1, l))
        L[o + i] = l
        u |= l << (3 * i)
    index = np.int64(kmap[u])
    if index >= 0:
        return True
    best_neighbour(tables, -index - 1, xval, waux, o, scale, L)
    return False


@njit(cache=True, error_model="numpy")
def grid_index_of(tables, L, o):
    """The grid index of the levels L[o:o+4] (ggml aborts when they are off the grid)."""
    _, kmap, _ = tables
    u = 0
    for i in range(4):
        u |= np.int64(L[o + i]) << (3 * i)
    index = np.int64(kmap[u])
    if index < 0:
        raise ValueError("IQ3: levels off the grid (ggml aborts here)")
    return index


@njit(cache=True, error_model="numpy")
def fit(weight, xval, L):
    """sum(w * x * q) and sum(w * q * q) over the 32 values, q = 2 * L + 1."""
    sumqx = F0
    sumq2 = F0
    for i in range(32):
        w = weight[i]
        q = np.float32(2 * np.int64(L[i]) + 1)
        sumqx = np.float32(sumqx + np.float32(np.float32(w * xval[i]) * q))
        sumq2 = np.float32(sumq2 + np.float32(np.float32(w * q) * q))
    return sumqx, sumq2


@njit(cache=True, error_model="numpy")
def abs_and_signs(xb, weight, xval, k, even):
    """xval[8k:8k+8] = |xb[8k:8k+8]|; returns the sign bits. With `even` (IQ3_XXS: 7 stored
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
def sub_block_weights(xb, qw, use_qw, sigma2, weight, waux):
    """weight = qw * sqrt(sigma2 + x**2) with importance weights, else x**2; waux = sqrt(weight)."""
    for i in range(32):
        if use_qw:
            weight[i] = np.float32(qw[i] * np.sqrt(np.float32(sigma2 + np.float32(xb[i] * xb[i]))))
        else:
            weight[i] = np.float32(xb[i] * xb[i])
        waux[i] = np.sqrt(weight[i])


@njit(cache=True, error_model="numpy")
def search_scale(tables, xval, weight, waux, vmax, is_s, L, scratch):
    """The scale sweep of quantize_row_iq3_*_impl for one sub-block: the best of 31 (IQ3_XXS)
    or 19 (IQ3_S) trial scales around max / 15, then off-grid groups snapped again at it and
    the scale refitted. L gets the levels; returns the scale."""
    Laux, on_grid, on_grid_aux = scratch
    best = F0
    scale = np.float32(vmax / _FIFTEEN)
    for k in range(8):
        on_grid[k] = not is_s
    steps = 9 if is_s else 15
    for step in range(-steps, steps + 1):
        iscale = np.float32(np.float32(_FIFTEEN + np.float32(np.float32(step) * _FIFTH)) / vmax)
        this_scale = np.float32(F1 / iscale)
        for k in range(8):
            on_grid_aux[k] = snap_group(tables, xval, waux, 4 * k, iscale, this_scale, Laux)
        sumqx, sumq2 = fit(weight, xval, Laux)
        if sumq2 > F0 and np.float32(sumqx * sumqx) > np.float32(best * sumq2):
            scale = np.float32(sumqx / sumq2)
            best = np.float32(scale * sumqx)
            L[:] = Laux
            on_grid[:] = on_grid_aux
    n_off_grid = 0
    for k in range(8):
        if not on_grid[k]:
            n_off_grid += 1
    if n_off_grid > 0 and scale > F0:
        iscale = np.float32(F1 / scale)
        for k in range(8):
            if is_s or not on_grid[k]:  # IQ3_S snaps every group again
                snap_group(tables, xval, waux, 4 * k, iscale, scale, L)
        sumqx, sumq2 = fit(weight, xval, L)
        if sumq2 > F0:
            scale = np.float32(sumqx / sumq2)
    return scale


# ================================================================== blocks of 256

@njit(cache=True, error_model="numpy")
def scale_index(iscale, scale):
    """The 4-bit sub-block scale: nearest_int(0.5 * (scale / d - 1)), in 0..15."""
    l = nearest_int(np.float32(_HALF * np.float32(np.float32(iscale * scale) - F1)))
    return max(0, min(15, l))


@njit(cache=True, error_model="numpy")
def block_sigma2(xbl):
    sumx2 = F0
    for i in range(256):
        sumx2 = np.float32(sumx2 + np.float32(xbl[i] * xbl[i]))
    return np.float32(np.float32(np.float32(2) * sumx2) / np.float32(256))


@njit(cache=True, error_model="numpy")
def iq3_xxs_block(tables, xbl, qw, use_qw, out, o, scratch):
    """quantize_row_iq3_xxs_impl for one super-block, written to out[o:o + 98]."""
    weight, waux, xval, L, scales, search = scratch
    out[o:o + IQ3_XXS_BYTES] = 0
    sigma2 = block_sigma2(xbl)
    max_scale = F0
    for ib in range(8):
        xb = xbl[32 * ib:32 * ib + 32]
        sub_block_weights(xb, qw[32 * ib:] if use_qw else qw, use_qw, sigma2, weight, waux)
        signs = 0
        for k in range(4):
            signs |= abs_and_signs(xb, weight, xval, k, True) << (7 * k)
        vmax = xval[0]
        for i in range(1, 32):
            vmax = vmax if vmax > xval[i] else xval[i]
        L[:] = 0
        scales[ib] = F0
        if vmax < GROUP_MAX_EPS_IQ3_XXS:
            continue
        scale = search_scale(tables, xval, weight, waux, vmax, False, L, search)
        if scale < F0:  # never, says ggml: the scale made positive, the signs flipped
            scale = -scale
            signs ^= (1 << 28) - 1
        for k in range(8):
            out[o + 2 + 8 * ib + k] = grid_index_of(tables, L, 4 * k)
        for j in range(4):
            out[o + 66 + 4 * ib + j] = (signs >> (8 * j)) & 255
        scales[ib] = scale
        max_scale = max_scale if max_scale > scale else scale
    if max_scale == F0:
        out[o:o + IQ3_XXS_BYTES] = 0
        return
    d = np.float32(max_scale / _THIRTY_ONE)
    put_u16(out, o, fp32_to_fp16(np.float32(d * _XXS_D)))
    iscale = np.float32(F1 / d)
    for ib in range(8):
        out[o + 69 + 4 * ib] |= scale_index(iscale, scales[ib]) << 4


@njit(cache=True, error_model="numpy")
def iq3_s_block(tables, xbl, qw, use_qw, out, o, scratch):
    """quantize_row_iq3_s_impl for one super-block, written to out[o:o + 110]."""
    weight, waux, xval, L, scales, search = scratch
    out[o:o + IQ3_S_BYTES] = 0
    sigma2 = block_sigma2(xbl)
    max_scale = F0
    qs = o + 2  # where the next sub-block's grid bytes go (not advanced past a zero one)
    sg = o + 74  # and its sign bytes
    for ib in range(8):
        xb = xbl[32 * ib:32 * ib + 32]
        sub_block_weights(xb, qw[32 * ib:] if use_qw else qw, use_qw, sigma2, weight, waux)
        signs = 0
        for k in range(4):
            signs |= abs_and_signs(xb, weight, xval, k, False) << (8 * k)
        vmax = xval[0]
        for i in range(1, 32):
            vmax = vmax if vmax > xval[i] else xval[i]
        L[:] = 0
        scales[ib] = F0
        if vmax == F0:
            continue
        scale = search_scale(tables, xval, weight, waux, vmax, True, L, search)
        if scale < F0:  # never, says ggml: the scale made positive, the signs flipped
            scale = -scale
            signs ^= (1 << 32) - 1
        for k in range(8):
            index = grid_index_of(tables, L, 4 * k)
            out[qs + k] = index & 255
            out[o + 66 + ib] |= (index >> 8) << k
        qs += 8
        for j in range(4):
            out[sg + j] = (signs >> (8 * j)) & 255
        sg += 4
        scales[ib] = scale
        max_scale = max_scale if max_scale > scale else scale
    if max_scale == F0:
        return
    d = np.float32(max_scale / _THIRTY_ONE)
    put_u16(out, o, fp32_to_fp16(np.float32(d * _S_D)))
    iscale = np.float32(F1 / d)
    for ib in range(0, 8, 2):
        out[o + 106 + ib // 2] = scale_index(iscale, scales[ib]) \
            | (scale_index(iscale, scales[ib + 1]) << 4)


@njit(cache=True, error_model="numpy")
def _scratch():
    return (np.zeros(32, np.float32), np.zeros(32, np.float32), np.zeros(32, np.float32),
            np.zeros(32, np.int64), np.zeros(8, np.float32),
            (np.zeros(32, np.int64), np.zeros(8, np.bool_), np.zeros(8, np.bool_)))


@njit(cache=True, nogil=True, error_model="numpy")
def iq3_xxs_kernel(x, qw, use_qw, out, tables):
    scratch = _scratch()
    for r in range(x.shape[0]):
        for ibl in range(x.shape[1] // 256):
            iq3_xxs_block(tables, x[r, 256 * ibl:256 * ibl + 256], qw[256 * ibl:] if use_qw else qw,
                          use_qw, out[r], IQ3_XXS_BYTES * ibl, scratch)


@njit(cache=True, nogil=True, error_model="numpy")
def iq3_s_kernel(x, qw, use_qw, out, tables):
    scratch = _scratch()
    for r in range(x.shape[0]):
        for ibl in range(x.shape[1] // 256):
            iq3_s_block(tables, x[r, 256 * ibl:256 * ibl + 256], qw[256 * ibl:] if use_qw else qw,
                        use_qw, out[r], IQ3_S_BYTES * ibl, scratch)


def iq3_xxs_rows(x, qw, use_qw, out):
    """quantize_iq3_xxs, with or without importance weights."""
    iq3_xxs_kernel(x, qw, use_qw, out, grid_tables("IQ3_XXS"))


def iq3_s_rows(x, qw, use_qw, out):
    """quantize_iq3_s, with or without importance weights."""
    iq3_s_kernel(x, qw, use_qw, out, grid_tables("IQ3_S"))
