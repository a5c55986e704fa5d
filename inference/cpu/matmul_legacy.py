"""The CPU kernels of the 32-value block types Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (see `matmul_kernels`
for what each kernel does). Layouts (ggml-common.h; little-endian, d/m IEEE halves):
  Q4_0  d, qs[16] (low nibbles = values 0..15, high = 16..31), value = d * (q - 8)
  Q4_1  d, m, qs[16], value = d * q + m
  Q5_0  d, qh u32 (bit j = 5th bit of value j), qs[16], value = d * (q - 16)
  Q5_1  d, m, qh, qs[16], value = d * q + m
  Q8_0  d, qs int8[32], value = q * d
"""
from __future__ import annotations

from numba import njit

from ..quants.legacy import Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
from .matmul_kernels import (EXACT, JIT, MIN_STEP, TypeKernels, _matmat, _quad, _matvec, _matvec_id,
                             _nib, _pair, _rows)
from .simd import (ld, ld_f16, ld_u32, vadd, vbcast, vcvt, vfma, vi8, viand, vibcast, viota, vior,
                   vishl, vishrv, visub, vmul)

# values and bytes each type's kernels step by along a row (catalog geometry through the type's
# class): module-level ints, so compile-time constants of the kernels below
Q4_0_VALUES, Q4_0_BYTES = Q4_0.span(MIN_STEP)
Q4_1_VALUES, Q4_1_BYTES = Q4_1.span(MIN_STEP)
Q5_0_VALUES, Q5_0_BYTES = Q5_0.span(MIN_STEP)
Q5_1_VALUES, Q5_1_BYTES = Q5_1.span(MIN_STEP)
Q8_0_VALUES, Q8_0_BYTES = Q8_0.span(MIN_STEP)


@njit(inline="always")
def _qh5(qh, c):
    """the 5th bits of values 16c..16c+15 from a Q5 block's 32-bit qh, as 0 / 16"""
    return vishl(viand(vishrv(vibcast(qh), vior(viota(), vibcast(16 * c))), vibcast(1)), 4)


@njit(inline="always")
def _deq_q4_0(w, bo, c):
    return vmul(vcvt(visub(_nib(w, bo + 2, c), vibcast(8))), vbcast(ld_f16(w, bo)))


@njit(inline="always")
def _dot_q4_0(w, bo, x, xo, xs, so, a0, a1, ms):
    s = _pair(vcvt(visub(_nib(w, bo + 2, 0), vibcast(8))), vcvt(visub(_nib(w, bo + 2, 1), vibcast(8))), x, xo)
    return a1, vfma(vbcast(ld_f16(w, bo)), s, a0), ms


@njit(inline="always")
def _deq_q4_1(w, bo, c):
    return vadd(vmul(vcvt(_nib(w, bo + 4, c)), vbcast(ld_f16(w, bo))), vbcast(ld_f16(w, bo + 2)))


@njit(inline="always")
def _dot_q4_1(w, bo, x, xo, xs, so, a0, a1, ms):
    s = _pair(vcvt(_nib(w, bo + 4, 0)), vcvt(_nib(w, bo + 4, 1)), x, xo)
    ms += ld_f16(w, bo + 2) * (ld(xs, so) + ld(xs, so + 1))
    return a1, vfma(vbcast(ld_f16(w, bo)), s, a0), ms


@njit(inline="always")
def _q5_0(w, bo, c):
    """the values 16c..16c+15 as 5-bit integers minus 16"""
    return vcvt(visub(vior(_nib(w, bo + 6, c), _qh5(ld_u32(w, bo + 2), c)), vibcast(16)))


@njit(inline="always")
def _deq_q5_0(w, bo, c):
    return vmul(_q5_0(w, bo, c), vbcast(ld_f16(w, bo)))


@njit(inline="always")
def _dot_q5_0(w, bo, x, xo, xs, so, a0, a1, ms):
    s = _pair(_q5_0(w, bo, 0), _q5_0(w, bo, 1), x, xo)
    return a1, vfma(vbcast(ld_f16(w, bo)), s, a0), ms


@njit(inline="always")
def _q5_1(w, bo, c):
    """the 5-bit values 16c..16c+15 (0..31)"""
    return vcvt(vior(_nib(w, bo + 8, c), _qh5(ld_u32(w, bo + 4), c)))


@njit(inline="always")
def _deq_q5_1(w, bo, c):
    return vadd(vmul(_q5_1(w, bo, c), vbcast(ld_f16(w, bo))), vbcast(ld_f16(w, bo + 2)))


@njit(inline="always")
def _dot_q5_1(w, bo, x, xo, xs, so, a0, a1, ms):
    s = _pair(_q5_1(w, bo, 0), _q5_1(w, bo, 1), x, xo)
    ms += ld_f16(w, bo + 2) * (ld(xs, so) + ld(xs, so + 1))
    return a1, vfma(vbcast(ld_f16(w, bo)), s, a0), ms


@njit(inline="always")
def _deq_q8_0(w, bo, c):
    return vmul(vcvt(vi8(w, bo + 2 + 16 * c)), vbcast(ld_f16(w, bo)))


@njit(inline="always")
def _dot_q8_0(w, bo, x, xo, xs, so, a0, a1, ms):
    s = _pair(vcvt(vi8(w, bo + 2)), vcvt(vi8(w, bo + 18)), x, xo)
    return a1, vfma(vbcast(ld_f16(w, bo)), s, a0), ms


# ================================================================== kernels, registered as "cpu"

@njit(parallel=True, **JIT)
def matvec_q4_0(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_q4_0, Q4_0_VALUES, Q4_0_BYTES)


@njit(parallel=True, **JIT)
def matvec_id_q4_0(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_q4_0, Q4_0_VALUES, Q4_0_BYTES)


@njit(**JIT)
def _quad_q4_0(rq, w, x, out):
    _quad(rq, w, x, out, _deq_q4_0, Q4_0_VALUES, Q4_0_BYTES)


@njit(parallel=True, **JIT)
def matmat_q4_0(w, x, out, serial):
    _matmat(w, x, out, serial, _quad_q4_0, _deq_q4_0, Q4_0_VALUES, Q4_0_BYTES)


@njit(parallel=True, **EXACT)
def rows_q4_0(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_q4_0, Q4_0_VALUES, Q4_0_BYTES)


Q4_0.register_kernels("cpu", TypeKernels(matvec_q4_0, rows_q4_0, matvec_id_q4_0, matmat_q4_0))


@njit(parallel=True, **JIT)
def matvec_q4_1(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_q4_1, Q4_1_VALUES, Q4_1_BYTES)


@njit(parallel=True, **JIT)
def matvec_id_q4_1(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_q4_1, Q4_1_VALUES, Q4_1_BYTES)


@njit(**JIT)
def _quad_q4_1(rq, w, x, out):
    _quad(rq, w, x, out, _deq_q4_1, Q4_1_VALUES, Q4_1_BYTES)


@njit(parallel=True, **JIT)
def matmat_q4_1(w, x, out, serial):
    _matmat(w, x, out, serial, _quad_q4_1, _deq_q4_1, Q4_1_VALUES, Q4_1_BYTES)


@njit(parallel=True, **EXACT)
def rows_q4_1(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_q4_1, Q4_1_VALUES, Q4_1_BYTES)


Q4_1.register_kernels("cpu", TypeKernels(matvec_q4_1, rows_q4_1, matvec_id_q4_1, matmat_q4_1))


@njit(parallel=True, **JIT)
def matvec_q5_0(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_q5_0, Q5_0_VALUES, Q5_0_BYTES)


@njit(parallel=True, **JIT)
def matvec_id_q5_0(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_q5_0, Q5_0_VALUES, Q5_0_BYTES)


@njit(**JIT)
def _quad_q5_0(rq, w, x, out):
    _quad(rq, w, x, out, _deq_q5_0, Q5_0_VALUES, Q5_0_BYTES)


@njit(parallel=True, **JIT)
def matmat_q5_0(w, x, out, serial):
    _matmat(w, x, out, serial, _quad_q5_0, _deq_q5_0, Q5_0_VALUES, Q5_0_BYTES)


@njit(parallel=True, **EXACT)
def rows_q5_0(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_q5_0, Q5_0_VALUES, Q5_0_BYTES)


Q5_0.register_kernels("cpu", TypeKernels(matvec_q5_0, rows_q5_0, matvec_id_q5_0, matmat_q5_0))


@njit(parallel=True, **JIT)
def matvec_q5_1(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_q5_1, Q5_1_VALUES, Q5_1_BYTES)


@njit(parallel=True, **JIT)
def matvec_id_q5_1(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_q5_1, Q5_1_VALUES, Q5_1_BYTES)


@njit(**JIT)
def _quad_q5_1(rq, w, x, out):
    _quad(rq, w, x, out, _deq_q5_1, Q5_1_VALUES, Q5_1_BYTES)


@njit(parallel=True, **JIT)
def matmat_q5_1(w, x, out, serial):
    _matmat(w, x, out, serial, _quad_q5_1, _deq_q5_1, Q5_1_VALUES, Q5_1_BYTES)


@njit(parallel=True, **EXACT)
def rows_q5_1(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_q5_1, Q5_1_VALUES, Q5_1_BYTES)


Q5_1.register_kernels("cpu", TypeKernels(matvec_q5_1, rows_q5_1, matvec_id_q5_1, matmat_q5_1))


@njit(parallel=True, **JIT)
def matvec_q8_0(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_q8_0, Q8_0_VALUES, Q8_0_BYTES)


@njit(parallel=True, **JIT)
def matvec_id_q8_0(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_q8_0, Q8_0_VALUES, Q8_0_BYTES)


@njit(**JIT)
def _quad_q8_0(rq, w, x, out):
    _quad(rq, w, x, out, _deq_q8_0, Q8_0_VALUES, Q8_0_BYTES)


@njit(parallel=True, **JIT)
def matmat_q8_0(w, x, out, serial):
    _matmat(w, x, out, serial, _quad_q8_0, _deq_q8_0, Q8_0_VALUES, Q8_0_BYTES)


@njit(parallel=True, **EXACT)
def rows_q8_0(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_q8_0, Q8_0_VALUES, Q8_0_BYTES)


Q8_0.register_kernels("cpu", TypeKernels(matvec_q8_0, rows_q8_0, matvec_id_q8_0, matmat_q8_0))
