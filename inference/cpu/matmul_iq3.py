"""The CPU kernels of IQ3_XXS and IQ3_S, 256-value super-blocks of 3-bit grid points (see
`matmul_kernels` for what each kernel does; `quants.iq3` for the layouts).

16 values at a time: their four grid points (4 bytes each; the grid is 1 or 2 KiB, in L1) read
into two 64-bit words, their 16 signs as two words of byte masks (0 or -1) looked up by sign
byte (IQ3_S's stored bits) or 7-bit ksigns index (IQ3_XXS), and `vsigned16` applies the masks to
the bytes and widens them: exact integers, converted to float32. The sign goes to the integer
grid value, which gives ggml's (d * grid) * -1 bit for bit (`quants.iq3`). The decode kernel
multiplies a sub-block's 32 values into x and applies the sub-block's scale once, as ggml's
ggml_vec_dot_iq3_xxs_q8_K / _iq3_s_q8_K do with their integer sums.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..quants.grids import IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS
from ..quants.iq3 import IQ3_S, IQ3_XXS
from .matmul_kernels import (EXACT, JIT, MIN_STEP, TypeKernels, _matmat, _quad, _matvec, _matvec_id,
                             _pair, _rows)
from .simd import ld, ld_f16, ld_u8, ld_u32, vbcast, vcvt, vfma, vmul, vsigned16

# values and bytes each type's kernels step by along a row (catalog geometry through the type's
# class): module-level ints, so compile-time constants of the kernels below
IQ3_XXS_VALUES, IQ3_XXS_BYTES = IQ3_XXS.span(MIN_STEP)
IQ3_S_VALUES, IQ3_S_BYTES = IQ3_S.span(MIN_STEP)
_HALF = np.float32(0.5)


def _table(values):
    table = np.ascontiguousarray(values, dtype=np.int64)  # int64: numba mixes no unsigned in
    table.flags.writeable = False
    return table


XXS_GRID = _table(IQ3XXS_GRID)
S_GRID = _table(IQ3S_GRID)
# sign byte -> its 8 bits as byte masks (0xFF where set); through ksigns_iq2xs for IQ3_XXS
SIGN_MASKS = _table((((np.arange(256)[:, None] >> np.arange(8)) & 1) * 255).astype(np.uint8)
                    .view("<u8").reshape(-1).view(np.int64))
KSIGN_MASKS = _table(SIGN_MASKS[KSIGNS_IQ2XS])


@njit(inline="always")
def _grid16(grid, i0, i1, i2, i3, m0, m1):
    """the 4 grid points i0..i3, signed by the byte masks m0 (first 8 values) and m1"""
    return vsigned16(ld(grid, i0) | (ld(grid, i1) << 32), ld(grid, i2) | (ld(grid, i3) << 32),
                     m0, m1)


@njit(inline="always")
def _xxs_db(w, bo, aux):
    """IQ3_XXS's sub-block scale, d * (0.5 + s) * 0.5 in ggml's order (aux: the sub-block's
    scales-and-signs word)"""
    return ld_f16(w, bo) * (_HALF + np.float32(aux >> 28)) * _HALF


@njit(inline="always")
def _xxs_q(w, bo, aux, ib, h):
    """the 16 signed grid values of half h of IQ3_XXS sub-block ib"""
    u = ld_u32(w, bo + 2 + 8 * ib + 4 * h)
    return _grid16(XXS_GRID, u & 255, (u >> 8) & 255, (u >> 16) & 255, u >> 24,
                   ld(KSIGN_MASKS, (aux >> (14 * h)) & 127),
                   ld(KSIGN_MASKS, (aux >> (14 * h + 7)) & 127))


@njit(inline="always")
def _deq_iq3_xxs(w, bo, c):
    ib = c >> 1
    aux = ld_u32(w, bo + 66 + 4 * ib)
    return vmul(vbcast(_xxs_db(w, bo, aux)), vcvt(_xxs_q(w, bo, aux, ib, c & 1)))


@njit(inline="always")
def _dot_iq3_xxs(w, bo, x, xo, xs, so, a0, a1, ms):
    for ib in range(0, 8, 2):
        aux0 = ld_u32(w, bo + 66 + 4 * ib)
        aux1 = ld_u32(w, bo + 70 + 4 * ib)
        s0 = _pair(vcvt(_xxs_q(w, bo, aux0, ib, 0)), vcvt(_xxs_q(w, bo, aux0, ib, 1)),
                   x, xo + 32 * ib)
        s1 = _pair(vcvt(_xxs_q(w, bo, aux1, ib + 1, 0)), vcvt(_xxs_q(w, bo, aux1, ib + 1, 1)),
                   x, xo + 32 * ib + 32)
        a0 = vfma(vbcast(_xxs_db(w, bo, aux0)), s0, a0)
        a1 = vfma(vbcast(_xxs_db(w, bo, aux1)), s1, a1)
    return a0, a1, ms


@njit(inline="always")
def _s_db(w, bo, ib):
    """IQ3_S's sub-block scale, d * (1 + 2 * s)"""
    s = (ld_u8(w, bo + 106 + (ib >> 1)) >> (4 * (ib & 1))) & 15
    return ld_f16(w, bo) * np.float32(1 + 2 * s)


@njit(inline="always")
def _s_q(w, bo, ib, h):
    """the 16 signed grid values of half h of IQ3_S sub-block ib (9-bit indices: the qh bits)"""
    u = ld_u32(w, bo + 2 + 8 * ib + 4 * h)
    qh = ld_u8(w, bo + 66 + ib) >> (4 * h)
    so = bo + 74 + 4 * ib + 2 * h
    return _grid16(S_GRID, (u & 255) | ((qh & 1) << 8), ((u >> 8) & 255) | ((qh & 2) << 7),
                   ((u >> 16) & 255) | ((qh & 4) << 6), (u >> 24) | ((qh & 8) << 5),
                   ld(SIGN_MASKS, ld_u8(w, so)), ld(SIGN_MASKS, ld_u8(w, so + 1)))


@njit(inline="always")
def _deq_iq3_s(w, bo, c):
    return vmul(vbcast(_s_db(w, bo, c >> 1)), vcvt(_s_q(w, bo, c >> 1, c & 1)))


@njit(inline="always")
def _dot_iq3_s(w, bo, x, xo, xs, so, a0, a1, ms):
    for ib in range(0, 8, 2):
        s0 = _pair(vcvt(_s_q(w, bo, ib, 0)), vcvt(_s_q(w, bo, ib, 1)), x, xo + 32 * ib)
        s1 = _pair(vcvt(_s_q(w, bo, ib + 1, 0)), vcvt(_s_q(w, bo, ib + 1, 1)), x, xo + 32 * ib + 32)
        a0 = vfma(vbcast(_s_db(w, bo, ib)), s0, a0)
        a1 = vfma(vbcast(_s_db(w, bo, ib + 1)), s1, a1)
    return a0, a1, ms


# ================================================================== kernels, registered as "cpu"

@njit(parallel=True, **JIT)
def matvec_iq3_xxs(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_iq3_xxs, IQ3_XXS_VALUES, IQ3_XXS_BYTES)


@njit(parallel=True, **JIT)
def matvec_id_iq3_xxs(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_iq3_xxs, IQ3_XXS_VALUES, IQ3_XXS_BYTES)


@njit(**JIT)
def _quad_iq3_xxs(rq, w, x, out):
    _quad(rq, w, x, out, _deq_iq3_xxs, IQ3_XXS_VALUES, IQ3_XXS_BYTES)


@njit(parallel=True, **JIT)
def matmat_iq3_xxs(w, x, out, serial):
    _matmat(w, x, out, serial, _quad_iq3_xxs, _deq_iq3_xxs, IQ3_XXS_VALUES, IQ3_XXS_BYTES)


@njit(parallel=True, **EXACT)
def rows_iq3_xxs(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_iq3_xxs, IQ3_XXS_VALUES, IQ3_XXS_BYTES)


IQ3_XXS.register_kernels("cpu", TypeKernels(matvec_iq3_xxs, rows_iq3_xxs, matvec_id_iq3_xxs,
                                            matmat_iq3_xxs))


@njit(parallel=True, **JIT)
def matvec_iq3_s(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_iq3_s, IQ3_S_VALUES, IQ3_S_BYTES)


@njit(parallel=True, **JIT)
def matvec_id_iq3_s(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_iq3_s, IQ3_S_VALUES, IQ3_S_BYTES)


@njit(**JIT)
def _quad_iq3_s(rq, w, x, out):
    _quad(rq, w, x, out, _deq_iq3_s, IQ3_S_VALUES, IQ3_S_BYTES)


@njit(parallel=True, **JIT)
def matmat_iq3_s(w, x, out, serial):
    _matmat(w, x, out, serial, _quad_iq3_s, _deq_iq3_s, IQ3_S_VALUES, IQ3_S_BYTES)


@njit(parallel=True, **EXACT)
def rows_iq3_s(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_iq3_s, IQ3_S_VALUES, IQ3_S_BYTES)


IQ3_S.register_kernels("cpu", TypeKernels(matvec_iq3_s, rows_iq3_s, matvec_id_iq3_s,
                                          matmat_iq3_s))
