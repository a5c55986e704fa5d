"""The CPU kernels of IQ2_XXS, IQ2_XS and IQ2_S (256-value super-blocks of grid points times
signs; layouts in inference/quants/iq2.py; see `matmul_kernels` for what each kernel does).

A 16-value chunk is two grid points (8 values each). As in ggml's AVX2 / AVX-512
vec_dot_iq2_xxs_q8_K, which reads each grid point's 8 bytes whole and applies the signs from a
table (keven_signs_q2xs), a chunk is two 32-byte rows of the grid as float32 with their sign
bits xor-ed in from a table of sign masks (`vsigned_rows`: four loads, no gather, no
conversion). The scales are applied once the products are summed: the sub-block's
(0.5 + scale) / 4 once per 32 values (IQ2_XXS) or 16 (IQ2_XS, IQ2_S), d once per block.

`_deq_*` (the exact path) multiplies d * (0.5 + scale) * 0.25, in ggml's order, into the
signed grid values: dequantize_row_iq2_*'s bits.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..quants.grids import KSIGNS_IQ2XS
from ..quants.iq2 import IQ2_S, IQ2_XS, IQ2_XXS, IQ2S_VALUES, IQ2XS_VALUES, IQ2XXS_VALUES
from .matmul_kernels import (EXACT, JIT, MIN_STEP, TypeKernels, _matmat, _quad, _matvec, _matvec_id,
                             _rows)
from .simd import ld, ld_f16, ld_u8, ld_u16, ld_u32, vbcast, vfma, vload, vmul, vsigned_rows, vzero

IQ2_XXS_VALUES, IQ2_XXS_BYTES = IQ2_XXS.span(MIN_STEP)
IQ2_XS_VALUES, IQ2_XS_BYTES = IQ2_XS.span(MIN_STEP)
IQ2_S_VALUES, IQ2_S_BYTES = IQ2_S.span(MIN_STEP)
_HALF = np.float32(0.5)
_QUARTER = np.float32(0.25)
# (0.5 + n) * 0.25 for each 4-bit scale n (exact): the decode kernels multiply d in once a block
SUB_SCALES = (np.arange(16, dtype=np.float32) + _HALF) * _QUARTER
SUB_SCALES.flags.writeable = False


def _sign_bits(signs):
    """(n, 8) uint32: the float sign bit where bit k of signs[i] is set"""
    bits = (np.asarray(signs, np.uint32)[:, None] >> np.arange(8, dtype=np.uint32)) & 1
    table = (bits << np.uint32(31)).astype(np.uint32)
    table.flags.writeable = False
    return table


SIGN_BITS = _sign_bits(np.arange(256))  # IQ2_S: a sign byte as stored
EVEN_SIGN_BITS = _sign_bits(KSIGNS_IQ2XS)  # IQ2_XXS, IQ2_XS: 7 stored bits, even parity


# ================================================================== shared steps

@njit(inline="always")
def _exact(db, grid, signs, i0, i1, j0, j1):
    """db times the signed grid values: ggml's (db * grid) * (+-1) bit for bit, a NaN db
    included (a product with one NaN operand is that NaN; it is a sign flip of a NaN product,
    not a multiplication, that would change its bits)"""
    return vmul(vbcast(db), vsigned_rows(grid, i0, i1, signs, j0, j1))


@njit(inline="always")
def _scale(w, bo, nibble):
    """d * (0.5 + nibble) * 0.25, ggml's order"""
    return ld_f16(w, bo) * (_HALF + np.float32(nibble)) * _QUARTER


@njit(inline="always")
def _nibble(w, o, h):
    """low (h = 0) or high (h = 1) nibble of byte o"""
    return (ld_u8(w, o) >> (4 * h)) & 15


# ================================================================== IQ2_XXS

@njit(inline="always")
def _iq2_xxs_half(w, bo, ib, h):
    """chunk h of sub-block ib: grid indices, sign indices, and the sub-block's 4-bit scale"""
    o = bo + 2 + 8 * ib
    aux = ld_u32(w, o + 4)
    return (ld_u8(w, o + 2 * h), ld_u8(w, o + 2 * h + 1), (aux >> (14 * h)) & 127,
            (aux >> (14 * h + 7)) & 127, aux >> 28)


@njit(inline="always")
def _deq_iq2_xxs(w, bo, c):
    i0, i1, j0, j1, ls = _iq2_xxs_half(w, bo, c >> 1, c & 1)
    return _exact(_scale(w, bo, ls), IQ2XXS_VALUES, EVEN_SIGN_BITS, i0, i1, j0, j1)


@njit(inline="always")
def _iq2_xxs_sub(w, bo, ib, x, xo):
    """sub-block ib's 32 values times x[xo : xo + 32] lane-wise, unscaled; and its 4-bit scale"""
    i0, i1, j0, j1, ls = _iq2_xxs_half(w, bo, ib, 0)
    i2, i3, j2, j3, _ = _iq2_xxs_half(w, bo, ib, 1)
    s = vmul(vsigned_rows(IQ2XXS_VALUES, i0, i1, EVEN_SIGN_BITS, j0, j1), vload(x, xo))
    s = vfma(vsigned_rows(IQ2XXS_VALUES, i2, i3, EVEN_SIGN_BITS, j2, j3), vload(x, xo + 16), s)
    return s, ls


@njit(inline="always")
def _dot_iq2_xxs(w, bo, x, xo, xs, so, a0, a1, ms):
    b0 = vzero()
    b1 = vzero()
    for ib in range(0, 8, 2):
        s0, l0 = _iq2_xxs_sub(w, bo, ib, x, xo + 32 * ib)
        s1, l1 = _iq2_xxs_sub(w, bo, ib + 1, x, xo + 32 * ib + 32)
        b0 = vfma(vbcast(ld(SUB_SCALES, l0)), s0, b0)
        b1 = vfma(vbcast(ld(SUB_SCALES, l1)), s1, b1)
    d = vbcast(ld_f16(w, bo))
    return vfma(d, b0, a0), vfma(d, b1, a1), ms


# ================================================================== IQ2_XS and IQ2_S

@njit(inline="always")
def _dot_16(w, bo, x, xo, a0, a1, chunk, grid, signs, scales_at):
    """`_dot_*` for the types with a scale per 16 values (nibbles of the 8 bytes at bo +
    scales_at); `chunk(w, bo, c)` gives chunk c's grid and sign indices"""
    b0 = vzero()
    b1 = vzero()
    for c in range(0, 16, 2):
        i0, i1, j0, j1 = chunk(w, bo, c)
        i2, i3, j2, j3 = chunk(w, bo, c + 1)
        sc = ld_u8(w, bo + scales_at + (c >> 1))
        v0 = vmul(vsigned_rows(grid, i0, i1, signs, j0, j1), vload(x, xo + 16 * c))
        v1 = vmul(vsigned_rows(grid, i2, i3, signs, j2, j3), vload(x, xo + 16 * c + 16))
        b0 = vfma(vbcast(ld(SUB_SCALES, sc & 15)), v0, b0)
        b1 = vfma(vbcast(ld(SUB_SCALES, sc >> 4)), v1, b1)
    d = vbcast(ld_f16(w, bo))
    return vfma(d, b0, a0), vfma(d, b1, a1)


@njit(inline="always")
def _iq2_xs_chunk(w, bo, c):
    """chunk c (groups 2c, 2c + 1): grid indices and sign indices"""
    q0 = ld_u16(w, bo + 2 + 4 * c)
    q1 = ld_u16(w, bo + 4 + 4 * c)
    return q0 & 511, q1 & 511, q0 >> 9, q1 >> 9


@njit(inline="always")
def _deq_iq2_xs(w, bo, c):
    i0, i1, j0, j1 = _iq2_xs_chunk(w, bo, c)
    db = _scale(w, bo, _nibble(w, bo + 66 + (c >> 1), c & 1))
    return _exact(db, IQ2XS_VALUES, EVEN_SIGN_BITS, i0, i1, j0, j1)


@njit(inline="always")
def _dot_iq2_xs(w, bo, x, xo, xs, so, a0, a1, ms):
    a0, a1 = _dot_16(w, bo, x, xo, a0, a1, _iq2_xs_chunk, IQ2XS_VALUES, EVEN_SIGN_BITS, 66)
    return a0, a1, ms


@njit(inline="always")
def _iq2_s_chunk(w, bo, c):
    """chunk c (groups 2c, 2c + 1): grid indices (8 bits of qs, 2 of qh) and sign bytes"""
    qh = ld_u8(w, bo + 66 + (c >> 1)) >> (4 * (c & 1))
    return (ld_u8(w, bo + 2 + 2 * c) | ((qh & 3) << 8), ld_u8(w, bo + 3 + 2 * c) | ((qh & 12) << 6),
            ld_u8(w, bo + 34 + 2 * c), ld_u8(w, bo + 35 + 2 * c))


@njit(inline="always")
def _deq_iq2_s(w, bo, c):
    i0, i1, j0, j1 = _iq2_s_chunk(w, bo, c)
    db = _scale(w, bo, _nibble(w, bo + 74 + (c >> 1), c & 1))
    return _exact(db, IQ2S_VALUES, SIGN_BITS, i0, i1, j0, j1)


@njit(inline="always")
def _dot_iq2_s(w, bo, x, xo, xs, so, a0, a1, ms):
    a0, a1 = _dot_16(w, bo, x, xo, a0, a1, _iq2_s_chunk, IQ2S_VALUES, SIGN_BITS, 74)
    return a0, a1, ms


# ================================================================== kernels, registered as "cpu"

@njit(parallel=True, **JIT)
def matvec_iq2_xxs(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_iq2_xxs, IQ2_XXS_VALUES, IQ2_XXS_BYTES)


@njit(parallel=True, **JIT)
def matvec_id_iq2_xxs(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_iq2_xxs, IQ2_XXS_VALUES, IQ2_XXS_BYTES)


@njit(**JIT)
def _quad_iq2_xxs(rq, w, x, out):
    _quad(rq, w, x, out, _deq_iq2_xxs, IQ2_XXS_VALUES, IQ2_XXS_BYTES)


@njit(parallel=True, **JIT)
def matmat_iq2_xxs(w, x, out, serial):
    _matmat(w, x, out, serial, _quad_iq2_xxs, _deq_iq2_xxs, IQ2_XXS_VALUES, IQ2_XXS_BYTES)


@njit(parallel=True, **EXACT)
def rows_iq2_xxs(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_iq2_xxs, IQ2_XXS_VALUES, IQ2_XXS_BYTES)


IQ2_XXS.register_kernels("cpu", TypeKernels(matvec_iq2_xxs, rows_iq2_xxs, matvec_id_iq2_xxs,
                                            matmat_iq2_xxs))


@njit(parallel=True, **JIT)
def matvec_iq2_xs(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_iq2_xs, IQ2_XS_VALUES, IQ2_XS_BYTES)


@njit(parallel=True, **JIT)
def matvec_id_iq2_xs(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_iq2_xs, IQ2_XS_VALUES, IQ2_XS_BYTES)


@njit(**JIT)
def _quad_iq2_xs(rq, w, x, out):
    _quad(rq, w, x, out, _deq_iq2_xs, IQ2_XS_VALUES, IQ2_XS_BYTES)


@njit(parallel=True, **JIT)
def matmat_iq2_xs(w, x, out, serial):
    _matmat(w, x, out, serial, _quad_iq2_xs, _deq_iq2_xs, IQ2_XS_VALUES, IQ2_XS_BYTES)


@njit(parallel=True, **EXACT)
def rows_iq2_xs(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_iq2_xs, IQ2_XS_VALUES, IQ2_XS_BYTES)


IQ2_XS.register_kernels("cpu", TypeKernels(matvec_iq2_xs, rows_iq2_xs, matvec_id_iq2_xs,
                                           matmat_iq2_xs))


@njit(parallel=True, **JIT)
def matvec_iq2_s(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_iq2_s, IQ2_S_VALUES, IQ2_S_BYTES)


@njit(parallel=True, **JIT)
def matvec_id_iq2_s(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_iq2_s, IQ2_S_VALUES, IQ2_S_BYTES)


@njit(**JIT)
def _quad_iq2_s(rq, w, x, out):
    _quad(rq, w, x, out, _deq_iq2_s, IQ2_S_VALUES, IQ2_S_BYTES)


@njit(parallel=True, **JIT)
def matmat_iq2_s(w, x, out, serial):
    _matmat(w, x, out, serial, _quad_iq2_s, _deq_iq2_s, IQ2_S_VALUES, IQ2_S_BYTES)


@njit(parallel=True, **EXACT)
def rows_iq2_s(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_iq2_s, IQ2_S_VALUES, IQ2_S_BYTES)


IQ2_S.register_kernels("cpu", TypeKernels(matvec_iq2_s, rows_iq2_s, matvec_id_iq2_s,
                                          matmat_iq2_s))
