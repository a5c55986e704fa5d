"""8-bit decode kernels for `llamatui.inference.cpu.matmul`: weights times activations quantized to
8 bits, as ggml's CPU backend multiplies (`ggml_vec_dot_<type>_q8_0`, `..._q8_K`). This is the one
full account of the 8-bit paths; matmul.py, `int8_decode` and matmul_packed.py refer to it.

Why: a decode step is one pass over every weight, and the float32 kernels (`matmul_kernels`)
spend ~3 vector operations per 16 weights turning bytes into floats and multiplying them in. Here
the activations are quantized once per product (`quantize_activations`, ggml's
`quantize_row_q8_0` / `quantize_row_q8_K`: int8 values, one scale per block) and a weight block's
unpacked bytes are multiplied into them 64 at a time by `vdpbusd` (AVX512-VNNI's vpdpbusd where
the CPU has it), with integer sums per (sub-)block and one float multiply-add per scale. Used
where the CPU has AVX512-VNNI or AVX-VNNI (`matmul.USE_INT8`; LLAMATUI_INT8=0 turns them off).

Activations (per token, k values): `xq` their int8 bytes, `xd` one float scale per QB values
(QB = Q8_0's block for the 32-value formats, Q8_K's for the K-quants), `xsum` the integer sum of
every 16 of them (Q8_K's bsums) and `xs32` = scale * sum of every 32 (Q8_1's s). vpdpbusd takes
unsigned weights: a format's offset (Q4_0's -8, Q6_K's -32, Q8_0's -128 after flipping its sign
bit) and its mins (Q4_1, Q4_K) are applied through those sums, once per block.

Per format, `_dot8_<type>(w, bo, xq, xo, xd, do, xsum, so, a0, a1, ms)` adds one step of a weight
row (two blocks for the 32-value formats: 64 values per vpdpbusd) times its activations into two
float32 accumulators and a scalar; `_matvec8` / `_matvec_id8` make the decode kernels of them
(same signatures as `matmul_kernels`' matvec / matvec_id), registered against the format's class
as its "cpu_int8" kernels. Rows must be a multiple of UNIT values.

Precision: results differ from the float32 kernels by the activations' 8-bit rounding (about
2e-3 of sum |x * w| at most), as llama.cpp's do; they equal the product of the dequantized
weights and the dequantized activations up to float32 rounding (tests/test_matmul_int8.py checks
both). That rounding is discontinuous: a token computed by these kernels in one run and inside a
float32 batch in another (its prompt cached or not, other requests sharing the step or not) ends
up with different logits, not just float32 rounding apart, and a seed would no longer give the
same text. Hence `matmul.int8_decode`: the scheduler lets one-token products use these kernels
only with one slot, where every sampled token gets a step of its own; with several slots, whose
steps mix requests, products stay float32. The packed kernels (`matmul_packed`) compute every
token alike in any batch, so they are always on.

Cache note: like the float32 kernels, touch this file after editing `simd`, `matmul_kernels` or
`matmul_kquants`.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit, prange

from ..quants import kernels_of
from ..quants.kquants import Q4_K, Q5_K, Q6_K, Q8_K
from ..quants.legacy import Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
from .matmul_kernels import _serial_begin, _serial_end
from .matmul_kquants import _k4_scales
from .simd import (ld, ld_f16, vadd, vbcast, vbits2, vbyte_pairs, vbytes, vbytes2, vcvt, vdpbusd,
                   vfma, vi8, vi8x4, viadd, viand, vibcast, vimul, vior, vipair8, vishl, vishr,
                   vishrv, visub, vixor, vizero, vloadi, vnibbles2, vpair8, vsum, vzero)

_JIT = dict(cache=True, fastmath=True, nogil=True)
_EXACT = dict(cache=True, fastmath=False, nogil=True)  # activations rounded as ggml rounds them

# Rows of the registered formats whose length is a multiple of UNIT values take these kernels:
# the 32-value formats go two blocks at a time, 64 bytes to a vpdpbusd.
UNIT = 64
# Catalog geometry through the types' classes, as module-level ints (compile-time constants of
# the kernels below): the values and bytes each kernel steps by (a pair of 32-value blocks, or
# one K-quant block), one block's bytes where a dot reads the second block of its pair, and the
# activations' blocks (Q8_0's for the 32-value formats, Q8_K's for the K-quants).
Q4_0_VALUES, Q4_0_BYTES = Q4_0.span(UNIT)
Q4_1_VALUES, Q4_1_BYTES = Q4_1.span(UNIT)
Q5_0_VALUES, Q5_0_BYTES = Q5_0.span(UNIT)
Q5_1_VALUES, Q5_1_BYTES = Q5_1.span(UNIT)
Q8_0_VALUES, Q8_0_BYTES = Q8_0.span(UNIT)
Q4_K_VALUES, Q4_K_BYTES = Q4_K.span(UNIT)
Q5_K_VALUES, Q5_K_BYTES = Q5_K.span(UNIT)
Q6_K_VALUES, Q6_K_BYTES = Q6_K.span(UNIT)
Q4_0_BLOCK, Q4_1_BLOCK, Q5_0_BLOCK, Q5_1_BLOCK, Q8_0_BLOCK = (
    q.type_size for q in (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0))
Q8_0_QB, Q8_K_QB = Q8_0.block_size, Q8_K.block_size


# ================================================================== activations

@njit(inline="always")
def _quantize_block(x, o, n, inv, xq):
    """xq[o:o+n] = round(x[o:o+n] * inv) as int8 bytes (nearest, ties to even, like ggml's
    _mm256_round_ps and nearest_int); returns nothing"""
    for i in range(o, o + n):
        xq[i] = np.uint8(np.int32(np.rint(x[i] * inv)) & 255)


@njit(inline="always")
def _quantize(x, QB, xq, xd, xsum, xs32):
    """Quantize every row of x (n, k) to 8 bits in blocks of QB values (see the module doc)."""
    n, k = x.shape
    xf = x.reshape(-1)
    for b in range(n * k // QB):
        o = b * QB
        amax = np.float32(0)
        for i in range(o, o + QB):
            amax = max(amax, abs(xf[i]))
        d = amax / np.float32(127)
        inv = np.float32(1) / d if d > 0 else np.float32(0)
        _quantize_block(xf, o, QB, inv, xq)
        xd[b] = d
        for g in range(o // 16, (o + QB) // 16):
            s = 0
            for i in range(16 * g, 16 * g + 16):
                s += np.int32(np.int8(xq[i]))
            xsum[g] = s
        for g in range(o // 32, (o + QB) // 32):
            xs32[g] = d * np.float32(xsum[2 * g] + xsum[2 * g + 1])


@njit(**_EXACT)
def quantize_activations(x, QB):
    """(xq uint8 (n * k) int8 bytes, xd float32 (n * k / QB), xsum int32 (n * k / 16),
    xs32 float32 (n * k / 32)) for float32 x (n, k), k a multiple of QB"""
    size = x.size
    xq = np.empty(size, np.uint8)
    xd = np.empty(size // QB, np.float32)
    xsum = np.empty(size // 16, np.int32)
    xs32 = np.empty(size // 32, np.float32)
    _quantize(x, QB, xq, xd, xsum, xs32)
    return xq, xd, xsum, xs32


# ================================================================== skeletons

@njit(inline="always")
def _row_dot8(w, bo, xq, xo, xd, xsum, xs32, nb, dot, BS, TS):
    """One weight row (nb units of BS values from byte bo) . one token's quantized activations
    (from value xo)."""
    a0 = vzero()
    a1 = vzero()
    ms = np.float32(0)
    for _ in range(nb):
        a0, a1, ms = dot(w, bo, xq, xo, xd, xsum, xs32, a0, a1, ms)
        bo += TS
        xo += BS
    return vsum(vadd(a0, a1)) + ms


@njit(inline="always")
def _matvec8(w, x, out, serial, dot, BS, TS, QB):
    """out[t, r] = x[t] . W[r], parallel over rows unless `serial` (as matmul_kernels._matvec);
    steps of BS values in TS bytes, activations quantized in blocks of QB"""
    threads = _serial_begin(serial)
    nrows = w.shape[0]
    rb = w.shape[1]
    nt = x.shape[0]
    k = x.shape[1]
    nb = k // BS
    xq, xd, xsum, xs32 = quantize_activations(x, QB)
    for r in prange(nrows):
        for t in range(nt):
            out[t, r] = _row_dot8(w, r * rb, xq, t * k, xd, xsum, xs32, nb, dot, BS, TS)
    _serial_end(serial, threads)


@njit(inline="always")
def _matvec_id8(w, x, experts, x_rows, out, serial, dot, BS, TS, QB):
    """out[i, r] = x[x_rows[i]] . W[experts[i] * n_out + r] (as matmul_kernels._matvec_id)"""
    threads = _serial_begin(serial)
    rb = w.shape[1]
    n_out = out.shape[1]
    k = x.shape[1]
    nb = k // BS
    xq, xd, xsum, xs32 = quantize_activations(x, QB)
    for job in prange(experts.shape[0] * n_out):
        i = job // n_out
        r = job - i * n_out
        out[i, r] = _row_dot8(w, (ld(experts, i) * n_out + r) * rb, xq, ld(x_rows, i) * k, xd,
                              xsum, xs32, nb, dot, BS, TS)
    _serial_end(serial, threads)


# ================================================================== 32-value blocks, two at a time
# Activations in blocks of 32 (xd[xo // 32] scales values xo..xo+31). One vpdpbusd and one FMA per
# 64 values; consecutive pairs alternate accumulators (the dot returns a1, a0 swapped).

@njit(inline="always")
def _legacy(q, w, bo, ts, xq, xo, xd, a0):
    """a0 + the two blocks' unsigned values q (64 bytes) times their activations, each block's
    integer sums scaled by its weight scale (the half at its byte 0) and activation scale"""
    s = vdpbusd(vizero(), q, vbytes(xq, xo))
    scale = vpair8(ld_f16(w, bo) * ld(xd, xo // 32), ld_f16(w, bo + ts) * ld(xd, xo // 32 + 1))
    return vfma(vcvt(s), scale, a0)


@njit(inline="always")
def _offset(w, bo, ts, xs32, xo, c):
    """the two blocks' -c * d * (scaled activation sums): a format's constant offset"""
    return -c * (ld_f16(w, bo) * ld(xs32, xo // 32) + ld_f16(w, bo + ts) * ld(xs32, xo // 32 + 1))


@njit(inline="always")
def _mins(w, bo, ts, xs32, xo):
    """the two blocks' m * (scaled activation sums): Q4_1's and Q5_1's min (the half at byte 2)"""
    return ld_f16(w, bo + 2) * ld(xs32, xo // 32) + ld_f16(w, bo + ts + 2) * ld(xs32, xo // 32 + 1)


@njit(inline="always")
def _dot8_q4_0(w, bo, xq, xo, xd, xsum, xs32, a0, a1, ms):
    ts = Q4_0_BLOCK
    a0 = _legacy(vnibbles2(w, bo + 2, bo + ts + 2), w, bo, ts, xq, xo, xd, a0)
    return a1, a0, ms + _offset(w, bo, ts, xs32, xo, 8)


@njit(inline="always")
def _dot8_q4_1(w, bo, xq, xo, xd, xsum, xs32, a0, a1, ms):
    ts = Q4_1_BLOCK
    a0 = _legacy(vnibbles2(w, bo + 4, bo + ts + 4), w, bo, ts, xq, xo, xd, a0)
    return a1, a0, ms + _mins(w, bo, ts, xs32, xo)


@njit(inline="always")
def _dot8_q5_0(w, bo, xq, xo, xd, xsum, xs32, a0, a1, ms):
    ts = Q5_0_BLOCK
    q = vior(vnibbles2(w, bo + 6, bo + ts + 6), vbits2(w, bo + 2, bo + ts + 2))
    a0 = _legacy(q, w, bo, ts, xq, xo, xd, a0)
    return a1, a0, ms + _offset(w, bo, ts, xs32, xo, 16)


@njit(inline="always")
def _dot8_q5_1(w, bo, xq, xo, xd, xsum, xs32, a0, a1, ms):
    ts = Q5_1_BLOCK
    q = vior(vnibbles2(w, bo + 8, bo + ts + 8), vbits2(w, bo + 4, bo + ts + 4))
    a0 = _legacy(q, w, bo, ts, xq, xo, xd, a0)
    return a1, a0, ms + _mins(w, bo, ts, xs32, xo)


@njit(inline="always")
def _dot8_q8_0(w, bo, xq, xo, xd, xsum, xs32, a0, a1, ms):
    ts = Q8_0_BLOCK
    # XOR 0x80808080: q + 128, unsigned
    q = vixor(vbytes2(w, bo + 2, bo + ts + 2), vibcast(-0x7F7F7F80))
    a0 = _legacy(q, w, bo, ts, xq, xo, xd, a0)
    return a1, a0, ms + _offset(w, bo, ts, xs32, xo, 128)


# ================================================================== 256-value K-quant blocks
# Activations in blocks of 256 (one scale, as Q8_K): a block's integer sums are scaled by its
# integer sub-block scales in int32 lanes and turned into floats once per block.

@njit(inline="always")
def _k4_sum(q, qh, xq, xo, sc, p, hb):
    """integer sums of sub-blocks 4p..4p+3 (values 128p..128p+127) of a Q4_K / Q5_K block:
    `q` holds the 64 bytes 64p.. of its qs; hb(qh, j) gives the fifth bits of sub-blocks j
    (lanes 0-7) and j + 2 (lanes 8-15) to or onto the nibbles (Q5_K), or zeros (Q4_K)"""
    m4 = vibcast(0x0F0F0F0F)
    x = xo + 128 * p
    # low nibbles: sub-blocks 4p (lanes 0-7) and 4p + 2 (lanes 8-15); high ones: 4p + 1, 4p + 3
    lo = vdpbusd(vizero(), vior(viand(q, m4), hb(qh, 4 * p)), vbytes2(xq, x, x + 64))
    hi = vdpbusd(vizero(), vior(viand(vishr(q, 4), m4), hb(qh, 4 * p + 1)), vbytes2(xq, x + 32, x + 96))
    return viadd(vimul(lo, vipair8(_ib(sc, 4 * p), _ib(sc, 4 * p + 2))),
                 vimul(hi, vipair8(_ib(sc, 4 * p + 1), _ib(sc, 4 * p + 3))))


@njit(inline="always")
def _ib(word, j):
    return (word >> (8 * j)) & 255


@njit(inline="always")
def _k4_finish(w, bo, xd, xsum, xo, isum, mn, a0, a1):
    """a block's float result: d * xd * sum - dmin * xd * sum_j min_j * (sum of sub-block j)"""
    dx = ld(xd, xo // 256)
    mins = vimul(vloadi(xsum, xo // 16), vbyte_pairs(mn))  # lanes 2j, 2j + 1: sub-block j's halves
    a0 = vfma(vcvt(isum), vbcast(ld_f16(w, bo) * dx), a0)
    a1 = vfma(vcvt(mins), vbcast(-ld_f16(w, bo + 2) * dx), a1)
    return a0, a1


@njit(inline="always")
def _no_high_bits(qh, j):
    return vizero()


@njit(inline="always")
def _q5k_high_bits(qh, j):
    """bit j of qh[l] is the fifth bit of sub-block j's value l (qh: the 32 bytes twice)"""
    return vishl(viand(vishrv(qh, vipair8(j, j + 2)), vibcast(0x01010101)), 4)


@njit(inline="always")
def _dot8_q4_k(w, bo, xq, xo, xd, xsum, xs32, a0, a1, ms):
    sc, mn = _k4_scales(w, bo + 4)
    qh = vizero()
    isum = viadd(_k4_sum(vbytes(w, bo + 16), qh, xq, xo, sc, 0, _no_high_bits),
                 _k4_sum(vbytes(w, bo + 80), qh, xq, xo, sc, 1, _no_high_bits))
    a0, a1 = _k4_finish(w, bo, xd, xsum, xo, isum, mn, a0, a1)
    return a0, a1, ms


@njit(inline="always")
def _dot8_q5_k(w, bo, xq, xo, xd, xsum, xs32, a0, a1, ms):
    sc, mn = _k4_scales(w, bo + 4)
    qh = vbytes2(w, bo + 16, bo + 16)
    isum = viadd(_k4_sum(vbytes(w, bo + 48), qh, xq, xo, sc, 0, _q5k_high_bits),
                 _k4_sum(vbytes(w, bo + 112), qh, xq, xo, sc, 1, _q5k_high_bits))
    a0, a1 = _k4_finish(w, bo, xd, xsum, xo, isum, mn, a0, a1)
    return a0, a1, ms


@njit(inline="always")
def _dot8_q6_k(w, bo, xq, xo, xd, xsum, xs32, a0, a1, ms):
    m4 = vibcast(0x0F0F0F0F)
    m2 = vibcast(0x03030303)
    isum = vizero()
    for n in range(2):  # 128-value halves: ql[64n..], qh[32n..], scales[8n..]
        ql = vbytes(w, bo + 64 * n)
        qh = vbytes2(w, bo + 128 + 32 * n, bo + 128 + 32 * n)
        for h in range(2):  # values 128n + 64h..: ql's low (h = 0) or high nibbles
            high = vishl(viand(vishrv(qh, vipair8(4 * h, 4 * h + 2)), m2), 4)
            q = vior(viand(vishr(ql, 4 * h), m4), high)
            s = vdpbusd(vizero(), q, vbytes(xq, xo + 128 * n + 64 * h))
            isum = viadd(isum, vimul(s, vi8x4(w, bo + 192 + 8 * n + 4 * h)))
    # values are q - 32: minus 32 * scale * (sum of the 16 activations it scales)
    isum = visub(isum, vishl(vimul(vi8(w, bo + 192), vloadi(xsum, xo // 16)), 5))
    return vfma(vcvt(isum), vbcast(ld_f16(w, bo + 208) * ld(xd, xo // 256)), a0), a1, ms


# ================================================================== kernels
# A pair per format, written out (see matmul_kernels on why not a factory), registered against
# the format's class as its "cpu_int8" kernels.

class Int8Kernels(NamedTuple):
    matvec: object  # (w, x, out, serial), as matmul_kernels' matvec
    matvec_id: object  # (w, x, experts, x_rows, out, serial), as matmul_kernels' matvec_id


@njit(parallel=True, **_JIT)
def matvec8_q4_0(w, x, out, serial):
    _matvec8(w, x, out, serial, _dot8_q4_0, Q4_0_VALUES, Q4_0_BYTES, Q8_0_QB)


@njit(parallel=True, **_JIT)
def matvec_id8_q4_0(w, x, experts, x_rows, out, serial):
    _matvec_id8(w, x, experts, x_rows, out, serial, _dot8_q4_0, Q4_0_VALUES, Q4_0_BYTES,
                Q8_0_QB)


Q4_0.register_kernels("cpu_int8", Int8Kernels(matvec8_q4_0, matvec_id8_q4_0))


@njit(parallel=True, **_JIT)
def matvec8_q4_1(w, x, out, serial):
    _matvec8(w, x, out, serial, _dot8_q4_1, Q4_1_VALUES, Q4_1_BYTES, Q8_0_QB)


@njit(parallel=True, **_JIT)
def matvec_id8_q4_1(w, x, experts, x_rows, out, serial):
    _matvec_id8(w, x, experts, x_rows, out, serial, _dot8_q4_1, Q4_1_VALUES, Q4_1_BYTES,
                Q8_0_QB)


Q4_1.register_kernels("cpu_int8", Int8Kernels(matvec8_q4_1, matvec_id8_q4_1))


@njit(parallel=True, **_JIT)
def matvec8_q5_0(w, x, out, serial):
    _matvec8(w, x, out, serial, _dot8_q5_0, Q5_0_VALUES, Q5_0_BYTES, Q8_0_QB)


@njit(parallel=True, **_JIT)
def matvec_id8_q5_0(w, x, experts, x_rows, out, serial):
    _matvec_id8(w, x, experts, x_rows, out, serial, _dot8_q5_0, Q5_0_VALUES, Q5_0_BYTES,
                Q8_0_QB)


Q5_0.register_kernels("cpu_int8", Int8Kernels(matvec8_q5_0, matvec_id8_q5_0))


@njit(parallel=True, **_JIT)
def matvec8_q5_1(w, x, out, serial):
    _matvec8(w, x, out, serial, _dot8_q5_1, Q5_1_VALUES, Q5_1_BYTES, Q8_0_QB)


@njit(parallel=True, **_JIT)
def matvec_id8_q5_1(w, x, experts, x_rows, out, serial):
    _matvec_id8(w, x, experts, x_rows, out, serial, _dot8_q5_1, Q5_1_VALUES, Q5_1_BYTES,
                Q8_0_QB)


Q5_1.register_kernels("cpu_int8", Int8Kernels(matvec8_q5_1, matvec_id8_q5_1))


@njit(parallel=True, **_JIT)
def matvec8_q8_0(w, x, out, serial):
    _matvec8(w, x, out, serial, _dot8_q8_0, Q8_0_VALUES, Q8_0_BYTES, Q8_0_QB)


@njit(parallel=True, **_JIT)
def matvec_id8_q8_0(w, x, experts, x_rows, out, serial):
    _matvec_id8(w, x, experts, x_rows, out, serial, _dot8_q8_0, Q8_0_VALUES, Q8_0_BYTES,
                Q8_0_QB)


Q8_0.register_kernels("cpu_int8", Int8Kernels(matvec8_q8_0, matvec_id8_q8_0))


@njit(parallel=True, **_JIT)
def matvec8_q4_k(w, x, out, serial):
    _matvec8(w, x, out, serial, _dot8_q4_k, Q4_K_VALUES, Q4_K_BYTES, Q8_K_QB)


@njit(parallel=True, **_JIT)
def matvec_id8_q4_k(w, x, experts, x_rows, out, serial):
    _matvec_id8(w, x, experts, x_rows, out, serial, _dot8_q4_k, Q4_K_VALUES, Q4_K_BYTES,
                Q8_K_QB)


Q4_K.register_kernels("cpu_int8", Int8Kernels(matvec8_q4_k, matvec_id8_q4_k))


@njit(parallel=True, **_JIT)
def matvec8_q5_k(w, x, out, serial):
    _matvec8(w, x, out, serial, _dot8_q5_k, Q5_K_VALUES, Q5_K_BYTES, Q8_K_QB)


@njit(parallel=True, **_JIT)
def matvec_id8_q5_k(w, x, experts, x_rows, out, serial):
    _matvec_id8(w, x, experts, x_rows, out, serial, _dot8_q5_k, Q5_K_VALUES, Q5_K_BYTES,
                Q8_K_QB)


Q5_K.register_kernels("cpu_int8", Int8Kernels(matvec8_q5_k, matvec_id8_q5_k))


@njit(parallel=True, **_JIT)
def matvec8_q6_k(w, x, out, serial):
    _matvec8(w, x, out, serial, _dot8_q6_k, Q6_K_VALUES, Q6_K_BYTES, Q8_K_QB)


@njit(parallel=True, **_JIT)
def matvec_id8_q6_k(w, x, experts, x_rows, out, serial):
    _matvec_id8(w, x, experts, x_rows, out, serial, _dot8_q6_k, Q6_K_VALUES, Q6_K_BYTES,
                Q8_K_QB)


Q6_K.register_kernels("cpu_int8", Int8Kernels(matvec8_q6_k, matvec_id8_q6_k))

KERNELS = kernels_of("cpu_int8")
