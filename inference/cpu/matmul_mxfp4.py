"""The CPU kernels of MXFP4 (32-value blocks; see `matmul_kernels` for what each kernel does).
Layout (ggml-common.h block_mxfp4): e (E8M0 exponent byte), qs[16] (low nibbles = values 0..15,
high = 16..31); value = kvalues_mxfp4[nibble] * e8m0_to_fp32_half(e).

The decode kernel follows ggml's ggml_vec_dot_mxfp4_q8_0 in float32: each nibble looks its level
up in the 16-entry table (as IQ4_NL's kernels do), the block's 32 products are summed, and the
scale (a power of two) is applied once per block.
"""
from __future__ import annotations

from numba import njit

from ..quants.mxfp4 import MXFP4, MXFP4_LEVELS, e8m0_half
from .matmul_kernels import (EXACT, JIT, MIN_STEP, TypeKernels, _matmat, _quad, _matvec, _matvec_id,
                             _pair, _rows)
from .simd import ld_u8, vbcast, vfma, vishr, vload, vmul, vperm16, vu8

# values and bytes the kernels step by along a row (catalog geometry through the type's class):
# module-level ints, so compile-time constants of the kernels below
MXFP4_VALUES, MXFP4_BYTES = MXFP4.span(MIN_STEP)


@njit(inline="always")
def _level(w, o, c):
    """the levels of the low (c even) or high (c odd) nibbles of the 16 bytes at w[o] (the
    permute reads an index's low 4 bits: the low nibbles need no mask)"""
    return vperm16(vload(MXFP4_LEVELS, 0), vishr(vu8(w, o), 4 * (c & 1)))


@njit(inline="always")
def _deq_mxfp4(w, bo, c):
    return vmul(_level(w, bo + 1, c), vbcast(e8m0_half(ld_u8(w, bo))))


@njit(inline="always")
def _dot_mxfp4(w, bo, x, xo, xs, so, a0, a1, ms):
    s = _pair(_level(w, bo + 1, 0), _level(w, bo + 1, 1), x, xo)
    return a1, vfma(vbcast(e8m0_half(ld_u8(w, bo))), s, a0), ms


# ================================================================== kernels, registered as "cpu"

@njit(parallel=True, **JIT)
def matvec_mxfp4(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_mxfp4, MXFP4_VALUES, MXFP4_BYTES)


@njit(parallel=True, **JIT)
def matvec_id_mxfp4(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_mxfp4, MXFP4_VALUES, MXFP4_BYTES)


@njit(**JIT)
def _quad_mxfp4(rq, w, x, out):
    _quad(rq, w, x, out, _deq_mxfp4, MXFP4_VALUES, MXFP4_BYTES)


@njit(parallel=True, **JIT)
def matmat_mxfp4(w, x, out, serial):
    _matmat(w, x, out, serial, _quad_mxfp4, _deq_mxfp4, MXFP4_VALUES, MXFP4_BYTES)


@njit(parallel=True, **EXACT)
def rows_mxfp4(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_mxfp4, MXFP4_VALUES, MXFP4_BYTES)


MXFP4.register_kernels("cpu", TypeKernels(matvec_mxfp4, rows_mxfp4, matvec_id_mxfp4, matmat_mxfp4))
