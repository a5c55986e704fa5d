"""The float32 kernels of `llamatui.inference.cpu.matmul`: the skeletons every weight type's
kernels are made of, the GEMMs, and how a type registers its kernels. The types' own code is in
`matmul_floats`, `matmul_legacy`, `matmul_kquants` and `matmul_iquants`, one file per family as in
inference/quants.

Per type (written with the 16-lane vectors of `simd`):

- `_deq_<type>(w, bo, c)`: the c-th run of 16 consecutive values of the block starting at byte
  `bo` of the weight bytes `w`, dequantized with ggml's float32 formulas in ggml's operation order
  (no fused multiply-add), so dequantized rows match `dequantize_row_*` bit for bit (in the
  fast-math batch decode kernels LLVM may fuse a scale and a min into one FMA: float32-accurate).
- `_dot_<type>(w, bo, x, xo, xs, so, a0, a1, ms) -> (a0, a1, ms)`: adds the block at byte bo of w
  times x[xo : xo + BS] into the vector accumulators a0/a1 and, for the formats with a min/offset
  term factored out, into the scalar ms, using xs[so + i] = sum of the i-th 16 values of the
  block's slice of x. Scales are applied once per (sub-)block, not per value; the 32-value
  formats return (a1, a0) swapped so consecutive blocks alternate accumulators. float32-accurate,
  not bit-exact.

Skeletons (`inline='always'`, so each kernel compiles to one flat function with the format's
constants folded and its small loops unrolled) turn these into each type's four kernels:

- `matvec_<type>(w, x, out, serial)`, decode: out[t, r] = x[t] . W[r], parallel over rows
  (`prange`), each weight row streamed once per token.
- `matvec_id_<type>(w, x, experts, x_rows, out, serial)`, decode of a mixture of experts: the
  fused decode kernel over the rows of the selected experts only (ggml_mul_mat_id's few-token
  case), all (token, expert) pairs in one parallel launch.
- `matmat_<type>(w, x, out, serial)`, batch decode: the same product for a few tokens (a multiple
  of 4), each 16-value chunk of a row dequantized once for a tile of 8 (or 4) tokens.
- `rows_<type>(w, rows, out, serial)`: out[i] = W[rows[i]], exact (prefill tiles, embeddings).

and `gemm_f32(x, wt, out, r0, serial)` is the float32 GEMM for the dequantized tiles (and F32
weights). `serial` runs a kernel on the calling thread alone (small work: waking the pool costs
more).

Registering: a type's four kernels go to its class as its "cpu" kernels
(`Q4_0.register_kernels("cpu", TypeKernels(...))`, see inference/quants); `matmul` finds them
there, and the engine's ENGINE_TYPES is derived from them. A kernel walks a row in steps of
(values, bytes) taken from the type's class (`Q4_0_VALUES, Q4_0_BYTES = Q4_0.span(MIN_STEP)`):
module-level ints are compile-time constants to numba, so LLVM unrolls the loops they bound;
the items of a module-level tuple are not (the batch decode tiles' loops would stay loops).
The four wrappers of a type are written out rather than made by a factory: numba's cache keys
a closure by pickling what it closes over, and a dispatcher pickles with a per-process id, so
every process would compile them again.

Specializations: the kernels are always called with a read-only uint8 C-contiguous 2-D weight,
float32 C-contiguous activations / outputs / tiles and int64 row ids (see `matmul.py`), so each
compiles once.

Cache note: numba's on-disk cache checks only a kernel's own file's timestamp. The kernels
inline `simd` and the skeletons here: after editing either, touch the matmul_*.py files (or
clear `__pycache__`).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit, prange
from numba.np.ufunc.parallel import _launch_threads

from ..quants.floats import F32
from .simd import (ld, vadd, vbcast, vfma, viand, vibcast, vishr, vload, vmul, vreduce16, vstore,
                   vstore2x8, vstore4, vstore4x4, vsum, vu8, vzero, prefetch_stream, threads_get,
                   threads_set, vdot_bf16, vload_bf16, vstore_bf16)

_launch_threads()  # start numba's threading layer: registers the symbols threads_get/set call

# The values a type's kernels take at a time at least: two 16-lane vectors (a float type's kernels
# take 32, a quantized type's one block).
MIN_STEP = 32

JIT = dict(cache=True, fastmath=True, nogil=True)
EXACT = dict(cache=True, fastmath=False, nogil=True)  # dequantization must not fuse mul/add


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
    """out[t, r] = x[t] . W[r]; `dot` accumulates one step of BS values in TS bytes (see
    `_dot_*`). With `serial`, the rows are done by the calling thread alone (no thread wake-up
    for a small matrix)."""
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
def _rows(w, rows, out, serial, deq, BS, TS):
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
            for c in range(BS // 16):
                vstore(out, oo + 16 * c, deq(w, bo, c))
            bo += TS
            oo += BS
    _serial_end(serial, threads)



@njit(inline="always")
def _tile2x8(w, bo, rb, x, xo, k, nb, deq, BS, TS, out, oo, N, pf):
    """out.flat[oo + j * N + i] = x[token j] . W[row i] for 2 rows (the first at byte bo, rb bytes
    apart) and 8 tokens (the first at xo, k values apart): 16 accumulators; each 16-value chunk
    of the 2 rows is dequantized once and multiplied into the 8 tokens' activations.

    Meanwhile the 2 rows' worth of bytes from byte pf on are prefetched, as many per block as the
    tile reads: the hardware prefetchers do not follow the tile's interleaved rows, so a matrix
    that is not in the caches (an LM head) would wait on memory. Non-temporally
    (`prefetch_stream`): weights read once per step then leave the KV cache in L2/L3."""
    a00 = vzero(); a01 = vzero(); a02 = vzero(); a03 = vzero()  # noqa: E702
    a04 = vzero(); a05 = vzero(); a06 = vzero(); a07 = vzero()  # noqa: E702
    a10 = vzero(); a11 = vzero(); a12 = vzero(); a13 = vzero()  # noqa: E702
    a14 = vzero(); a15 = vzero(); a16 = vzero(); a17 = vzero()  # noqa: E702
    for _ in range(nb):
        for p in range(0, 2 * TS, 64):
            prefetch_stream(w, pf + p)
        pf += 2 * TS
        for c in range(BS // 16):
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
def _tile4x4(w, bo, rb, x, xo, k, nb, deq, BS, TS, out, oo, N, pf):
    """`_tile2x8`'s product (and prefetching) for 4 rows and 4 tokens (the batch's last 4)."""
    a00 = vzero(); a01 = vzero(); a02 = vzero(); a03 = vzero()  # noqa: E702
    a10 = vzero(); a11 = vzero(); a12 = vzero(); a13 = vzero()  # noqa: E702
    a20 = vzero(); a21 = vzero(); a22 = vzero(); a23 = vzero()  # noqa: E702
    a30 = vzero(); a31 = vzero(); a32 = vzero(); a33 = vzero()  # noqa: E702
    for _ in range(nb):
        for p in range(0, 4 * TS, 64):
            prefetch_stream(w, pf + p)
        pf += 4 * TS
        for c in range(BS // 16):
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
def _matmat(w, x, out, serial, quad, deq, BS, TS):
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
    nb = k // BS
    for rq in prange(nrows // 4):  # the format's `_quad`, compiled on its own (see there)
        quad(np.int64(rq), w, x, out)
    for r in range(nrows // 4 * 4, nrows):
        for t in range(nt):
            a = vzero()
            bo = r * rb
            xo = t * k
            for _ in range(nb):
                for c in range(BS // 16):
                    a = vfma(deq(w, bo, c), vload(x, xo + 16 * c), a)
                bo += TS
                xo += BS
            out[t, r] = vsum(a)
    _serial_end(serial, threads)


@njit(inline="always")
def _quad(rq, w, x, out, deq, BS, TS):
    """`_matmat`'s work item: rows 4rq..4rq+3 for every token. Each format wraps it in a
    function of its own (`_quad_<type>`) that the parallel loop calls rather than inlines:
    numba's parfor passes copy and analyse a loop's whole body, which cost seconds of a first
    run's compilation per format. (Not one function taking `deq`: a dispatcher argument keeps
    numba from caching the kernel.)"""
    rb = w.shape[1]
    nt = x.shape[0]
    k = x.shape[1]
    N = out.shape[1]
    nb = k // BS
    r = 4 * rq
    t = 0
    while t + 8 <= nt:
        _tile2x8(w, r * rb, rb, x, t * k, k, nb, deq, BS, TS, out, t * N + r, N, (r + 4) * rb)
        _tile2x8(w, (r + 2) * rb, rb, x, t * k, k, nb, deq, BS, TS, out, t * N + r + 2, N,
                 (r + 6) * rb)
        t += 8
    if t < nt:
        _tile4x4(w, r * rb, rb, x, t * k, k, nb, deq, BS, TS, out, t * N + r, N, (r + 4) * rb)


# ================================================================== helpers of the block formats

@njit(inline="always")
def _nib(w, o, c):
    """low (c even) or high (c odd) nibbles of the 16 bytes at w[o]"""
    return viand(vishr(vu8(w, o), 4 * (c & 1)), vibcast(15))


@njit(inline="always")
def _pair(v0, v1, x, xo):
    """v0 . x[xo:xo+16] + v1 . x[xo+16:xo+32], lane-wise"""
    return vfma(v1, vload(x, xo + 16), vmul(v0, vload(x, xo)))


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


@njit(parallel=True, **JIT)
def gemm_f32(x, wt, out, r0, serial):
    """out[:, r0 : r0 + m] = x @ wt.T for float32 x (n, k), wt (m, k), out (n, N); k % 16 == 0;
    on the calling thread alone with `serial`. Per core on par with single-threaded OpenBLAS."""
    _gemm(x, wt, out, r0, serial, vload, vfma, 16)


@njit(parallel=True, **JIT)
def gemm_bf16(x, wt, out, r0, serial):
    """gemm_f32 on bfloat16 bits (uint16 x (n, k), wt (m, k)), k % 32 == 0, float32 sums: twice
    the multiply-adds per instruction (vdpbf16ps). Only where HAS_AVX512_BF16."""
    _gemm(x, wt, out, r0, serial, vload_bf16, vdot_bf16, 32)


@njit(parallel=True, **JIT)
def to_bf16(src, dst, serial):
    """dst (uint16, same shape, C-contiguous) = src (float32, size % 16 == 0) rounded to
    bfloat16."""
    threads = _serial_begin(serial)
    n = src.size // 16
    for i in prange(n):
        vstore_bf16(dst, 16 * i, vload(src, 16 * i))
    _serial_end(serial, threads)


@njit(parallel=True, **JIT)
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


# ================================================================== registering


class TypeKernels(NamedTuple):
    """One weight type's kernels (see the module's docstring for each), registered against its
    class as its "cpu" kernels. F32's are none: `matmul` hands its floats to the GEMM in place."""
    matvec: object = None
    rows: object = None
    matvec_id: object = None
    matmat: object = None


F32.register_kernels("cpu", TypeKernels())
