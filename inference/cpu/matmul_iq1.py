"""The CPU kernels of IQ1_S and IQ1_M, 256-value super-blocks of grid points of -1, 0, 1 plus a
delta of +-1/8 (see `matmul_kernels` for what each kernel does; `quants.iq1` for the layouts).

16 values at a time: their two grid points (8 bytes each, from the 16 KiB grid) widened by
`vsigned16` (no signs) and converted to float32 exactly, plus the delta: ggml's grid[j] + delta,
so the dequantized values are ggml's bit for bit. The decode kernel
applies a scale once per 32 values (IQ1_S, its delta times the sums of x, as
ggml_vec_dot_iq1_s_q8_K does) or 16 (IQ1_M, whose deltas change every 8 values and are added to
the grid values).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..quants.fp16 import fp16_to_fp32
from ..quants.grids import IQ1S_DELTA, IQ1S_GRID
from ..quants.iq1 import IQ1_M, IQ1_S
from .matmul_kernels import (EXACT, JIT, MIN_STEP, TypeKernels, _matmat, _quad, _matvec, _matvec_id,
                             _pair, _rows)
from .simd import (ld, ld_f16, ld_u8, ld_u16, ld_u32, vadd, vbcast, vcvt, vfma, vload, vmul,
                   vsigned16)

# values and bytes each type's kernels step by along a row (catalog geometry through the type's
# class): module-level ints, so compile-time constants of the kernels below
IQ1_S_VALUES, IQ1_S_BYTES = IQ1_S.span(MIN_STEP)
IQ1_M_VALUES, IQ1_M_BYTES = IQ1_M.span(MIN_STEP)

GRID = IQ1S_GRID.view(np.int64)  # int64: numba mixes no unsigned in
# the delta for a sign bit clear and set: ggml's IQ1S_DELTA for both types, as its
# dequantize_row_iq1_m and vec_dot_iq1_m use it
_DELTA_UP = IQ1S_DELTA
_DELTA_DOWN = -IQ1S_DELTA
# IQ1_M's deltas of a chunk's two groups: row 2 * (second's sign) + first's sign, 16 lanes
M_DELTAS = np.repeat(np.where(((np.arange(4)[:, None] >> np.arange(2)) & 1) == 1, _DELTA_DOWN,
                              _DELTA_UP), 8, axis=1).astype(np.float32)
M_DELTAS.flags.writeable = False


@njit(inline="always")
def _grid2(i0, i1):
    """grid points i0 (lanes 0-7) and i1 (lanes 8-15) as float32: -1, 0, 1"""
    return vcvt(vsigned16(ld(GRID, i0), ld(GRID, i1), 0, 0))


@njit(inline="always")
def _s_half(w, bo, qh, ib, h):
    """the grid values of half h of IQ1_S sub-block ib (qh: its u16 of high index bits and scale)"""
    qo = bo + 2 + 4 * ib + 2 * h
    return _grid2(ld_u8(w, qo) | (((qh >> (6 * h)) & 7) << 8),
                  ld_u8(w, qo + 1) | (((qh >> (6 * h + 3)) & 7) << 8))


@njit(inline="always")
def _s_dl(w, bo, qh):
    return ld_f16(w, bo) * np.float32(2 * ((qh >> 12) & 7) + 1)


@njit(inline="always")
def _s_delta(qh):
    return _DELTA_DOWN if qh & 0x8000 else _DELTA_UP


@njit(inline="always")
def _deq_iq1_s(w, bo, c):
    ib = c >> 1
    qh = ld_u16(w, bo + 34 + 2 * ib)
    return vmul(vbcast(_s_dl(w, bo, qh)), vadd(_s_half(w, bo, qh, ib, c & 1), vbcast(_s_delta(qh))))


@njit(inline="always")
def _dot_iq1_s(w, bo, x, xo, xs, so, a0, a1, ms):
    for ib in range(0, 8, 2):
        qh0 = ld_u16(w, bo + 34 + 2 * ib)
        qh1 = ld_u16(w, bo + 36 + 2 * ib)
        s0 = _pair(_s_half(w, bo, qh0, ib, 0), _s_half(w, bo, qh0, ib, 1), x, xo + 32 * ib)
        s1 = _pair(_s_half(w, bo, qh1, ib + 1, 0), _s_half(w, bo, qh1, ib + 1, 1), x,
                   xo + 32 * ib + 32)
        dl0 = _s_dl(w, bo, qh0)
        dl1 = _s_dl(w, bo, qh1)
        a0 = vfma(vbcast(dl0), s0, a0)
        a1 = vfma(vbcast(dl1), s1, a1)
        sb = so + 2 * ib
        ms += dl0 * _s_delta(qh0) * (ld(xs, sb) + ld(xs, sb + 1)) \
            + dl1 * _s_delta(qh1) * (ld(xs, sb + 2) + ld(xs, sb + 3))
    return a0, a1, ms


@njit(inline="always")
def _m_d(w, bo):
    """IQ1_M's d: the fp16 made of the top nibbles of its four u16 scales"""
    a = ld_u32(w, bo + 48)
    b = ld_u32(w, bo + 52)
    return fp16_to_fp32(((a >> 12) & 0xF) | ((a >> 24) & 0xF0) | ((b >> 4) & 0xF00)
                        | ((b >> 16) & 0xF000))


@njit(inline="always")
def _m_chunk(w, bo, d, c):
    """(scale, grid values + deltas) of chunk c of an IQ1_M block: 16 values, one 3-bit scale"""
    ib = c >> 1
    h = c & 1
    qh = ld_u8(w, bo + 32 + c)
    qo = bo + 4 * ib + 2 * h
    q = _grid2(ld_u8(w, qo) | ((qh & 7) << 8), ld_u8(w, qo + 1) | ((qh & 0x70) << 4))
    delta = vload(M_DELTAS, 16 * (((qh >> 3) & 1) | ((qh >> 6) & 2)))
    sc = ld_u16(w, bo + 48 + 2 * (ib >> 1)) >> (6 * (ib & 1) + 3 * h)
    return d * np.float32(2 * (sc & 7) + 1), vadd(q, delta)


@njit(inline="always")
def _deq_iq1_m(w, bo, c):
    dl, v = _m_chunk(w, bo, _m_d(w, bo), c)
    return vmul(vbcast(dl), v)


@njit(inline="always")
def _dot_iq1_m(w, bo, x, xo, xs, so, a0, a1, ms):
    d = _m_d(w, bo)
    for c in range(0, 16, 2):
        dl0, v0 = _m_chunk(w, bo, d, c)
        dl1, v1 = _m_chunk(w, bo, d, c + 1)
        a0 = vfma(vbcast(dl0), vmul(v0, vload(x, xo + 16 * c)), a0)
        a1 = vfma(vbcast(dl1), vmul(v1, vload(x, xo + 16 * c + 16)), a1)
    return a0, a1, ms


# ================================================================== kernels, registered as "cpu"

@njit(parallel=True, **JIT)
def matvec_iq1_s(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_iq1_s, IQ1_S_VALUES, IQ1_S_BYTES)


@njit(parallel=True, **JIT)
def matvec_id_iq1_s(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_iq1_s, IQ1_S_VALUES, IQ1_S_BYTES)


@njit(**JIT)
def _quad_iq1_s(rq, w, x, out):
    _quad(rq, w, x, out, _deq_iq1_s, IQ1_S_VALUES, IQ1_S_BYTES)


@njit(parallel=True, **JIT)
def matmat_iq1_s(w, x, out, serial):
    _matmat(w, x, out, serial, _quad_iq1_s, _deq_iq1_s, IQ1_S_VALUES, IQ1_S_BYTES)


@njit(parallel=True, **EXACT)
def rows_iq1_s(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_iq1_s, IQ1_S_VALUES, IQ1_S_BYTES)


IQ1_S.register_kernels("cpu", TypeKernels(matvec_iq1_s, rows_iq1_s, matvec_id_iq1_s,
                                          matmat_iq1_s))


@njit(parallel=True, **JIT)
def matvec_iq1_m(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_iq1_m, IQ1_M_VALUES, IQ1_M_BYTES)


@njit(parallel=True, **JIT)
def matvec_id_iq1_m(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_iq1_m, IQ1_M_VALUES, IQ1_M_BYTES)


@njit(**JIT)
def _quad_iq1_m(rq, w, x, out):
    _quad(rq, w, x, out, _deq_iq1_m, IQ1_M_VALUES, IQ1_M_BYTES)


@njit(parallel=True, **JIT)
def matmat_iq1_m(w, x, out, serial):
    _matmat(w, x, out, serial, _quad_iq1_m, _deq_iq1_m, IQ1_M_VALUES, IQ1_M_BYTES)


@njit(parallel=True, **EXACT)
def rows_iq1_m(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_iq1_m, IQ1_M_VALUES, IQ1_M_BYTES)


IQ1_M.register_kernels("cpu", TypeKernels(matvec_iq1_m, rows_iq1_m, matvec_id_iq1_m,
                                          matmat_iq1_m))
