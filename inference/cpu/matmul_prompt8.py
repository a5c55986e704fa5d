"""8-bit prompt kernels for the formats that have no packed layout (`matmul_packed`): each group
of 16 weight rows is unpacked, once per product, into the packed Q8_0 layout (16 rows
interleaved, one per vector lane, values flipped to unsigned) with one float scale per 32
values, and multiplied into the 8-bit activations of every token of the prompt by the packed
kernels' 8-token integer tiles (`matmul_packed._sums8_q8`: vpdpbusd).

Why: a prompt on such a format dequantized tiles to float32, rounded them to bfloat16 and ran the
bf16 GEMM, about a third of the packed kernels' speed (Llama 3.2 1B IQ2_XXS: 0.42x llama.cpp's
prompt speed). These formats' values are small integers (grid points with their signs, levels,
5-bit values) times a scale per 32 values, so the unpacked bytes are exact; a group's 16 rows (a
few hundred KiB at most) stay in the core's L2 cache while every tile of 8 tokens reads them. The
weights keep their file layout and size: nothing is stored beside the model (a packed copy at 8
bits a value would be four times an IQ2 file). Each format's `_unpack_*` gathers the same field of
the 16 rows into the lanes of a vector (`simd.vgather_rows`), so the layout comes out directly.

Arithmetic, as ggml's vec_dot_<type>_q8_K computes it: activations quantized as Q8_K (one scale
per 256 values, `matmul_int8.quantize_activations`), each 32-value sub-block's integer sums (less
128 times the activations' integer sum: the unsigned flip) times its scale in float32 (exact: the
product of a half and a small integer), a min (Q5_K) times the activations' integer sum, the
block's sum times the activations' scale. Only for products of more than BATCH_DECODE_MAX_TOKENS
tokens (a prompt): the unpacking costs about as much as one token's product. Used where the CPU
has an 8-bit dot product (matmul.USE_INT8).

Registered per format as its "cpu_prompt8" kernel: `unpack(w, r0, q, scale, mins)` writes rows
r0..r0+15 of w into q (uint32 words: word 16 * (8 * s + p) + i = values 32 * s + 4 * p.. of
row i, XOR 0x80 each), scale and mins (float32, 16 * s + i; mins only for a format that has
them).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..quants import kernels_of
from ..quants.base import IQ4_LEVELS
from ..quants.grids import IQ2XXS_GRID
from ..quants.iquants import IQ4_XS
from ..quants.iq2 import IQ2_XXS
from ..quants.kquants import Q5_K, Q8_K
from .matmul_int8 import quantize_activations
from .matmul_kernels import _serial_begin, _serial_end
from .matmul_packed import GROUP, _sums8_q8
from .simd import (ld, vadd, vbcast, vbyte_masks, vcvt, vfma, vgather_rows, vhalf_lo, viadd,
                   viand, vibcast, vimul, vior, vishl, vishr, visub, vixor, vload, vloadi, vlut_u32,
                   vmul, vshuffle_bytes, vstore, vstorei, vzero)

QK_K = Q8_K.block_size  # the activations' blocks
SUB = 32  # values per scale in the unpacked layout
_JIT = dict(cache=True, fastmath=False, nogil=True)


IQ2XXS_GRID32 = IQ2XXS_GRID.view(np.uint32)  # grid point i: words 2i (values 0-3), 2i + 1
# IQ4's 16 levels as bytes XOR 0x80 (unsigned), a 16-byte table in each 128 bits of a vector
IQ4_LEVELS_FLIPPED = np.tile((IQ4_LEVELS.astype(np.int8).view(np.uint8) ^ 0x80), 4).view(np.int32)
IQ4_LEVELS_FLIPPED.flags.writeable = False


# ================================================================== unpacking, per format

@njit(inline="always")
def _even_sign_masks(s):
    """the byte masks (0xFF: negative) of values 0-3 and 4-7 of a group whose seven stored sign
    bits are s (per lane): ggml's ksigns_iq2xs, the eighth bit making the count even"""
    p = vixor(s, vishr(s, 4))
    p = vixor(p, vishr(p, 2))
    p = vixor(p, vishr(p, 1))
    k = vimul(vior(s, vishl(viand(p, vibcast(1)), 7)), vibcast(0x01010101))  # in every byte
    return (vbyte_masks(viand(k, vibcast(0x08040201))),
            vbyte_masks(viand(k, vibcast(-0x7FBFDFF0))))  # 0x80402010


@njit(inline="always")
def _flip_signed(g, m):
    """grid bytes g (unsigned, < 128) negated where m's byte is 0xFF, then XOR 0x80: the values
    as the packed Q8_0 layout holds them (q + 128); (g ^ 0xFF) + 1 never carries out of a byte
    for g in 1..127"""
    return vixor(viadd(vixor(g, m), viand(m, vibcast(0x01010101))), vibcast(-0x7F7F7F80))


@njit(inline="always")
def _unpack_iq2_xxs(w, r0, q, scale, mins):
    """rows r0..r0+15 of IQ2_XXS blocks (d, then per 32-value sub-block 4 grid indices and a
    word of 4 seven-bit sign indices and the 4-bit scale) in the unpacked layout, the 16 rows
    gathered into the lanes of each vector"""
    rb = w.shape[1]
    base = r0 * rb
    for b in range(rb // 66):
        bo = base + 66 * b
        d = vhalf_lo(vgather_rows(w, bo, rb))
        for j in range(8):
            s = 8 * b + j
            gi = vgather_rows(w, bo + 2 + 8 * j, rb)
            aux = vgather_rows(w, bo + 6 + 8 * j, rb)
            ls = vadd(vbcast(np.float32(0.5)), vcvt(vishr(aux, 28)))
            vstore(scale, GROUP * s, vmul(vmul(d, ls), vbcast(np.float32(0.25))))
            for l in range(4):
                at = 2 * GROUP * (4 * s + l)
                i2 = vishl(viand(vishr(gi, 8 * l), vibcast(255)), 1)
                mlo, mhi = _even_sign_masks(viand(vishr(aux, 7 * l), vibcast(127)))
                vstorei(q, at, _flip_signed(vlut_u32(IQ2XXS_GRID32, i2), mlo))
                vstorei(q, at + GROUP, _flip_signed(vlut_u32(IQ2XXS_GRID32, viadd(i2, vibcast(1))),
                                                    mhi))


@njit(inline="always")
def _byte(v, i):
    """byte i of each lane"""
    return viand(vishr(v, 8 * i), vibcast(255))


@njit(inline="always")
def _unpack_q5_k(w, r0, q, scale, mins):
    """rows r0..r0+15 of Q5_K blocks (d, dmin, 12 bytes of 6-bit scales and mins as
    get_scale_min_k4 reads them, 32 bytes of fifth bits, 128 of nibbles): sub-block s's
    values, scale d * sc and min dmin * m"""
    rb = w.shape[1]
    m4 = vibcast(0x0F0F0F0F)
    m1 = vibcast(0x01010101)
    for b in range(rb // 176):
        bo = r0 * rb + 176 * b
        dd = vgather_rows(w, bo, rb)
        d = vhalf_lo(dd)
        dmin = vhalf_lo(vishr(dd, 16))
        s0 = vgather_rows(w, bo + 4, rb)
        s1 = vgather_rows(w, bo + 8, rb)
        s2 = vgather_rows(w, bo + 12, rb)
        for j in range(8):
            if j < 4:
                sc = viand(_byte(s0, j), vibcast(63))
                m = viand(_byte(s1, j), vibcast(63))
            else:
                sc = vior(viand(_byte(s2, j - 4), vibcast(15)), vishl(vishr(_byte(s0, j - 4), 6), 4))
                m = vior(vishr(_byte(s2, j - 4), 4), vishl(vishr(_byte(s1, j - 4), 6), 4))
            vstore(scale, GROUP * (8 * b + j), vmul(d, vcvt(sc)))
            vstore(mins, GROUP * (8 * b + j), vmul(dmin, vcvt(m)))
        for p in range(8):
            h = vgather_rows(w, bo + 16 + 4 * p, rb)
            for pair in range(4):
                ql = vgather_rows(w, bo + 48 + 32 * pair + 4 * p, rb)
                for half in range(2):
                    sb = 2 * pair + half
                    v = vior(viand(vishr(ql, 4 * half), m4), vishl(viand(vishr(h, sb), m1), 4))
                    vstorei(q, GROUP * (8 * (8 * b + sb) + p), vixor(v, vibcast(-0x7F7F7F80)))


@njit(inline="always")
def _unpack_iq4_xs(w, r0, q, scale, mins):
    """rows r0..r0+15 of IQ4_XS blocks (d, scales_h, scales_l[4], then per 32-value sub-block 16
    bytes: value m in the low nibble of byte m, 16 + m in its high one): each nibble's level
    (kvalues_iq4nl, flipped to unsigned) by a byte shuffle, the scale d * (ls - 32)"""
    rb = w.shape[1]
    m4 = vibcast(0x0F0F0F0F)
    levels = vloadi(IQ4_LEVELS_FLIPPED, 0)
    for b in range(rb // 136):
        bo = r0 * rb + 136 * b
        hd = vgather_rows(w, bo, rb)
        d = vhalf_lo(hd)
        sl = vgather_rows(w, bo + 4, rb)
        for ib in range(8):
            s = 8 * b + ib
            low = viand(vishr(_byte(sl, ib // 2), 4 * (ib % 2)), vibcast(15))
            high = viand(vishr(hd, 16 + 2 * ib), vibcast(3))
            ls = visub(vior(low, vishl(high, 4)), vibcast(32))
            vstore(scale, GROUP * s, vmul(d, vcvt(ls)))
            for p in range(4):
                z = vgather_rows(w, bo + 8 + 16 * ib + 4 * p, rb)
                vstorei(q, GROUP * (8 * s + p), vshuffle_bytes(levels, viand(z, m4)))
                vstorei(q, GROUP * (8 * s + p + 4), vshuffle_bytes(levels, viand(vishr(z, 4), m4)))


# ================================================================== the product

@njit(inline="always")
def _block8(qb, scale, mins, s0, xq, xo, k, x128, xneg, has_mins, a0, a1, a2, a3, a4, a5, a6,
            a7):
    """a_t + the 8 sub-blocks of Q8_K block s0 / 8 (unpacked at qb) times token t's activations
    (from value xo + t * k), each sub-block's integer sums less 128 times the activations' sum
    (x128), times its scales; with has_mins, less its mins times the activations' integer sum
    (xneg: negated)"""
    gk = k // SUB
    for j in range(8):
        s = s0 + j
        x = xo + SUB * j
        g = x // SUB
        t0, t1, t2, t3, t4, t5, t6, t7 = _sums8_q8(qb, 4 * GROUP * 8 * s, xq, x, k, x128, x128)
        sc = vload(scale, GROUP * s)
        a0 = vfma(vcvt(visub(t0, vibcast(x128[g]))), sc, a0)
        a1 = vfma(vcvt(visub(t1, vibcast(x128[g + gk]))), sc, a1)
        a2 = vfma(vcvt(visub(t2, vibcast(x128[g + 2 * gk]))), sc, a2)
        a3 = vfma(vcvt(visub(t3, vibcast(x128[g + 3 * gk]))), sc, a3)
        a4 = vfma(vcvt(visub(t4, vibcast(x128[g + 4 * gk]))), sc, a4)
        a5 = vfma(vcvt(visub(t5, vibcast(x128[g + 5 * gk]))), sc, a5)
        a6 = vfma(vcvt(visub(t6, vibcast(x128[g + 6 * gk]))), sc, a6)
        a7 = vfma(vcvt(visub(t7, vibcast(x128[g + 7 * gk]))), sc, a7)
        if has_mins:
            m = vload(mins, GROUP * s)
            a0 = vfma(m, vbcast(xneg[g]), a0)
            a1 = vfma(m, vbcast(xneg[g + gk]), a1)
            a2 = vfma(m, vbcast(xneg[g + 2 * gk]), a2)
            a3 = vfma(m, vbcast(xneg[g + 3 * gk]), a3)
            a4 = vfma(m, vbcast(xneg[g + 4 * gk]), a4)
            a5 = vfma(m, vbcast(xneg[g + 5 * gk]), a5)
            a6 = vfma(m, vbcast(xneg[g + 6 * gk]), a6)
            a7 = vfma(m, vbcast(xneg[g + 7 * gk]), a7)
    return a0, a1, a2, a3, a4, a5, a6, a7


@njit(inline="always")
def _tile8(qb, scale, mins, xq, xd, x128, xneg, has_mins, t, k, out, r0, n_out):
    """out[t..t+7, r0..r0+15] from the unpacked group"""
    c0 = vzero(); c1 = vzero(); c2 = vzero(); c3 = vzero()  # noqa: E702
    c4 = vzero(); c5 = vzero(); c6 = vzero(); c7 = vzero()  # noqa: E702
    kb = k // QK_K
    for b in range(kb):
        z = vzero()
        a0, a1, a2, a3, a4, a5, a6, a7 = _block8(qb, scale, mins, 8 * b, xq, t * k + QK_K * b, k,
                                                 x128, xneg, has_mins, z, z, z, z, z, z, z, z)
        xb = t * kb + b
        c0 = vfma(a0, vbcast(ld(xd, xb)), c0)
        c1 = vfma(a1, vbcast(ld(xd, xb + kb)), c1)
        c2 = vfma(a2, vbcast(ld(xd, xb + 2 * kb)), c2)
        c3 = vfma(a3, vbcast(ld(xd, xb + 3 * kb)), c3)
        c4 = vfma(a4, vbcast(ld(xd, xb + 4 * kb)), c4)
        c5 = vfma(a5, vbcast(ld(xd, xb + 5 * kb)), c5)
        c6 = vfma(a6, vbcast(ld(xd, xb + 6 * kb)), c6)
        c7 = vfma(a7, vbcast(ld(xd, xb + 7 * kb)), c7)
    vstore(out, t * n_out + r0, c0)
    vstore(out, (t + 1) * n_out + r0, c1)
    vstore(out, (t + 2) * n_out + r0, c2)
    vstore(out, (t + 3) * n_out + r0, c3)
    vstore(out, (t + 4) * n_out + r0, c4)
    vstore(out, (t + 5) * n_out + r0, c5)
    vstore(out, (t + 6) * n_out + r0, c6)
    vstore(out, (t + 7) * n_out + r0, c7)


@njit(inline="always")
def _group(g, w, xq, xd, x128, xneg, n, k, out, unpack, has_mins):
    """rows 16g..16g+15 of out (flat (n, n_out)) for all n tokens: the group unpacked into a
    buffer of its own, then tiles of 8 tokens (n a multiple of 8: the caller pads)"""
    q = np.empty(GROUP * k // 4, np.uint32)
    scale = np.empty(GROUP * (k // SUB), np.float32)
    mins = np.empty(GROUP * (k // SUB) if has_mins else 0, np.float32)
    r0 = GROUP * g
    unpack(w, r0, q, scale, mins)
    qb = q.view(np.uint8)
    n_out = w.shape[0]
    for t in range(0, n, 8):
        _tile8(qb, scale, mins, xq, xd, x128, xneg, has_mins, t, k, out, r0, n_out)


@njit(inline="always")
def _matmul(w, x, out, serial, group):
    """out (flat (n, n_out)) = x (n, k) @ W.T, n a multiple of 8, parallel over groups of 16
    rows unless `serial`"""
    threads = _serial_begin(serial)
    n, k = x.shape
    xq, xd, xsum, _ = quantize_activations(x, QK_K)
    x128 = np.empty(xsum.size // 2, np.int32)  # 128 * each 32 activations' integer sum
    xneg = np.empty(xsum.size // 2, np.float32)  # minus that sum (exact), for the mins
    for i in range(x128.size):
        x128[i] = 128 * (xsum[2 * i] + xsum[2 * i + 1])
        xneg[i] = -np.float32(xsum[2 * i] + xsum[2 * i + 1])
    for g in prange(w.shape[0] // GROUP):
        group(np.int64(g), w, xq, xd, x128, xneg, n, k, out)
    _serial_end(serial, threads)


@njit(**_JIT)
def _group_iq2_xxs(g, w, xq, xd, x128, xneg, n, k, out):
    _group(g, w, xq, xd, x128, xneg, n, k, out, _unpack_iq2_xxs, False)


@njit(parallel=True, **_JIT)
def matmul_iq2_xxs(w, x, out, serial):
    _matmul(w, x, out, serial, _group_iq2_xxs)


@njit(**_JIT)
def _group_q5_k(g, w, xq, xd, x128, xneg, n, k, out):
    _group(g, w, xq, xd, x128, xneg, n, k, out, _unpack_q5_k, True)


@njit(parallel=True, **_JIT)
def matmul_q5_k(w, x, out, serial):
    _matmul(w, x, out, serial, _group_q5_k)


@njit(**_JIT)
def _group_iq4_xs(g, w, xq, xd, x128, xneg, n, k, out):
    _group(g, w, xq, xd, x128, xneg, n, k, out, _unpack_iq4_xs, False)


@njit(parallel=True, **_JIT)
def matmul_iq4_xs(w, x, out, serial):
    _matmul(w, x, out, serial, _group_iq4_xs)


IQ2_XXS.register_kernels("cpu_prompt8", matmul_iq2_xxs)
IQ4_XS.register_kernels("cpu_prompt8", matmul_iq4_xs)
Q5_K.register_kernels("cpu_prompt8", matmul_q5_k)
KERNELS = kernels_of("cpu_prompt8")
