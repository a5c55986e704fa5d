"""The CPU kernels of the K-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, 256-value super-blocks (see
`matmul_kernels` for what each kernel does). Layouts (ggml-common.h; little-endian, d/dmin IEEE
halves):
  Q2_K  scales[16] (lo nibble scale, hi nibble min), qs[64] (2-bit), d, dmin
  Q3_K  hmask[32], qs[64], scales[12] (16 x 6-bit), d
  Q4_K  d, dmin, scales[12] (8 x 6-bit scale + min), qs[128]
  Q5_K  d, dmin, scales[12], qh[32], qs[128]
  Q6_K  ql[128], qh[64], scales int8[16], d
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..quants.kquants import Q2_K, Q3_K, Q4_K, Q5_K, Q6_K
from .matmul_kernels import (EXACT, JIT, MIN_STEP, TypeKernels, _matmat, _quad, _matvec, _matvec_id,
                             _pair, _rows)
from .simd import (ld, ld_f16, ld_i8, ld_u8, ld_u32, vbcast, vcvt, vfma, viand, vibcast, vior,
                   vishl, vishr, visub, vload, vmul, vsub, vu8)

# values and bytes each type's kernels step by along a row (catalog geometry through the type's
# class): module-level ints, so compile-time constants of the kernels below
Q2_K_VALUES, Q2_K_BYTES = Q2_K.span(MIN_STEP)
Q3_K_VALUES, Q3_K_BYTES = Q3_K.span(MIN_STEP)
Q4_K_VALUES, Q4_K_BYTES = Q4_K.span(MIN_STEP)
Q5_K_VALUES, Q5_K_BYTES = Q5_K.span(MIN_STEP)
Q6_K_VALUES, Q6_K_BYTES = Q6_K.span(MIN_STEP)


@njit(inline="always")
def _k4_scales(w, s):
    """the 8 scales and 8 mins packed in the 12 bytes at w[s] (get_scale_min_k4), one byte each,
    as two int64 words: scale j = (sc >> 8j) & 255, min j = (mn >> 8j) & 255"""
    u0 = ld_u32(w, s)
    u1 = ld_u32(w, s + 4)
    u2 = ld_u32(w, s + 8)
    sc = (u0 & 0x3F3F3F3F) | (((u2 & 0x0F0F0F0F) | (((u0 >> 6) & 0x03030303) << 4)) << 32)
    mn = (u1 & 0x3F3F3F3F) | ((((u2 >> 4) & 0x0F0F0F0F) | (((u1 >> 6) & 0x03030303) << 4)) << 32)
    return sc, mn


@njit(inline="always")
def _byte(word, j):
    return np.float32((word >> (8 * j)) & 255)


@njit(inline="always")
def _q3_scale(w, bo, c):
    """Q3_K's c-th 6-bit scale, minus 32"""
    lo = (ld_u8(w, bo + 96 + (c & 7)) >> (4 * (c >> 3))) & 15
    hi = (ld_u8(w, bo + 104 + (c & 3)) >> (2 * (c >> 2))) & 3
    return np.float32((lo | (hi << 4)) - 32)


@njit(inline="always")
def _deq_q2_k(w, bo, c):
    # chunk c: 128-half n = c >> 3, 2-bit plane j = (c & 7) >> 1, 16-byte half h = c & 1
    sc = ld_u8(w, bo + c)
    dl = ld_f16(w, bo + 80) * np.float32(sc & 15)
    ml = ld_f16(w, bo + 82) * np.float32(sc >> 4)
    q = viand(vishr(vu8(w, bo + 16 + 32 * (c >> 3) + 16 * (c & 1)), 2 * ((c & 7) >> 1)), vibcast(3))
    return vsub(vmul(vbcast(dl), vcvt(q)), vbcast(ml))


@njit(inline="always")
def _dot_q2_k(w, bo, x, xo, xs, so, a0, a1, ms):
    d = ld_f16(w, bo + 80)
    m3 = vibcast(3)
    mins = np.float32(0)
    for n in range(2):
        for h in range(2):
            q = vu8(w, bo + 16 + 32 * n + 16 * h)
            for j in range(0, 4, 2):
                c = 8 * n + 2 * j + h
                sc0 = ld_u8(w, bo + c)
                sc1 = ld_u8(w, bo + c + 2)
                v0 = vmul(vcvt(viand(vishr(q, 2 * j), m3)), vload(x, xo + 16 * c))
                v1 = vmul(vcvt(viand(vishr(q, 2 * j + 2), m3)), vload(x, xo + 16 * c + 32))
                a0 = vfma(vbcast(d * np.float32(sc0 & 15)), v0, a0)
                a1 = vfma(vbcast(d * np.float32(sc1 & 15)), v1, a1)
                mins += np.float32(sc0 >> 4) * ld(xs, so + c) + np.float32(sc1 >> 4) * ld(xs, so + c + 2)
    return a0, a1, ms - ld_f16(w, bo + 82) * mins


@njit(inline="always")
def _deq_q3_k(w, bo, c):
    dl = ld_f16(w, bo + 108) * _q3_scale(w, bo, c)
    ql = viand(vishr(vu8(w, bo + 32 + 32 * (c >> 3) + 16 * (c & 1)), 2 * ((c & 7) >> 1)), vibcast(3))
    hb = viand(vishr(vu8(w, bo + 16 * (c & 1)), c >> 1), vibcast(1))  # hmask bit 4n + j
    q = visub(ql, visub(vibcast(4), vishl(hb, 2)))  # ql - 4 where the hmask bit is clear
    return vmul(vbcast(dl), vcvt(q))


@njit(inline="always")
def _dot_q3_k(w, bo, x, xo, xs, so, a0, a1, ms):
    d = ld_f16(w, bo + 108)
    m3 = vibcast(3)
    m4 = vibcast(4)
    for n in range(2):
        for h in range(2):
            q = vu8(w, bo + 32 + 32 * n + 16 * h)
            hm = vu8(w, bo + 16 * h)
            for j in range(0, 4, 2):
                c = 8 * n + 2 * j + h
                # (2-bit value | hmask bit << 2) - 4: minus 4 where the hmask bit is clear
                q0 = visub(vior(viand(vishr(q, 2 * j), m3), viand(vishl(vishr(hm, 4 * n + j), 2), m4)), m4)
                q1 = visub(vior(viand(vishr(q, 2 * j + 2), m3),
                                viand(vishl(vishr(hm, 4 * n + j + 1), 2), m4)), m4)
                a0 = vfma(vbcast(d * _q3_scale(w, bo, c)), vmul(vcvt(q0), vload(x, xo + 16 * c)), a0)
                a1 = vfma(vbcast(d * _q3_scale(w, bo, c + 2)), vmul(vcvt(q1), vload(x, xo + 16 * c + 32)), a1)
    return a0, a1, ms


@njit(inline="always")
def _deq_q4_k(w, bo, c):
    j = c >> 1
    sc, mn = _k4_scales(w, bo + 4)
    d1 = ld_f16(w, bo) * _byte(sc, j)
    m1 = ld_f16(w, bo + 2) * _byte(mn, j)
    q = viand(vishr(vu8(w, bo + 16 + 32 * (j >> 1) + 16 * (c & 1)), 4 * (j & 1)), vibcast(15))
    return vsub(vmul(vbcast(d1), vcvt(q)), vbcast(m1))


@njit(inline="always")
def _dot_q4_k(w, bo, x, xo, xs, so, a0, a1, ms):
    d = ld_f16(w, bo)
    sc, mn = _k4_scales(w, bo + 4)
    m15 = vibcast(15)
    mins = np.float32(0)
    for p in range(4):  # 64 values: sub-block 2p in the low nibbles, 2p + 1 in the high ones
        qa = vu8(w, bo + 16 + 32 * p)
        qb = vu8(w, bo + 32 + 32 * p)
        xb = xo + 64 * p
        s0 = _pair(vcvt(viand(qa, m15)), vcvt(viand(qb, m15)), x, xb)
        s1 = _pair(vcvt(vishr(qa, 4)), vcvt(vishr(qb, 4)), x, xb + 32)
        a0 = vfma(vbcast(d * _byte(sc, 2 * p)), s0, a0)
        a1 = vfma(vbcast(d * _byte(sc, 2 * p + 1)), s1, a1)
        sb = so + 4 * p
        mins += (_byte(mn, 2 * p) * (ld(xs, sb) + ld(xs, sb + 1))
                 + _byte(mn, 2 * p + 1) * (ld(xs, sb + 2) + ld(xs, sb + 3)))
    return a0, a1, ms - ld_f16(w, bo + 2) * mins


@njit(inline="always")
def _deq_q5_k(w, bo, c):
    j = c >> 1
    sc, mn = _k4_scales(w, bo + 4)
    d1 = ld_f16(w, bo) * _byte(sc, j)
    m1 = ld_f16(w, bo + 2) * _byte(mn, j)
    ql = viand(vishr(vu8(w, bo + 48 + 32 * (j >> 1) + 16 * (c & 1)), 4 * (j & 1)), vibcast(15))
    qh = viand(vishr(vu8(w, bo + 16 + 16 * (c & 1)), j), vibcast(1))
    return vsub(vmul(vbcast(d1), vcvt(vior(ql, vishl(qh, 4)))), vbcast(m1))


@njit(inline="always")
def _dot_q5_k(w, bo, x, xo, xs, so, a0, a1, ms):
    d = ld_f16(w, bo)
    sc, mn = _k4_scales(w, bo + 4)
    m15 = vibcast(15)
    m16 = vibcast(16)
    ha = vishl(vu8(w, bo + 16), 4)  # bit j of qh[l] moved to bit 4 + j
    hb = vishl(vu8(w, bo + 32), 4)
    mins = np.float32(0)
    for p in range(4):
        qa = vu8(w, bo + 48 + 32 * p)
        qb = vu8(w, bo + 64 + 32 * p)
        xb = xo + 64 * p
        s0 = _pair(vcvt(vior(viand(qa, m15), viand(vishr(ha, 2 * p), m16))),
                   vcvt(vior(viand(qb, m15), viand(vishr(hb, 2 * p), m16))), x, xb)
        s1 = _pair(vcvt(vior(vishr(qa, 4), viand(vishr(ha, 2 * p + 1), m16))),
                   vcvt(vior(vishr(qb, 4), viand(vishr(hb, 2 * p + 1), m16))), x, xb + 32)
        a0 = vfma(vbcast(d * _byte(sc, 2 * p)), s0, a0)
        a1 = vfma(vbcast(d * _byte(sc, 2 * p + 1)), s1, a1)
        sb = so + 4 * p
        mins += (_byte(mn, 2 * p) * (ld(xs, sb) + ld(xs, sb + 1))
                 + _byte(mn, 2 * p + 1) * (ld(xs, sb + 2) + ld(xs, sb + 3)))
    return a0, a1, ms - ld_f16(w, bo + 2) * mins


@njit(inline="always")
def _deq_q6_k(w, bo, c):
    # values 16c..16c+15: 128-half n, quarter g of that half, first or second 16 of the quarter
    n = c >> 3
    g = (c & 7) >> 1
    l0 = 16 * (c & 1)
    ql = viand(vishr(vu8(w, bo + 64 * n + l0 + 32 * (g & 1)), 4 * (g >> 1)), vibcast(15))
    qh = viand(vishr(vu8(w, bo + 128 + 32 * n + l0), 2 * g), vibcast(3))
    q = visub(vior(ql, vishl(qh, 4)), vibcast(32))
    dl = ld_f16(w, bo + 208) * np.float32(ld_i8(w, bo + 192 + 8 * n + (c & 1) + 2 * g))
    return vmul(vbcast(dl), vcvt(q))


@njit(inline="always")
def _dot_q6_k(w, bo, x, xo, xs, so, a0, a1, ms):
    d = ld_f16(w, bo + 208)
    m15 = vibcast(15)
    m48 = vibcast(48)
    m32 = vibcast(32)
    for n in range(2):
        for h in range(2):
            l0 = 16 * h
            qla = vu8(w, bo + 64 * n + l0)
            qlb = vu8(w, bo + 64 * n + 32 + l0)
            qh = vishl(vu8(w, bo + 128 + 32 * n + l0), 4)  # field i (bits 2i, 2i+1) >> 2i lands on bits 4-5
            xb = xo + 128 * n + l0
            sb = bo + 192 + 8 * n + h
            q1 = visub(vior(viand(qla, m15), viand(qh, m48)), m32)
            q2 = visub(vior(viand(qlb, m15), viand(vishr(qh, 2), m48)), m32)
            q3 = visub(vior(vishr(qla, 4), viand(vishr(qh, 4), m48)), m32)
            q4 = visub(vior(vishr(qlb, 4), viand(vishr(qh, 6), m48)), m32)
            a0 = vfma(vbcast(d * np.float32(ld_i8(w, sb))), vmul(vcvt(q1), vload(x, xb)), a0)
            a1 = vfma(vbcast(d * np.float32(ld_i8(w, sb + 2))), vmul(vcvt(q2), vload(x, xb + 32)), a1)
            a0 = vfma(vbcast(d * np.float32(ld_i8(w, sb + 4))), vmul(vcvt(q3), vload(x, xb + 64)), a0)
            a1 = vfma(vbcast(d * np.float32(ld_i8(w, sb + 6))), vmul(vcvt(q4), vload(x, xb + 96)), a1)
    return a0, a1, ms


# ================================================================== kernels, registered as "cpu"

@njit(parallel=True, **JIT)
def matvec_q2_k(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_q2_k, Q2_K_VALUES, Q2_K_BYTES)


@njit(parallel=True, **JIT)
def matvec_id_q2_k(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_q2_k, Q2_K_VALUES, Q2_K_BYTES)


@njit(**JIT)
def _quad_q2_k(rq, w, x, out):
    _quad(rq, w, x, out, _deq_q2_k, Q2_K_VALUES, Q2_K_BYTES)


@njit(parallel=True, **JIT)
def matmat_q2_k(w, x, out, serial):
    _matmat(w, x, out, serial, _quad_q2_k, _deq_q2_k, Q2_K_VALUES, Q2_K_BYTES)


@njit(parallel=True, **EXACT)
def rows_q2_k(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_q2_k, Q2_K_VALUES, Q2_K_BYTES)


Q2_K.register_kernels("cpu", TypeKernels(matvec_q2_k, rows_q2_k, matvec_id_q2_k, matmat_q2_k))


@njit(parallel=True, **JIT)
def matvec_q3_k(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_q3_k, Q3_K_VALUES, Q3_K_BYTES)


@njit(parallel=True, **JIT)
def matvec_id_q3_k(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_q3_k, Q3_K_VALUES, Q3_K_BYTES)


@njit(**JIT)
def _quad_q3_k(rq, w, x, out):
    _quad(rq, w, x, out, _deq_q3_k, Q3_K_VALUES, Q3_K_BYTES)


@njit(parallel=True, **JIT)
def matmat_q3_k(w, x, out, serial):
    _matmat(w, x, out, serial, _quad_q3_k, _deq_q3_k, Q3_K_VALUES, Q3_K_BYTES)


@njit(parallel=True, **EXACT)
def rows_q3_k(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_q3_k, Q3_K_VALUES, Q3_K_BYTES)


Q3_K.register_kernels("cpu", TypeKernels(matvec_q3_k, rows_q3_k, matvec_id_q3_k, matmat_q3_k))


@njit(parallel=True, **JIT)
def matvec_q4_k(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_q4_k, Q4_K_VALUES, Q4_K_BYTES)


@njit(parallel=True, **JIT)
def matvec_id_q4_k(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_q4_k, Q4_K_VALUES, Q4_K_BYTES)


@njit(**JIT)
def _quad_q4_k(rq, w, x, out):
    _quad(rq, w, x, out, _deq_q4_k, Q4_K_VALUES, Q4_K_BYTES)


@njit(parallel=True, **JIT)
def matmat_q4_k(w, x, out, serial):
    _matmat(w, x, out, serial, _quad_q4_k, _deq_q4_k, Q4_K_VALUES, Q4_K_BYTES)


@njit(parallel=True, **EXACT)
def rows_q4_k(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_q4_k, Q4_K_VALUES, Q4_K_BYTES)


Q4_K.register_kernels("cpu", TypeKernels(matvec_q4_k, rows_q4_k, matvec_id_q4_k, matmat_q4_k))


@njit(parallel=True, **JIT)
def matvec_q5_k(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_q5_k, Q5_K_VALUES, Q5_K_BYTES)


@njit(parallel=True, **JIT)
def matvec_id_q5_k(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_q5_k, Q5_K_VALUES, Q5_K_BYTES)


@njit(**JIT)
def _quad_q5_k(rq, w, x, out):
    _quad(rq, w, x, out, _deq_q5_k, Q5_K_VALUES, Q5_K_BYTES)


@njit(parallel=True, **JIT)
def matmat_q5_k(w, x, out, serial):
    _matmat(w, x, out, serial, _quad_q5_k, _deq_q5_k, Q5_K_VALUES, Q5_K_BYTES)


@njit(parallel=True, **EXACT)
def rows_q5_k(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_q5_k, Q5_K_VALUES, Q5_K_BYTES)


Q5_K.register_kernels("cpu", TypeKernels(matvec_q5_k, rows_q5_k, matvec_id_q5_k, matmat_q5_k))


@njit(parallel=True, **JIT)
def matvec_q6_k(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_q6_k, Q6_K_VALUES, Q6_K_BYTES)


@njit(parallel=True, **JIT)
def matvec_id_q6_k(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_q6_k, Q6_K_VALUES, Q6_K_BYTES)


@njit(**JIT)
def _quad_q6_k(rq, w, x, out):
    _quad(rq, w, x, out, _deq_q6_k, Q6_K_VALUES, Q6_K_BYTES)


@njit(parallel=True, **JIT)
def matmat_q6_k(w, x, out, serial):
    _matmat(w, x, out, serial, _quad_q6_k, _deq_q6_k, Q6_K_VALUES, Q6_K_BYTES)


@njit(parallel=True, **EXACT)
def rows_q6_k(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_q6_k, Q6_K_VALUES, Q6_K_BYTES)


Q6_K.register_kernels("cpu", TypeKernels(matvec_q6_k, rows_q6_k, matvec_id_q6_k, matmat_q6_k))
