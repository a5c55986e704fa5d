"""The CPU kernels of the float weight types F16 and BF16 (see `matmul_kernels` for what each
kernel does): a "block" is 32 values, two 16-lane vectors, 64 bytes; values widen exactly
(fp16 -> fp32 by the CPU's conversion, bf16 by a shift).
"""
from __future__ import annotations

from numba import njit

from ..quants.floats import BF16, F16
from .matmul_kernels import (EXACT, JIT, MIN_STEP, TypeKernels, _matmat, _quad, _matvec, _matvec_id,
                             _rows)
from .simd import vbf16, vf16, vfma, vload

# values and bytes each type's kernels step by along a row (catalog geometry through the type's
# class): module-level ints, so compile-time constants of the kernels below
BF16_VALUES, BF16_BYTES = BF16.span(MIN_STEP)
F16_VALUES, F16_BYTES = F16.span(MIN_STEP)


@njit(inline="always")
def _deq_f16(w, bo, c):
    return vf16(w, bo + 32 * c)


@njit(inline="always")
def _dot_f16(w, bo, x, xo, xs, so, a0, a1, ms):
    return vfma(vf16(w, bo), vload(x, xo), a0), vfma(vf16(w, bo + 32), vload(x, xo + 16), a1), ms


@njit(inline="always")
def _deq_bf16(w, bo, c):
    return vbf16(w, bo + 32 * c)


@njit(inline="always")
def _dot_bf16(w, bo, x, xo, xs, so, a0, a1, ms):
    return vfma(vbf16(w, bo), vload(x, xo), a0), vfma(vbf16(w, bo + 32), vload(x, xo + 16), a1), ms


# ================================================================== kernels, registered as "cpu"

@njit(parallel=True, **JIT)
def matvec_f16(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_f16, F16_VALUES, F16_BYTES)


@njit(parallel=True, **JIT)
def matvec_id_f16(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_f16, F16_VALUES, F16_BYTES)


@njit(**JIT)
def _quad_f16(rq, w, x, out):
    _quad(rq, w, x, out, _deq_f16, F16_VALUES, F16_BYTES)


@njit(parallel=True, **JIT)
def matmat_f16(w, x, out, serial):
    _matmat(w, x, out, serial, _quad_f16, _deq_f16, F16_VALUES, F16_BYTES)


@njit(parallel=True, **EXACT)
def rows_f16(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_f16, F16_VALUES, F16_BYTES)


F16.register_kernels("cpu", TypeKernels(matvec_f16, rows_f16, matvec_id_f16, matmat_f16))


@njit(parallel=True, **JIT)
def matvec_bf16(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_bf16, BF16_VALUES, BF16_BYTES)


@njit(parallel=True, **JIT)
def matvec_id_bf16(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_bf16, BF16_VALUES, BF16_BYTES)


@njit(**JIT)
def _quad_bf16(rq, w, x, out):
    _quad(rq, w, x, out, _deq_bf16, BF16_VALUES, BF16_BYTES)


@njit(parallel=True, **JIT)
def matmat_bf16(w, x, out, serial):
    _matmat(w, x, out, serial, _quad_bf16, _deq_bf16, BF16_VALUES, BF16_BYTES)


@njit(parallel=True, **EXACT)
def rows_bf16(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_bf16, BF16_VALUES, BF16_BYTES)


BF16.register_kernels("cpu", TypeKernels(matvec_bf16, rows_bf16, matvec_id_bf16, matmat_bf16))
