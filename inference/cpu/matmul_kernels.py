"""numba kernels for `llamatui.inference.cpu.matmul`: ggml block formats decoded 16 values at a time.

Per format (written with the 16-lane vectors of `matmul_simd`):

- `_deq_<type>(w, bo, c)`: the c-th run of 16 consecutive values of the block starting at byte
  `bo` of the weight bytes `w`, dequantized with ggml's float32 formulas in ggml's operation order
  (no fused multiply-add), so dequantized rows match `dequantize_row_*` bit for bit (in the
  fast-math batch decode kernels LLVM may fuse a scale and a min into one FMA: float32-accurate).
- `_dot_<type>(...)`: one block times the matching slice of x, accumulated into two 16-lane
  accumulators with FMAs; scales are applied once per (sub-)block and min terms go through
  precomputed sums of x. float32-accurate, not bit-exact.

Skeletons (`inline='always'`, so each kernel compiles to one flat function with the format's
constants folded and its small loops unrolled) turn these into the kernels at the end:

- `matvec_<type>(w, x, out, serial)`, decode: out[t, r] = x[t] . W[r], parallel over rows
  (`prange`), each weight row streamed once per token.
- `matvec_id_<type>(w, x, experts, x_rows, out, serial)`, decode of a mixture of experts: the
  fused decode kernel over the rows of the selected experts only (ggml_mul_mat_id's few-token
  case), all (token, expert) pairs in one parallel launch.
- `matmat_<type>(w, x, out, serial)`, batch decode: the same product for a few tokens (a multiple
  of 4), each 16-value chunk of a row dequantized once for a tile of 8 (or 4) tokens.
- `rows_<type>(w, rows, out, serial)`: out[i] = W[rows[i]], exact (prefill tiles, embeddings).
- `gemm_f32(x, wt, out, r0, serial)`: a float32 GEMM for the dequantized tiles (and F32 weights).

`serial` runs a kernel on the calling thread alone (small work: waking the pool costs more).

Specializations: the kernels are always called with a read-only uint8 C-contiguous 2-D weight,
float32 C-contiguous activations / outputs / tiles and int64 row ids (see `matmul.py`), so each
compiles once.

Cache note: numba's on-disk cache checks only this file's timestamp. The kernels inline
`matmul_simd`; after editing that module, touch this file (or clear `__pycache__`).

Layouts (little-endian; d/dmin/m are IEEE halves) — see ggml/src/ggml-common.h:
  Q4_0  18 B / 32: d, qs[16] (low nibbles = values 0..15, high = 16..31), value = d * (q - 8)
  Q4_1  20 B / 32: d, m, qs[16], value = d * q + m
  Q5_0  22 B / 32: d, qh u32 (bit j = 5th bit of value j), qs[16], value = d * (q - 16)
  Q5_1  24 B / 32: d, m, qh, qs[16], value = d * q + m
  Q8_0  34 B / 32: d, qs int8[32], value = q * d
  IQ4_NL 18 B / 32: d, qs[16], value = d * kvalues[q]
  Q2_K  84 B / 256: scales[16] (lo nibble scale, hi nibble min), qs[64] (2-bit), d, dmin
  Q3_K 110 B / 256: hmask[32], qs[64], scales[12] (16 x 6-bit), d
  Q4_K 144 B / 256: d, dmin, scales[12] (8 x 6-bit scale + min), qs[128]
  Q5_K 176 B / 256: d, dmin, scales[12], qh[32], qs[128]
  Q6_K 210 B / 256: ql[128], qh[64], scales int8[16], d
  IQ4_XS 136 B / 256: d, scales_h u16, scales_l[4], qs[128]
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit, prange
from numba.np.ufunc.parallel import _launch_threads

from .simd import (ld, ld_f16, ld_i8, ld_u8, ld_u16, ld_u32, vadd, vbcast, vbf16, vcvt, vf16, vfma,
                   vi8, viand, vibcast, viota, vior, vishl, vishr, vishrv, visub, vload, vlut, vmul,
                   vreduce16, vstore, vstore2x8, vstore4, vstore4x4, vsub, vsum, vu8, vzero,
                   prefetch_stream, threads_get, threads_set, vdot_bf16, vload_bf16, vstore_bf16)

_launch_threads()  # start numba's threading layer: registers the symbols threads_get/set call

# ggml's kvalues_iq4nl
_IQ4NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                         dtype=np.float32)

_JIT = dict(cache=True, fastmath=True, nogil=True)
_EXACT = dict(cache=True, fastmath=False, nogil=True)  # dequantization must not fuse mul/add


# ================================================================== skeletons

@njit(fastmath=True, nogil=True, cache=True)
def sums16(x):
    """sums of every 16 consecutive values of x (C-contiguous float32, size a multiple of 16)"""
    n = x.size // 16
    xs = np.empty(n, np.float32)
    for i in range(n):
        xs[i] = vsum(vload(x, 16 * i))
    return xs


@njit(inline="always")
def _serial_begin(serial):
    """With `serial`, this thread's pranges run on it alone (waking the pool costs more than a
    small product saves); returns the thread count `_serial_end` restores."""
    threads = threads_get()
    if serial:
        threads_set(1)
    return threads


@njit(inline="always")
def _serial_end(serial, threads):
    if serial:
        threads_set(threads)


@njit(inline="always")
def _row_dot(w, bo, x, xo, xs, so, nb, dot, BS, TS):
    """One weight row (nb blocks from byte bo) . one token's activations (from xo; their
    16-value sums from so): the inner loop of the decode kernels."""
    a0 = vzero()
    a1 = vzero()
    ms = np.float32(0)
    for _ in range(nb):
        a0, a1, ms = dot(w, bo, x, xo, xs, so, a0, a1, ms)
        bo += TS
        xo += BS
        so += BS // 16
    return vsum(vadd(a0, a1)) + ms


@njit(inline="always")
def _matvec(w, x, out, serial, dot, BS, TS):
    """out[t, r] = x[t] . W[r]; `dot` accumulates one block (see `_dot_*`). With `serial`, the
    rows are done by the calling thread alone (no thread wake-up for a small matrix)."""
    threads = _serial_begin(serial)
    nrows = w.shape[0]
    rb = w.shape[1]
    nt = x.shape[0]
    k = x.shape[1]
    nb = k // BS
    xs = sums16(x)
    for r in prange(nrows):
        for t in range(nt):
            out[t, r] = _row_dot(w, r * rb, x, t * k, xs, t * (k // 16), nb, dot, BS, TS)
    _serial_end(serial, threads)


@njit(inline="always")
def _matvec_id(w, x, experts, x_rows, out, serial, dot, BS, TS):
    """out[i, r] = x[x_rows[i]] . W[experts[i] * n_out + r] for every pair i: `w` holds the
    experts' matrices one after the other (n_expert * n_out rows), `n_out` = out.shape[1]. Only
    the selected experts' rows are read; the work is every row of every pair, spread over the
    threads (unless `serial`)."""
    threads = _serial_begin(serial)
    rb = w.shape[1]
    n_out = out.shape[1]
    k = x.shape[1]
    nb = k // BS
    xs = sums16(x)
    for job in prange(experts.shape[0] * n_out):
        i = job // n_out
        r = job - i * n_out
        t = ld(x_rows, i)
        out[i, r] = _row_dot(w, (ld(experts, i) * n_out + r) * rb, x, t * k, xs, t * (k // 16),
                             nb, dot, BS, TS)
    _serial_end(serial, threads)


@njit(inline="always")
def _rows(w, rows, out, serial, deq, BS, TS, CH):
    """out[i] = W[rows[i]] dequantized exactly, 16 values at a time; parallel over rows unless
    `serial`."""
    threads = _serial_begin(serial)
    rb = w.shape[1]
    k = out.shape[1]
    nb = k // BS
    for i in prange(rows.shape[0]):
        bo = ld(rows, i) * rb
        oo = i * k
        for _ in range(nb):
            for c in range(CH):
                vstore(out, oo + 16 * c, deq(w, bo, c))
            bo += TS
            oo += BS
    _serial_end(serial, threads)



@njit(inline="always")
def _tile2x8(w, bo, rb, x, xo, k, nb, deq, BS, TS, CH, out, oo, N, pf):
    """out.flat[oo + j * N + i] = x[token j] . W[row i] for 2 rows (the first at byte bo, rb bytes
    apart) and 8 tokens (the first at xo, k values apart): 16 accumulators; each 16-value chunk
    of the 2 rows is dequantized once and multiplied into the 8 tokens' activations.

    Meanwhile the 2 rows' worth of bytes from byte pf on are prefetched, as many per block as the
    tile reads: the hardware prefetchers do not follow the tile's interleaved rows, and a matrix
    that is not in the caches (an LM head) took 4-5 times as long without. Non-temporally
    (`prefetch_stream`): weights read once per step then leave the KV cache in L2/L3 (gemma3
    270M Q4_K_M, steps of eight sequences ~9 % faster in five alternating process pairs)."""
    a00 = vzero(); a01 = vzero(); a02 = vzero(); a03 = vzero()  # noqa: E702
    a04 = vzero(); a05 = vzero(); a06 = vzero(); a07 = vzero()  # noqa: E702
    a10 = vzero(); a11 = vzero(); a12 = vzero(); a13 = vzero()  # noqa: E702
    a14 = vzero(); a15 = vzero(); a16 = vzero(); a17 = vzero()  # noqa: E702
    for _ in range(nb):
        for p in range(0, 2 * TS, 64):
            prefetch_stream(w, pf + p)
        pf += 2 * TS
        for c in range(CH):
            v0 = deq(w, bo, c)
            v1 = deq(w, bo + rb, c)
            o = xo + 16 * c
            xv = vload(x, o)
            a00 = vfma(v0, xv, a00); a10 = vfma(v1, xv, a10)  # noqa: E702
            xv = vload(x, o + k)
            a01 = vfma(v0, xv, a01); a11 = vfma(v1, xv, a11)  # noqa: E702
            xv = vload(x, o + 2 * k)
            a02 = vfma(v0, xv, a02); a12 = vfma(v1, xv, a12)  # noqa: E702
            xv = vload(x, o + 3 * k)
            a03 = vfma(v0, xv, a03); a13 = vfma(v1, xv, a13)  # noqa: E702
            xv = vload(x, o + 4 * k)
            a04 = vfma(v0, xv, a04); a14 = vfma(v1, xv, a14)  # noqa: E702
            xv = vload(x, o + 5 * k)
            a05 = vfma(v0, xv, a05); a15 = vfma(v1, xv, a15)  # noqa: E702
            xv = vload(x, o + 6 * k)
            a06 = vfma(v0, xv, a06); a16 = vfma(v1, xv, a16)  # noqa: E702
            xv = vload(x, o + 7 * k)
            a07 = vfma(v0, xv, a07); a17 = vfma(v1, xv, a17)  # noqa: E702
        bo += TS
        xo += BS
    # lane 2j + i = token j, row i
    vstore2x8(out, oo, N, vreduce16(a00, a10, a01, a11, a02, a12, a03, a13,
                                    a04, a14, a05, a15, a06, a16, a07, a17), False)


@njit(inline="always")
def _tile4x4(w, bo, rb, x, xo, k, nb, deq, BS, TS, CH, out, oo, N, pf):
    """`_tile2x8`'s product (and prefetching) for 4 rows and 4 tokens (the batch's last 4)."""
    a00 = vzero(); a01 = vzero(); a02 = vzero(); a03 = vzero()  # noqa: E702
    a10 = vzero(); a11 = vzero(); a12 = vzero(); a13 = vzero()  # noqa: E702
    a20 = vzero(); a21 = vzero(); a22 = vzero(); a23 = vzero()  # noqa: E702
    a30 = vzero(); a31 = vzero(); a32 = vzero(); a33 = vzero()  # noqa: E702
    for _ in range(nb):
        for p in range(0, 4 * TS, 64):
            prefetch_stream(w, pf + p)
        pf += 4 * TS
        for c in range(CH):
            v0 = deq(w, bo, c)
            v1 = deq(w, bo + rb, c)
            v2 = deq(w, bo + 2 * rb, c)
            v3 = deq(w, bo + 3 * rb, c)
            o = xo + 16 * c
            xv = vload(x, o)
            a00 = vfma(v0, xv, a00); a10 = vfma(v1, xv, a10)  # noqa: E702
            a20 = vfma(v2, xv, a20); a30 = vfma(v3, xv, a30)  # noqa: E702
            xv = vload(x, o + k)
            a01 = vfma(v0, xv, a01); a11 = vfma(v1, xv, a11)  # noqa: E702
            a21 = vfma(v2, xv, a21); a31 = vfma(v3, xv, a31)  # noqa: E702
            xv = vload(x, o + 2 * k)
            a02 = vfma(v0, xv, a02); a12 = vfma(v1, xv, a12)  # noqa: E702
            a22 = vfma(v2, xv, a22); a32 = vfma(v3, xv, a32)  # noqa: E702
            xv = vload(x, o + 3 * k)
            a03 = vfma(v0, xv, a03); a13 = vfma(v1, xv, a13)  # noqa: E702
            a23 = vfma(v2, xv, a23); a33 = vfma(v3, xv, a33)  # noqa: E702
        bo += TS
        xo += BS
    # lane 4j + i = token j, row i
    vstore4x4(out, oo, N, vreduce16(a00, a10, a20, a30, a01, a11, a21, a31,
                                    a02, a12, a22, a32, a03, a13, a23, a33), False)


@njit(inline="always")
def _matmat(w, x, out, serial, deq, BS, TS, CH):
    """out[t, r] = x[t] . W[r] for a few tokens (a decode step of several sequences); the token
    count must be a multiple of 4 (the caller pads).

    As ggml's mul_mat, which reads each weight block once for all of a batch's tokens, the
    weights are unpacked once per tile of tokens rather than once per token: tiles of 2 rows x
    8 tokens (`_tile2x8`; 4 x 4 for a last group of 4 tokens) keep 16 accumulators in registers,
    and each dequantized 16-value chunk (`deq`) feeds 8 (4) FMAs. Dequantizing first applies
    the scales once per chunk for all the tile's tokens, where the `_dot_*` form would apply them
    once per token (cheaper for one token only). At 8 tokens the FMAs themselves are the bound
    (one per 16 values per token). Parallel over blocks of 4 rows unless `serial` (each work item
    prefetches the next one's rows); the last nrows % 4 rows one at a time."""
    threads = _serial_begin(serial)
    nrows = w.shape[0]
    rb = w.shape[1]
    nt = x.shape[0]
    k = x.shape[1]
    N = out.shape[1]
    nb = k // BS
    for rq in prange(nrows // 4):
        r = 4 * rq
        t = 0
        while t + 8 <= nt:
            _tile2x8(w, r * rb, rb, x, t * k, k, nb, deq, BS, TS, CH, out, t * N + r, N,
                     (r + 4) * rb)
            _tile2x8(w, (r + 2) * rb, rb, x, t * k, k, nb, deq, BS, TS, CH, out, t * N + r + 2, N,
                     (r + 6) * rb)
            t += 8
        if t < nt:
            _tile4x4(w, r * rb, rb, x, t * k, k, nb, deq, BS, TS, CH, out, t * N + r, N,
                     (r + 4) * rb)
    for r in range(nrows // 4 * 4, nrows):
        for t in range(nt):
            a = vzero()
            bo = r * rb
            xo = t * k
            for _ in range(nb):
                for c in range(CH):
                    a = vfma(deq(w, bo, c), vload(x, xo + 16 * c), a)
                bo += TS
                xo += BS
            out[t, r] = vsum(a)
    _serial_end(serial, threads)


# A block dot `_dot_<type>(w, bo, x, xo, xs, so, a0, a1, ms) -> (a0, a1, ms)` adds the block at
# byte bo of w times x[xo : xo + BS] into the vector accumulators a0/a1 and, for the formats with
# a min/offset term factored out, into the scalar ms, using xs[so + i] = sum of the i-th 16 values
# of the block's slice of x. Block scales are applied once per sub-block, not per value. The
# 32-value formats return (a1, a0) swapped so consecutive blocks alternate accumulators.


# ================================================================== 32-value blocks

@njit(inline="always")
def _nib(w, o, c):
    """low (c even) or high (c odd) nibbles of the 16 bytes at w[o]"""
    return viand(vishr(vu8(w, o), 4 * (c & 1)), vibcast(15))


@njit(inline="always")
def _qh5(qh, c):
    """the 5th bits of values 16c..16c+15 from a Q5 block's 32-bit qh, as 0 / 16"""
    return vishl(viand(vishrv(vibcast(qh), vior(viota(), vibcast(16 * c))), vibcast(1)), 4)


@njit(inline="always")
def _pair(v0, v1, x, xo):
    """v0 . x[xo:xo+16] + v1 . x[xo+16:xo+32], lane-wise"""
    return vfma(v1, vload(x, xo + 16), vmul(v0, vload(x, xo)))


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


@njit(inline="always")
def _deq_iq4_nl(w, bo, c):
    return vmul(vlut(_IQ4NL_VALUES, _nib(w, bo + 2, c)), vbcast(ld_f16(w, bo)))


@njit(inline="always")
def _dot_iq4_nl(w, bo, x, xo, xs, so, a0, a1, ms):
    s = _pair(vlut(_IQ4NL_VALUES, _nib(w, bo + 2, 0)), vlut(_IQ4NL_VALUES, _nib(w, bo + 2, 1)), x, xo)
    return a1, vfma(vbcast(ld_f16(w, bo)), s, a0), ms


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


# ================================================================== 256-value K-quant blocks

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


@njit(inline="always")
def _iq4_xs_dl(w, bo, ib):
    lo = (ld_u8(w, bo + 4 + (ib >> 1)) >> (4 * (ib & 1))) & 15
    hi = (ld_u16(w, bo + 2) >> (2 * ib)) & 3
    ls = lo | (hi << 4)
    return ld_f16(w, bo) * np.float32(ls - 32)


@njit(inline="always")
def _deq_iq4_xs(w, bo, c):
    ib = c >> 1
    return vmul(vbcast(_iq4_xs_dl(w, bo, ib)), vlut(_IQ4NL_VALUES, _nib(w, bo + 8 + 16 * ib, c)))


@njit(inline="always")
def _dot_iq4_xs(w, bo, x, xo, xs, so, a0, a1, ms):
    for ib in range(0, 8, 2):
        s0 = _pair(vlut(_IQ4NL_VALUES, _nib(w, bo + 8 + 16 * ib, 0)),
                   vlut(_IQ4NL_VALUES, _nib(w, bo + 8 + 16 * ib, 1)), x, xo + 32 * ib)
        s1 = _pair(vlut(_IQ4NL_VALUES, _nib(w, bo + 24 + 16 * ib, 0)),
                   vlut(_IQ4NL_VALUES, _nib(w, bo + 24 + 16 * ib, 1)), x, xo + 32 * ib + 32)
        a0 = vfma(vbcast(_iq4_xs_dl(w, bo, ib)), s0, a0)
        a1 = vfma(vbcast(_iq4_xs_dl(w, bo, ib + 1)), s1, a1)
    return a0, a1, ms


# ================================================================== float GEMM (prefill)

@njit(inline="always")
def _dot1(x, xo, wt, wo, n, load, mac, step):
    """x.flat[xo : xo + n] . wt.flat[wo : wo + n], n a multiple of `step`"""
    a = vzero()
    b = vzero()
    i = 0
    while i + 2 * step <= n:
        a = mac(load(wt, wo + i), load(x, xo + i), a)
        b = mac(load(wt, wo + i + step), load(x, xo + i + step), b)
        i += 2 * step
    if i < n:
        a = mac(load(wt, wo + i), load(x, xo + i), a)
    return vsum(vadd(a, b))


GEMM_ROW_BLOCK = 32  # weight rows per parallel work item
GEMM_K_BLOCK = 2048  # columns per pass: a 32-row block of them stays in L2


@njit(inline="always")
def _gemm(x, wt, out, r0, serial, load, mac, step):
    """out[:, r0 : r0 + m] = x @ wt.T, x (n, k), wt (m, k), out (n, N); k % step == 0.

    Parallel over blocks of 32 weight rows. Register tile: 4 rows x 4 tokens = 16 accumulators of
    16 lanes (8 loads per 16 multiply-adds of `step` values) over column blocks of GEMM_K_BLOCK,
    reduced by a transpose-and-add tree and added into out; leftover tokens go 4 rows x 1 token.
    `load(arr, i)` gives `step` values from arr.flat[i], `mac(w, x, acc)` multiplies them into
    16 float32 lanes."""
    threads = _serial_begin(serial)
    n = x.shape[0]
    k = x.shape[1]
    m = wt.shape[0]
    N = out.shape[1]
    for blk in prange((m + GEMM_ROW_BLOCK - 1) // GEMM_ROW_BLOCK):
        rs = blk * GEMM_ROW_BLOCK
        re = min(m, rs + GEMM_ROW_BLOCK)
        for kb in range(0, k, GEMM_K_BLOCK):
            kl = min(GEMM_K_BLOCK, k - kb)
            more = kb > 0  # later column blocks add to the partial sums
            t = 0
            while t + 4 <= n:
                r = rs
                while r + 4 <= re:
                    a00 = vzero(); a01 = vzero(); a02 = vzero(); a03 = vzero()  # noqa: E702
                    a10 = vzero(); a11 = vzero(); a12 = vzero(); a13 = vzero()  # noqa: E702
                    a20 = vzero(); a21 = vzero(); a22 = vzero(); a23 = vzero()  # noqa: E702
                    a30 = vzero(); a31 = vzero(); a32 = vzero(); a33 = vzero()  # noqa: E702
                    wo = r * k + kb
                    xo = t * k + kb
                    for kk in range(0, kl, step):
                        w0 = load(wt, wo + kk)
                        w1 = load(wt, wo + k + kk)
                        w2 = load(wt, wo + 2 * k + kk)
                        w3 = load(wt, wo + 3 * k + kk)
                        xv = load(x, xo + kk)
                        a00 = mac(w0, xv, a00); a10 = mac(w1, xv, a10)  # noqa: E702
                        a20 = mac(w2, xv, a20); a30 = mac(w3, xv, a30)  # noqa: E702
                        xv = load(x, xo + k + kk)
                        a01 = mac(w0, xv, a01); a11 = mac(w1, xv, a11)  # noqa: E702
                        a21 = mac(w2, xv, a21); a31 = mac(w3, xv, a31)  # noqa: E702
                        xv = load(x, xo + 2 * k + kk)
                        a02 = mac(w0, xv, a02); a12 = mac(w1, xv, a12)  # noqa: E702
                        a22 = mac(w2, xv, a22); a32 = mac(w3, xv, a32)  # noqa: E702
                        xv = load(x, xo + 3 * k + kk)
                        a03 = mac(w0, xv, a03); a13 = mac(w1, xv, a13)  # noqa: E702
                        a23 = mac(w2, xv, a23); a33 = mac(w3, xv, a33)  # noqa: E702
                    # lane 4j + i = token t + j, row r + i
                    s = vreduce16(a00, a10, a20, a30, a01, a11, a21, a31,
                                  a02, a12, a22, a32, a03, a13, a23, a33)
                    vstore4x4(out, t * N + r0 + r, N, s, more)
                    r += 4
                while r < re:  # leftover rows of the block
                    for tt in range(t, t + 4):
                        v = _dot1(x, tt * k + kb, wt, r * k + kb, kl, load, mac, step)
                        out[tt, r0 + r] = out[tt, r0 + r] + v if more else v
                    r += 1
                t += 4
            while t < n:  # leftover tokens, one at a time against 4 rows
                r = rs
                while r + 4 <= re:
                    a0 = vzero()
                    a1 = vzero()
                    a2 = vzero()
                    a3 = vzero()
                    wo = r * k + kb
                    xo = t * k + kb
                    for kk in range(0, kl, step):
                        xv = load(x, xo + kk)
                        a0 = mac(load(wt, wo + kk), xv, a0)
                        a1 = mac(load(wt, wo + k + kk), xv, a1)
                        a2 = mac(load(wt, wo + 2 * k + kk), xv, a2)
                        a3 = mac(load(wt, wo + 3 * k + kk), xv, a3)
                    z = vzero()
                    s = vreduce16(a0, a1, a2, a3, z, z, z, z, z, z, z, z, z, z, z, z)
                    vstore4(out, t * N + r0 + r, s, more)
                    r += 4
                while r < re:
                    v = _dot1(x, t * k + kb, wt, r * k + kb, kl, load, mac, step)
                    out[t, r0 + r] = out[t, r0 + r] + v if more else v
                    r += 1
                t += 1
    _serial_end(serial, threads)


@njit(parallel=True, **_JIT)
def gemm_f32(x, wt, out, r0, serial):
    """out[:, r0 : r0 + m] = x @ wt.T for float32 x (n, k), wt (m, k), out (n, N); k % 16 == 0;
    on the calling thread alone with `serial`. 86-101 GFLOP/s per AVX-512 core here, on par with
    single-threaded OpenBLAS (93-97)."""
    _gemm(x, wt, out, r0, serial, vload, vfma, 16)


@njit(parallel=True, **_JIT)
def gemm_bf16(x, wt, out, r0, serial):
    """gemm_f32 on bfloat16 bits (uint16 x (n, k), wt (m, k)), k % 32 == 0, float32 sums: twice
    the multiply-adds per instruction (vdpbf16ps). Only where HAS_AVX512_BF16."""
    _gemm(x, wt, out, r0, serial, vload_bf16, vdot_bf16, 32)


@njit(parallel=True, **_JIT)
def to_bf16(src, dst, serial):
    """dst (uint16, same shape, C-contiguous) = src (float32, size % 16 == 0) rounded to
    bfloat16."""
    threads = _serial_begin(serial)
    n = src.size // 16
    for i in prange(n):
        vstore_bf16(dst, 16 * i, vload(src, 16 * i))
    _serial_end(serial, threads)


@njit(parallel=True, **_JIT)
def gemm_nn_f32(x, w, c0, out, serial):
    """out = x @ w[:, c0 : c0 + N] for float32 x (n, k), w (k, ldw), out (n, N); N % 16 == 0;
    on the calling thread alone with `serial`.

    The form suited to short inner dimensions (attention over 64-wide heads), where gemm_f32's
    dot-product tiles spend much of their time reducing: parallel over blocks of 4 rows of x; a
    4 x 32 tile of out is 8 accumulators, each k step broadcasting 4 values of x against 2 vectors
    of a row of w. No reduction, no k blocking (a 32-column slab of w stays in L2)."""
    threads = _serial_begin(serial)
    n = x.shape[0]
    k = x.shape[1]
    ldw = w.shape[1]
    N = out.shape[1]
    for blk in prange((n + 3) // 4):
        t0 = blk * 4
        rows = min(4, n - t0)
        c = 0
        while c < N:
            wide = c + 32 <= N
            a00 = vzero(); a01 = vzero(); a10 = vzero(); a11 = vzero()  # noqa: E702
            a20 = vzero(); a21 = vzero(); a30 = vzero(); a31 = vzero()  # noqa: E702
            wo = c0 + c
            if rows == 4 and wide:
                for kk in range(k):
                    w0 = vload(w, kk * ldw + wo)
                    w1 = vload(w, kk * ldw + wo + 16)
                    xv = vbcast(x[t0, kk])
                    a00 = vfma(xv, w0, a00); a01 = vfma(xv, w1, a01)  # noqa: E702
                    xv = vbcast(x[t0 + 1, kk])
                    a10 = vfma(xv, w0, a10); a11 = vfma(xv, w1, a11)  # noqa: E702
                    xv = vbcast(x[t0 + 2, kk])
                    a20 = vfma(xv, w0, a20); a21 = vfma(xv, w1, a21)  # noqa: E702
                    xv = vbcast(x[t0 + 3, kk])
                    a30 = vfma(xv, w0, a30); a31 = vfma(xv, w1, a31)  # noqa: E702
                vstore(out, t0 * N + c, a00); vstore(out, t0 * N + c + 16, a01)  # noqa: E702
                vstore(out, (t0 + 1) * N + c, a10)
                vstore(out, (t0 + 1) * N + c + 16, a11)
                vstore(out, (t0 + 2) * N + c, a20)
                vstore(out, (t0 + 2) * N + c + 16, a21)
                vstore(out, (t0 + 3) * N + c, a30)
                vstore(out, (t0 + 3) * N + c + 16, a31)
                c += 32
            else:  # the last rows or the last 16 columns: one row by 16 columns at a time
                for t in range(t0, t0 + rows):
                    acc = vzero()
                    for kk in range(k):
                        acc = vfma(vbcast(x[t, kk]), vload(w, kk * ldw + wo), acc)
                    vstore(out, t * N + c, acc)
                c += 16
    _serial_end(serial, threads)


# ================================================================== kernels
# matvec_<T>(w, x, out, serial): out (n_tokens, n_out) = x @ W.T  (parallel over rows)
# matvec_id_<T>(w, x, experts, x_rows, out, serial): out (n_pairs, n_out), selected experts' rows
# matmat_<T>(w, x, out, serial): x @ W.T for n_tokens a multiple of 4 (tiles of tokens)
# rows_<T>(w, rows, out, serial): out (len(rows), n_in) = W[rows] (parallel over rows, bit-exact)

@njit(parallel=True, **_JIT)
def matvec_q4_0(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_q4_0, 32, 18)


@njit(parallel=True, **_JIT)
def matvec_id_q4_0(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_q4_0, 32, 18)


@njit(parallel=True, **_JIT)
def matmat_q4_0(w, x, out, serial):
    _matmat(w, x, out, serial, _deq_q4_0, 32, 18, 2)


@njit(parallel=True, **_EXACT)
def rows_q4_0(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_q4_0, 32, 18, 2)


@njit(parallel=True, **_JIT)
def matvec_q4_1(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_q4_1, 32, 20)


@njit(parallel=True, **_JIT)
def matvec_id_q4_1(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_q4_1, 32, 20)


@njit(parallel=True, **_JIT)
def matmat_q4_1(w, x, out, serial):
    _matmat(w, x, out, serial, _deq_q4_1, 32, 20, 2)


@njit(parallel=True, **_EXACT)
def rows_q4_1(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_q4_1, 32, 20, 2)


@njit(parallel=True, **_JIT)
def matvec_q5_0(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_q5_0, 32, 22)


@njit(parallel=True, **_JIT)
def matvec_id_q5_0(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_q5_0, 32, 22)


@njit(parallel=True, **_JIT)
def matmat_q5_0(w, x, out, serial):
    _matmat(w, x, out, serial, _deq_q5_0, 32, 22, 2)


@njit(parallel=True, **_EXACT)
def rows_q5_0(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_q5_0, 32, 22, 2)


@njit(parallel=True, **_JIT)
def matvec_q5_1(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_q5_1, 32, 24)


@njit(parallel=True, **_JIT)
def matvec_id_q5_1(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_q5_1, 32, 24)


@njit(parallel=True, **_JIT)
def matmat_q5_1(w, x, out, serial):
    _matmat(w, x, out, serial, _deq_q5_1, 32, 24, 2)


@njit(parallel=True, **_EXACT)
def rows_q5_1(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_q5_1, 32, 24, 2)


@njit(parallel=True, **_JIT)
def matvec_q8_0(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_q8_0, 32, 34)


@njit(parallel=True, **_JIT)
def matvec_id_q8_0(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_q8_0, 32, 34)


@njit(parallel=True, **_JIT)
def matmat_q8_0(w, x, out, serial):
    _matmat(w, x, out, serial, _deq_q8_0, 32, 34, 2)


@njit(parallel=True, **_EXACT)
def rows_q8_0(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_q8_0, 32, 34, 2)


@njit(parallel=True, **_JIT)
def matvec_iq4_nl(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_iq4_nl, 32, 18)


@njit(parallel=True, **_JIT)
def matvec_id_iq4_nl(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_iq4_nl, 32, 18)


@njit(parallel=True, **_JIT)
def matmat_iq4_nl(w, x, out, serial):
    _matmat(w, x, out, serial, _deq_iq4_nl, 32, 18, 2)


@njit(parallel=True, **_EXACT)
def rows_iq4_nl(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_iq4_nl, 32, 18, 2)


@njit(parallel=True, **_JIT)
def matvec_f16(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_f16, 32, 64)


@njit(parallel=True, **_JIT)
def matvec_id_f16(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_f16, 32, 64)


@njit(parallel=True, **_JIT)
def matmat_f16(w, x, out, serial):
    _matmat(w, x, out, serial, _deq_f16, 32, 64, 2)


@njit(parallel=True, **_EXACT)
def rows_f16(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_f16, 32, 64, 2)


@njit(parallel=True, **_JIT)
def matvec_bf16(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_bf16, 32, 64)


@njit(parallel=True, **_JIT)
def matvec_id_bf16(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_bf16, 32, 64)


@njit(parallel=True, **_JIT)
def matmat_bf16(w, x, out, serial):
    _matmat(w, x, out, serial, _deq_bf16, 32, 64, 2)


@njit(parallel=True, **_EXACT)
def rows_bf16(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_bf16, 32, 64, 2)


@njit(parallel=True, **_JIT)
def matvec_q2_k(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_q2_k, 256, 84)


@njit(parallel=True, **_JIT)
def matvec_id_q2_k(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_q2_k, 256, 84)


@njit(parallel=True, **_JIT)
def matmat_q2_k(w, x, out, serial):
    _matmat(w, x, out, serial, _deq_q2_k, 256, 84, 16)


@njit(parallel=True, **_EXACT)
def rows_q2_k(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_q2_k, 256, 84, 16)


@njit(parallel=True, **_JIT)
def matvec_q3_k(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_q3_k, 256, 110)


@njit(parallel=True, **_JIT)
def matvec_id_q3_k(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_q3_k, 256, 110)


@njit(parallel=True, **_JIT)
def matmat_q3_k(w, x, out, serial):
    _matmat(w, x, out, serial, _deq_q3_k, 256, 110, 16)


@njit(parallel=True, **_EXACT)
def rows_q3_k(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_q3_k, 256, 110, 16)


@njit(parallel=True, **_JIT)
def matvec_q4_k(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_q4_k, 256, 144)


@njit(parallel=True, **_JIT)
def matvec_id_q4_k(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_q4_k, 256, 144)


@njit(parallel=True, **_JIT)
def matmat_q4_k(w, x, out, serial):
    _matmat(w, x, out, serial, _deq_q4_k, 256, 144, 16)


@njit(parallel=True, **_EXACT)
def rows_q4_k(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_q4_k, 256, 144, 16)


@njit(parallel=True, **_JIT)
def matvec_q5_k(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_q5_k, 256, 176)


@njit(parallel=True, **_JIT)
def matvec_id_q5_k(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_q5_k, 256, 176)


@njit(parallel=True, **_JIT)
def matmat_q5_k(w, x, out, serial):
    _matmat(w, x, out, serial, _deq_q5_k, 256, 176, 16)


@njit(parallel=True, **_EXACT)
def rows_q5_k(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_q5_k, 256, 176, 16)


@njit(parallel=True, **_JIT)
def matvec_q6_k(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_q6_k, 256, 210)


@njit(parallel=True, **_JIT)
def matvec_id_q6_k(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_q6_k, 256, 210)


@njit(parallel=True, **_JIT)
def matmat_q6_k(w, x, out, serial):
    _matmat(w, x, out, serial, _deq_q6_k, 256, 210, 16)


@njit(parallel=True, **_EXACT)
def rows_q6_k(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_q6_k, 256, 210, 16)


@njit(parallel=True, **_JIT)
def matvec_iq4_xs(w, x, out, serial):
    _matvec(w, x, out, serial, _dot_iq4_xs, 256, 136)


@njit(parallel=True, **_JIT)
def matvec_id_iq4_xs(w, x, experts, x_rows, out, serial):
    _matvec_id(w, x, experts, x_rows, out, serial, _dot_iq4_xs, 256, 136)


@njit(parallel=True, **_JIT)
def matmat_iq4_xs(w, x, out, serial):
    _matmat(w, x, out, serial, _deq_iq4_xs, 256, 136, 16)


@njit(parallel=True, **_EXACT)
def rows_iq4_xs(w, rows, out, serial):
    _rows(w, rows, out, serial, _deq_iq4_xs, 256, 136, 16)


class TypeKernels(NamedTuple):
    """One weight type's kernels (see the module's docstring for each)."""
    block_size: int
    matvec: object
    rows: object
    matvec_id: object
    matmat: object


# type name -> its kernels
KERNELS: dict[str, TypeKernels] = {
    "Q4_0": TypeKernels(32, matvec_q4_0, rows_q4_0, matvec_id_q4_0, matmat_q4_0),
    "Q4_1": TypeKernels(32, matvec_q4_1, rows_q4_1, matvec_id_q4_1, matmat_q4_1),
    "Q5_0": TypeKernels(32, matvec_q5_0, rows_q5_0, matvec_id_q5_0, matmat_q5_0),
    "Q5_1": TypeKernels(32, matvec_q5_1, rows_q5_1, matvec_id_q5_1, matmat_q5_1),
    "Q8_0": TypeKernels(32, matvec_q8_0, rows_q8_0, matvec_id_q8_0, matmat_q8_0),
    "IQ4_NL": TypeKernels(32, matvec_iq4_nl, rows_iq4_nl, matvec_id_iq4_nl, matmat_iq4_nl),
    "F16": TypeKernels(32, matvec_f16, rows_f16, matvec_id_f16, matmat_f16),
    "BF16": TypeKernels(32, matvec_bf16, rows_bf16, matvec_id_bf16, matmat_bf16),
    "Q2_K": TypeKernels(256, matvec_q2_k, rows_q2_k, matvec_id_q2_k, matmat_q2_k),
    "Q3_K": TypeKernels(256, matvec_q3_k, rows_q3_k, matvec_id_q3_k, matmat_q3_k),
    "Q4_K": TypeKernels(256, matvec_q4_k, rows_q4_k, matvec_id_q4_k, matmat_q4_k),
    "Q5_K": TypeKernels(256, matvec_q5_k, rows_q5_k, matvec_id_q5_k, matmat_q5_k),
    "Q6_K": TypeKernels(256, matvec_q6_k, rows_q6_k, matvec_id_q6_k, matmat_q6_k),
    "IQ4_XS": TypeKernels(256, matvec_iq4_xs, rows_iq4_xs, matvec_id_iq4_xs, matmat_iq4_xs),
}
