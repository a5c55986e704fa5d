"""The CPU kernels of IQ4_NL (32-value blocks) and IQ4_XS (256-value super-blocks), 4-bit indices
into ggml's kvalues_iq4nl (see `matmul_kernels` for what each kernel does). Layouts (ggml-common.h;
little-endian, d an IEEE half):
  IQ4_NL  d, qs[16], value = d * kvalues[q] (nibbles as Q4_0)
  IQ4_XS  d, scales_h u16, scales_l[4], qs[128]; sub-block ib's scale is 6 bits minus 32
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..quants.base import IQ4_LEVELS
from ..quants.iquants import IQ4_NL, IQ4_XS
from .matmul_kernels import (EXACT, JIT, MIN_STEP, TypeKernels, _matmat, _quad, _matvec, _matvec_id,
                             _nib, _pair, _rows)
from .simd import ld_f16, ld_u8, ld_u16, vbcast, vfma, vlut, vmul

# values and bytes each type's kernels step by along a row (catalog geometry through the type's
# class): module-level ints, so compile-time constants of the kernels below
IQ4_NL_VALUES, IQ4_NL_BYTES = IQ4_NL.span(MIN_STEP)
IQ4_XS_VALUES, IQ4_XS_BYTES = IQ4_XS.span(MIN_STEP)


@njit(inline="always")
def _deq_iq4_nl(w, bo, c):
    return vmul(vlut(IQ4_LEVELS, _nib(w, bo + 2, c)), vbcast(ld_f16(w, bo)))


@njit(inline="always")
def _dot_iq4_nl(w, bo, x, xo, xs, so, a0, a1, ms):
    s = _pair(vlut(IQ4_LEVELS, _nib(w, bo + 2, 0)), vlut(IQ4_LEVELS, _nib(w, bo + 2, 1)), x, xo)
    return a1, vfma(vbcast(ld_f16(w, bo)), s, a0), ms


@njit(inline="always")
def _iq4_xs_dl(w, bo, ib):
    lo = (ld_u8(w, bo + 4 + (ib >> 1)) >> (4 * (ib & 1))) & 15
    hi = (ld_u16(w, bo + 2) >> (2 * ib)) & 3
    ls = lo | (hi << 4)
    return ld_f16(w, bo) * np.float32(ls - 32)


@njit(inline="always")
def _deq_iq4_xs(w, bo, c):
    ib = c >> 1
    return vmul(vbcast(_iq4_xs_dl(w, bo, ib)), vlut(IQ4_LEVELS, _nib(w, bo + 8 + 16 * ib, c)))


@njit(inline="always")
def _dot_iq4_xs(w, bo, x, xo, xs, so, a0, a1, ms):
    for ib in range(0, 8, 2):
        s0 = _pair(vlut(IQ4_LEVELS, _nib(w, bo + 8 + 16 * ib, 0)),
                   vlut(IQ4_LEVELS, _nib(w, bo + 8 + 16 * ib, 1)), x, xo + 32 * ib)
        s1 = _pair(vlut(IQ4_LEVELS, _nib(w, bo + 24 + 16 * ib, 0)),
                   vlut(IQ4_LEVELS, _nib(w, bo + 24 + 16 * ib, 1)), x, xo + 32 * ib + 32)
        a0 = vfma(vbcast(_iq4_xs_dl(w, bo, ib)), s0, a0)
        a1 = vfma(vbcast(_iq4_xs_dl(w, bo, ib + 1)), s1, a1)
    return a0, a1, ms


# ================================================================== kernels, registered as "cpu"

@njit(parallel=True, **JIT)
def matvec_iq4_nl(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_iq4_nl, IQ4_NL_VALUES, IQ4_NL_BYTES)


@njit(parallel=True, **JIT)
def matvec_id_iq4_nl(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_iq4_nl, IQ4_NL_VALUES, IQ4_NL_BYTES)


@njit(**JIT)
def _quad_iq4_nl(rq, w, x, out):
    _quad(rq, w, x, out, _deq_iq4_nl, IQ4_NL_VALUES, IQ4_NL_BYTES)


@njit(parallel=True, **JIT)
def matmat_iq4_nl(w, x, out, serial):
    _matmat(w, x, out, serial, _quad_iq4_nl, _deq_iq4_nl, IQ4_NL_VALUES, IQ4_NL_BYTES)


@njit(parallel=True, **EXACT)
def rows_iq4_nl(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_iq4_nl, IQ4_NL_VALUES, IQ4_NL_BYTES)


IQ4_NL.register_kernels("cpu", TypeKernels(matvec_iq4_nl, rows_iq4_nl, matvec_id_iq4_nl,
                                           matmat_iq4_nl))


@njit(parallel=True, **JIT)
def matvec_iq4_xs(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_iq4_xs, IQ4_XS_VALUES, IQ4_XS_BYTES)


@njit(parallel=True, **JIT)
def matvec_id_iq4_xs(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_iq4_xs, IQ4_XS_VALUES, IQ4_XS_BYTES)


@njit(**JIT)
def _quad_iq4_xs(rq, w, x, out):
    _quad(rq, w, x, out, _deq_iq4_xs, IQ4_XS_VALUES, IQ4_XS_BYTES)


@njit(parallel=True, **JIT)
def matmat_iq4_xs(w, x, out, serial):
    _matmat(w, x, out, serial, _quad_iq4_xs, _deq_iq4_xs, IQ4_XS_VALUES, IQ4_XS_BYTES)


@njit(parallel=True, **EXACT)
def rows_iq4_xs(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_iq4_xs, IQ4_XS_VALUES, IQ4_XS_BYTES)


IQ4_XS.register_kernels("cpu", TypeKernels(matvec_iq4_xs, rows_iq4_xs, matvec_id_iq4_xs,
                                           matmat_iq4_xs))
