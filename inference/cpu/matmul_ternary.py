"""The CPU kernels of TQ1_0 and TQ2_0, ggml's ternary 256-value blocks (see `matmul_kernels` for
what each kernel does; the layouts are described in inference/quants/ternary.py). Every value is
d * (t - 1) with t in 0..2, so a block's products are summed as (t - 1) . x and scaled once.

TQ1_0 packs five trits a byte as a base-3 fraction of 256: trit n of byte b is
((b * 3**n) & 255) * 3 >> 8 (ggml's dequantize_row_tq1_0), here on 16 lanes at a time.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..quants.ternary import POW3, TQ1_0, TQ1_D, TQ1_QS, TQ2_0, TQ2_QS
from .matmul_kernels import (EXACT, JIT, MIN_STEP, TypeKernels, _matmat, _quad, _matvec, _matvec_id,
                             _rows)
from .simd import (ld_f16, ld_u32, vbcast, vcvt, vfma, viand, vibcast, viota, vishl, vishr, vishrv,
                   vimul, visub, vload, vloadi, vmul, vu8)

# values and bytes each type's kernels step by along a row (catalog geometry through the type's
# class): module-level ints, so compile-time constants of the kernels below
TQ1_0_VALUES, TQ1_0_BYTES = TQ1_0.span(MIN_STEP)
TQ2_0_VALUES, TQ2_0_BYTES = TQ2_0.span(MIN_STEP)
# qh's multipliers: lane t of the last 16 values is trit t // 4 of qh[t % 4]
TQ1_QH_POW3 = POW3[np.arange(16) // 4].astype(np.int32)
TQ1_QH_POW3.flags.writeable = False


@njit(inline="always")
def _trits(b, p):
    """t - 1 for the trit that multiplier p (3**n) brings to the top of the bytes b (int32 lanes)"""
    return visub(vishr(vimul(viand(vimul(b, p), vibcast(255)), vibcast(3)), 8), vibcast(1))


@njit(inline="always")
def _tq1_0(w, bo, c):
    """t - 1 for values 16c .. 16c + 15 of the TQ1_0 block at byte bo"""
    if c < 10:  # qs[0:32]: trit c // 2 of its first or second 16 bytes
        return _trits(vu8(w, bo + 16 * (c & 1)), vibcast(POW3[c >> 1]))
    if c < 15:  # qs[32:48]: trit c - 10
        return _trits(vu8(w, bo + 32), vibcast(POW3[c - 10]))
    qh = vishrv(vibcast(ld_u32(w, bo + TQ1_QS)), vishl(viand(viota(), vibcast(3)), 3))
    return _trits(viand(qh, vibcast(255)), vloadi(TQ1_QH_POW3, 0))


@njit(inline="always")
def _deq_tq1_0(w, bo, c):
    return vmul(vcvt(_tq1_0(w, bo, c)), vbcast(ld_f16(w, bo + TQ1_D)))


@njit(inline="always")
def _dot_tq1_0(w, bo, x, xo, xs, so, a0, a1, ms):
    s0 = vmul(vcvt(_tq1_0(w, bo, 0)), vload(x, xo))
    s1 = vmul(vcvt(_tq1_0(w, bo, 1)), vload(x, xo + 16))
    for c in range(2, 16, 2):
        s0 = vfma(vcvt(_tq1_0(w, bo, c)), vload(x, xo + 16 * c), s0)
        s1 = vfma(vcvt(_tq1_0(w, bo, c + 1)), vload(x, xo + 16 * c + 16), s1)
    d = vbcast(ld_f16(w, bo + TQ1_D))
    return vfma(d, s0, a0), vfma(d, s1, a1), ms


@njit(inline="always")
def _tq2_0(w, bo, c):
    """t - 1 for values 16c .. 16c + 15 of the TQ2_0 block at byte bo: bits 2l of the bytes
    32h + 16k .. + 15, for c = 8h + 2l + k"""
    q = vu8(w, bo + 32 * (c >> 3) + 16 * (c & 1))
    return visub(viand(vishr(q, 2 * ((c & 7) >> 1)), vibcast(3)), vibcast(1))


@njit(inline="always")
def _deq_tq2_0(w, bo, c):
    return vmul(vcvt(_tq2_0(w, bo, c)), vbcast(ld_f16(w, bo + TQ2_QS)))


@njit(inline="always")
def _dot_tq2_0(w, bo, x, xo, xs, so, a0, a1, ms):
    s0 = vmul(vcvt(_tq2_0(w, bo, 0)), vload(x, xo))
    s1 = vmul(vcvt(_tq2_0(w, bo, 1)), vload(x, xo + 16))
    for c in range(2, 16, 2):
        s0 = vfma(vcvt(_tq2_0(w, bo, c)), vload(x, xo + 16 * c), s0)
        s1 = vfma(vcvt(_tq2_0(w, bo, c + 1)), vload(x, xo + 16 * c + 16), s1)
    d = vbcast(ld_f16(w, bo + TQ2_QS))
    return vfma(d, s0, a0), vfma(d, s1, a1), ms


# ================================================================== kernels, registered as "cpu"

@njit(parallel=True, **JIT)
def matvec_tq1_0(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_tq1_0, TQ1_0_VALUES, TQ1_0_BYTES)


@njit(parallel=True, **JIT)
def matvec_id_tq1_0(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_tq1_0, TQ1_0_VALUES, TQ1_0_BYTES)


@njit(**JIT)
def _quad_tq1_0(rq, w, x, out):
    _quad(rq, w, x, out, _deq_tq1_0, TQ1_0_VALUES, TQ1_0_BYTES)


@njit(parallel=True, **JIT)
def matmat_tq1_0(w, x, out, serial):
    _matmat(w, x, out, serial, _quad_tq1_0, _deq_tq1_0, TQ1_0_VALUES, TQ1_0_BYTES)


@njit(parallel=True, **EXACT)
def rows_tq1_0(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_tq1_0, TQ1_0_VALUES, TQ1_0_BYTES)


TQ1_0.register_kernels("cpu", TypeKernels(matvec_tq1_0, rows_tq1_0, matvec_id_tq1_0, matmat_tq1_0))


@njit(parallel=True, **JIT)
def matvec_tq2_0(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_tq2_0, TQ2_0_VALUES, TQ2_0_BYTES)


@njit(parallel=True, **JIT)
def matvec_id_tq2_0(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_tq2_0, TQ2_0_VALUES, TQ2_0_BYTES)


@njit(**JIT)
def _quad_tq2_0(rq, w, x, out):
    _quad(rq, w, x, out, _deq_tq2_0, TQ2_0_VALUES, TQ2_0_BYTES)


@njit(parallel=True, **JIT)
def matmat_tq2_0(w, x, out, serial):
    _matmat(w, x, out, serial, _quad_tq2_0, _deq_tq2_0, TQ2_0_VALUES, TQ2_0_BYTES)


@njit(parallel=True, **EXACT)
def rows_tq2_0(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_tq2_0, TQ2_0_VALUES, TQ2_0_BYTES)


TQ2_0.register_kernels("cpu", TypeKernels(matvec_tq2_0, rows_tq2_0, matvec_id_tq2_0, matmat_tq2_0))
