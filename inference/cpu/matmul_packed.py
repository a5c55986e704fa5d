"""Row-interleaved 8-bit kernels: ggml's "repack" idea (ggml-cpu/repack.cpp, block_q4_0x8) for
`llamatui.inference.cpu.matmul`, with one weight row per vector lane.

Why: `matmul_int8` multiplies one row at a time, so every 64 values cost an unpack, an integer dot
(vpdpbusd), a conversion and a scale multiply-add per token, about as many vector operations per
multiply as the float32 batch tiles; a decode step of eight sequences gains nothing from it. Here
the quantized bytes of 16 rows are interleaved once, when the model loads (`pack`): lane i of a
vector holds 4 consecutive values of row i, so one vpdpbusd multiplies 4 values of 16 rows by the
same 4 activation bytes (broadcast), eight of them in a row give a 32-value block's integer sums
of all 16 rows, and the block's scales apply as one conversion and two multiply-adds on 16 lanes
that are the 16 outputs themselves (no horizontal sums). Each block of 16 rows is loaded once per
tile of up to 8 tokens: a product costs about 12 vector operations per 512 multiplies per token,
where the float32 tiles take 32 fused multiply-adds.

Every token is computed on its own, by the same operations in the same order whatever the tile
or the other tokens (integer sums are exact and the float steps are not reassociated): a token's
result does not depend on its company, so the scheduler can batch any requests without changing
what any of them samples (the discontinuity of 8-bit activations that `matmul_int8` explains is
then the same in every batch).

Formats (a multiple of 16 rows): Q4_0, Q4_1, Q5_0, Q8_0 (blocks of 32 values) and Q4_K, Q6_K
(blocks of 256), each registered against its class as its "cpu_packed" kernels (`PackedFormat`:
the fields of a block in packed order, each laid out by `_put`, and its kernel). Per group of 16
rows and block the packed bytes are, field after field, 16-lane vectors: the quantized values
(4 vectors of 64 bytes per 32 values for nibbles, lane i = bytes 4p..4p+3 of row i's qs: low
nibbles values 4p.., high nibbles 16 + 4p.. or the next sub-block's; Q8_0: 8 vectors, sign bit
flipped to unsigned), the fifth (Q5_0) or top two (Q6_K) bits rearranged so that one shift and
mask puts them under their nibbles, the sub-block scales and mins as bytes (K-quants), then the
16 rows' d (halves), dmin or m. The activations are quantized as
`matmul_int8.quantize_activations` does (Q8_0 blocks of 32 with their scaled sums `xs32`; for the
K-quants Q8_K blocks of 256 with their integer sums of 16, `xsum`, as ggml_vec_dot_q4_K_q8_K and
_q6_K_q8_K use them); the offsets (Q4_0's -8, Q5_0's -16, Q6_K's -32, Q8_0's -128 after the flip)
and the mins go through those sums.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
from numba import njit, prange, types

from ..quants import get_quant_type, kernels_of
from ..quants.kquants import Q4_K, Q6_K, Q8_K
from ..quants.legacy import Q4_0, Q4_1, Q5_0, Q8_0
from .matmul_int8 import quantize_activations
from .matmul_kernels import _serial_begin, _serial_end
from .simd import (ld, ld_u32, prefetch, vbcast, vbytes, vcvt, vdpbusd, vf16, vfma,
                   vi8, viadd, viand, vibcast, vimul, vior, vishl, vishr, visub, vizero, vmul, vstore,
                   vu8, vzero)

GROUP = 16  # rows interleaved, one per lane
QK = Q8_0.block_size  # values per block: the activations' (Q8_0) and the 32-value formats'
QK_K = Q8_K.block_size  # the K-quants' blocks and their activations' (Q8_K)
# bytes of a matrix's rows packed at a time: small, so that the fields' temporaries are too
# (with 16 MiB, their freed space stayed resident in the heap: +27 MiB on SmolLM2)
PACK_CHUNK = 2 << 20
# how far ahead of the block in use the weights are asked for, into every cache level: faster
# than no hint from memory, and a model that fits the last-level cache stays there between
# steps, which the non-temporal hint prevented on Intel server parts (prefetchnta's lines skip L2
# and L3 on eviction: each step read the whole model from memory again; docs/performance.md)
STREAM_AHEAD = 4096
_JIT = dict(cache=True, fastmath=False, nogil=True)  # IEEE order: a token's result is fixed


class PackedWeight(NamedTuple):
    """A matrix's rows interleaved by `pack`: data uint8 (n_out / 16, blocks per row, group block
    bytes); parts: int64 bounds of the rows of the matrices it holds, [0, n_out] for one, more
    for several fused (`fuse`): a product gives each its own C-contiguous result."""
    type_name: str
    data: np.ndarray
    n_out: int
    n_in: int
    parts: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.data.nbytes


# ================================================================== packing (at load)

def _read_only(a: np.ndarray) -> np.ndarray:
    """a read-only view (as the file's rows are): one compiled signature for the field kernels"""
    view = a.view()
    view.flags.writeable = False
    return view


@njit(inline="always")
def _lanes_of_block(dst, src, g, b, n_units, width, xor):
    for i in range(GROUP):
        row = g * GROUP + i
        for u in range(n_units):
            at = (u * GROUP + i) * width
            for k in range(width):
                dst[g, b, at + k] = src[row, b, u * width + k] ^ xor


# one signature, compiled (or loaded from the cache) at import: lazily, a field computed into
# its own C-contiguous array and one that is a slice of the file's rows would compile twice
@njit(types.void(types.uint8[:, :, :], types.Array(types.uint8, 3, "A", readonly=True),
                 types.int64, types.int64), parallel=True, cache=True, nogil=True)
def _put_lanes(dst, src, width, xor):
    """dst (groups, nb, bytes * 16) <- a field of every row (src (n_out, nb, bytes)) XOR `xor`,
    as bytes / width vectors of 16 lanes: lane i of vector u = bytes u * width.. of row i's
    field. Compiled, with the usual widths as constants (unrolled): numpy's transposing copy
    moved 0.05-0.4 GB/s, half a minute of packing for an 8B model."""
    n_units = src.shape[2] // width
    x = np.uint8(xor)
    for g in prange(dst.shape[0]):
        for b in range(dst.shape[1]):
            if width == 4:
                _lanes_of_block(dst, src, g, b, n_units, 4, x)
            elif width == 2:
                _lanes_of_block(dst, src, g, b, n_units, 2, x)
            else:
                _lanes_of_block(dst, src, g, b, n_units, width, x)


def _put(dst, src, width, xor=0):
    """`_put_lanes` on a field as its function gave it (a uint8 view or array): read-only, as
    the file's rows are, for one compiled signature"""
    _put_lanes(dst, _read_only(np.asarray(src, np.uint8)), width, xor)


def _bytes(at: int, size: int, width: int, xor: int = 0):
    """a field that is bytes at..at+size of each block (XORed with `xor`), in lanes of `width`"""
    def field(blocks):
        return blocks[:, :, at:at + size], width, xor
    return field


def _q5_0_high_bits(blocks):
    """Q5_0's fifth bits (qh, bit j: value j) rearranged per row so that one shift and mask
    puts them under the nibbles of packed word p: bit 8b + 4 + p is value 4p + b's (the low
    nibble of byte 4p + b), bit 8b + p value 16 + 4p + b's (its high nibble)"""
    qh = np.ascontiguousarray(blocks[:, :, 2:6]).view("<u4")[..., 0]
    out = np.zeros(qh.shape, np.uint32)
    for p in range(4):
        for b in range(4):
            out |= ((qh >> np.uint32(4 * p + b)) & np.uint32(1)) << np.uint32(8 * b + 4 + p)
            out |= ((qh >> np.uint32(16 + 4 * p + b)) & np.uint32(1)) << np.uint32(8 * b + p)
    return out.astype("<u4").view(np.uint8).reshape(*qh.shape, 4), 4


@njit(parallel=True, cache=True, nogil=True)
def _k4_scales_mins(blocks):
    """Q4_K's 6-bit sub-block scales and mins (ggml's get_scale_min_k4) as bytes: (scales,
    mins), each (n_out, nb, 8); compiled, as numpy's loops over 4 bytes took seconds per GB"""
    n, nb = blocks.shape[0], blocks.shape[1]
    sc = np.empty((n, nb, 8), np.uint8)
    mn = np.empty((n, nb, 8), np.uint8)
    for r in prange(n):
        for b in range(nb):
            for j in range(4):
                s, m, hi = blocks[r, b, 4 + j], blocks[r, b, 8 + j], blocks[r, b, 12 + j]
                sc[r, b, j] = s & 63
                mn[r, b, j] = m & 63
                sc[r, b, 4 + j] = (hi & 0xF) | ((s >> 6) << 4)
                mn[r, b, 4 + j] = (hi >> 4) | ((m >> 6) << 4)
    return sc, mn


def _q4_k_fields(blocks):
    sc, mn = _k4_scales_mins(_read_only(blocks))
    return [(blocks[:, :, 16:144], 4), (sc, 1), (mn, 1), (blocks[:, :, 0:2], 2),
            (blocks[:, :, 2:4], 2)]


@njit(parallel=True, cache=True, nogil=True)
def _q6_k_split(blocks):
    """(nibbles (n, nb, 128), top bits (n, nb, 64)) of Q6_K blocks as `_q6_k_fields` describes,
    from the 256 six-bit values of each block in dequantize_row_q6_K's order (ql's nibbles,
    qh's 2-bit pairs); compiled, as numpy took seconds per 100 MiB"""
    n, nb = blocks.shape[0], blocks.shape[1]
    nibbles = np.empty((n, nb, 128), np.uint8)
    high = np.zeros((n, nb, 64), np.uint8)
    for r in prange(n):
        v = np.empty(256, np.uint8)
        for b in range(nb):
            for h in range(2):
                for l in range(32):
                    lo, hi, bits = blocks[r, b, 64 * h + l], blocks[r, b, 64 * h + 32 + l], \
                        blocks[r, b, 128 + 32 * h + l]
                    v[128 * h + l] = (lo & 15) | ((bits & 3) << 4)
                    v[128 * h + 32 + l] = (hi & 15) | (((bits >> 2) & 3) << 4)
                    v[128 * h + 64 + l] = (lo >> 4) | (((bits >> 4) & 3) << 4)
                    v[128 * h + 96 + l] = (hi >> 4) | (((bits >> 6) & 3) << 4)
            for j in range(4):
                for l in range(32):
                    nibbles[r, b, 32 * j + l] = (v[64 * j + l] & 15) | ((v[64 * j + 32 + l] & 15) << 4)
                for c in range(2):
                    for w in range(4):
                        for i in range(2):
                            for k in range(4):
                                high[r, b, 16 * j + 4 * w + k] |= \
                                    (v[64 * j + 32 * c + 4 * (2 * w + i) + k] >> 4) << (4 * i + 2 * c)
    return nibbles, high


def _q6_k_fields(blocks):
    """Q6_K packed as 4 pairs of 32-value chunks (j: values 64j..): their low nibbles as Q4_K's
    qs (byte 32j + l: chunk 2j's value l low, 2j + 1's high), then their top 2 bits, a word per
    two nibble words (word 4j + w covers nibble words 8j + 2w + i, i = 0, 1: the bits of chunk
    c's value 4(2w + i) + b at 8b + 4i + 2c, so one shift and mask puts them at bits 4-5 under
    their nibble), the 16 int8 scales (already in sub-block order) and d."""
    nibbles, high = _q6_k_split(_read_only(blocks))
    return [(nibbles, 4), (high, 4), (blocks[:, :, 192:208], 1), (blocks[:, :, 208:210], 2)]


class PackedFormat(NamedTuple):
    """How a format is packed and multiplied, registered against its class as its "cpu_packed"
    kernels: the fields of a block, in packed order (each fields(blocks) -> (uint8 (n_out, nb,
    bytes), lane width[, byte XORed in]); see `_put`), and the kernel below."""
    fields: tuple
    kernel: object  # kernel(wp, parts, x, out, serial)

    def arrange(self, blocks) -> list:
        out = []
        for field in self.fields:
            got = field(blocks)
            out.extend(got if isinstance(got, list) else [got])
        return out


def packs(type_name: str, n_out: int, n_in: int) -> bool:
    """Whether `pack` takes a matrix of this format and shape."""
    return type_name in KERNELS and n_out % GROUP == 0 and n_out > 0 \
        and n_in % get_quant_type(type_name).block_size == 0


def pack(type_name: str, weight: np.ndarray, release=None, out=None) -> PackedWeight:
    """The rows of a ggml matrix (uint8 (n_out, row_bytes)) interleaved for the kernels below,
    written straight into the packed array (no temporary copies of the matrix), PACK_CHUNK bytes
    of rows at a time; release(rows) after each chunk is packed lets the caller drop the
    source's pages as it goes (a 262,144-token LM head would otherwise be resident twice).
    out: the packed array to fill (`packed_shape`; `pack_fused` passes its parts)."""
    fmt = KERNELS[type_name]
    shape = packed_shape(type_name, weight.shape)
    n_out, nb = weight.shape[0], shape[1]
    rows = np.asarray(weight).reshape(n_out, nb, -1)
    data = np.empty(shape, np.uint8) if out is None else out
    if data.shape != shape:
        raise ValueError(f"pack: {type_name} {weight.shape} into an array of {data.shape}")
    step = max(1, PACK_CHUNK // (GROUP * weight.shape[1])) * GROUP
    for r0 in range(0, n_out, step):
        r1 = min(n_out, r0 + step)
        fields = fmt.arrange(rows[r0:r1])
        dst, o = data[r0 // GROUP:r1 // GROUP], 0
        for src, *lanes in fields:
            _put(dst[:, :, o:o + GROUP * src.shape[2]], src, *lanes)
            o += GROUP * src.shape[2]
        if release is not None:
            release(weight[r0:r1])
    if out is None:
        data.flags.writeable = False  # one compiled signature, as the file's rows
    else:
        data = _read_only(data)
    return PackedWeight(type_name, data, n_out, nb * get_quant_type(type_name).block_size,
                        _bounds([n_out]))


def packed_shape(type_name: str, weight_shape) -> tuple[int, int, int]:
    """The shape `pack` gives a matrix of rows (n_out, row_bytes) of this format."""
    qtype = get_quant_type(type_name)
    n_out, row_bytes = weight_shape
    nb = row_bytes // qtype.type_size
    if not packs(type_name, n_out, nb * qtype.block_size) or row_bytes % qtype.type_size:
        raise ValueError(f"{type_name} {tuple(weight_shape)} cannot be packed")
    return n_out // GROUP, nb, _group_block_bytes(type_name)


@functools.cache
def _group_block_bytes(type_name: str) -> int:
    """bytes of one packed block of GROUP rows: the sizes of the format's fields, found once"""
    one = np.zeros((GROUP, 1, get_quant_type(type_name).type_size), np.uint8)
    return GROUP * sum(f[0].shape[2] for f in KERNELS[type_name].arrange(one))


def pack_fused(type_name: str, weights, release=None) -> tuple[PackedWeight, list[PackedWeight]]:
    """`fuse` of the matrices packed, each written into its part of the whole: no second copy."""
    shapes = [packed_shape(type_name, w.shape) for w in weights]
    if len({s[1:] for s in shapes}) != 1:
        raise ValueError("pack_fused: matrices of different input sizes")
    data = np.empty((sum(s[0] for s in shapes),) + shapes[0][1:], np.uint8)
    parts, g0 = [], 0
    for w, s in zip(weights, shapes):
        parts.append(pack(type_name, w, release, out=data[g0:g0 + s[0]]))
        g0 += s[0]
    data.flags.writeable = False
    n_outs = [p.n_out for p in parts]
    return PackedWeight(type_name, data, sum(n_outs), parts[0].n_in, _bounds(n_outs)), parts


def _bounds(n_outs) -> np.ndarray:
    bounds = np.zeros(len(n_outs) + 1, np.int64)
    np.cumsum(n_outs, out=bounds[1:])
    bounds.flags.writeable = False
    return bounds


def fuse(parts: list[PackedWeight]) -> tuple[PackedWeight, list[PackedWeight]]:
    """Packed matrices of one format and input size as one (their rows one after the other,
    as a fused QKV matrix is) and each again as a view of it: a product of the whole gives
    every part's result (each row's sums are computed on their own), in one launch and one
    quantization of the activations, for the memory of one copy."""
    first = parts[0]
    if any(p.type_name != first.type_name or p.n_in != first.n_in or len(p.parts) != 2
           for p in parts):
        raise ValueError("fuse: packed matrices of different formats or input sizes")
    data = np.concatenate([p.data for p in parts])
    data.flags.writeable = False
    views, g0 = [], 0
    for p in parts:
        g1 = g0 + p.data.shape[0]
        views.append(PackedWeight(p.type_name, data[g0:g1], p.n_out, p.n_in, p.parts))
        g0 = g1
    n_outs = [p.n_out for p in parts]
    return PackedWeight(first.type_name, data, sum(n_outs), first.n_in, _bounds(n_outs)), views


# ================================================================== one block
# sums(wp, o, xq, xo, xsum, xs32): one packed block of 16 rows (at byte o) times a token's
# quantized activations from value xo (xd, xs32 and xsum indexed by xo: its blocks of QB, 32
# and 16 values); finish(wp, o, sums, xo, xd, xsum, xs32, acc): acc + those sums scaled

@njit(inline="always")
def _sums_q4(wp, o, xq, xo, xsum, xs32):
    """integer sums of a block of 16 Q4 rows times a token's 32 activation bytes"""
    m4 = vibcast(0x0F0F0F0F)
    s = vizero()
    for p in range(4):
        z = vbytes(wp, o + 64 * p)
        s = vdpbusd(s, viand(z, m4), vibcast(ld_u32(xq, xo + 4 * p)))
        s = vdpbusd(s, viand(vishr(z, 4), m4), vibcast(ld_u32(xq, xo + 16 + 4 * p)))
    return s


@njit(inline="always")
def _sums_q5(wp, o, xq, xo, xsum, xs32):
    """as _sums_q4, each nibble given its fifth bit from the rearranged qh at o + 256 (see
    _q5_0_high_bits): values 0..31"""
    m4 = vibcast(0x0F0F0F0F)
    m5 = vibcast(0x10101010)
    h = vbytes(wp, o + 256)
    s = vizero()
    for p in range(4):
        z = vbytes(wp, o + 64 * p)
        lo = vior(viand(z, m4), viand(vishr(h, p), m5))
        hi = vior(viand(vishr(z, 4), m4), viand(vishl(h, 4 - p), m5))
        s = vdpbusd(s, lo, vibcast(ld_u32(xq, xo + 4 * p)))
        s = vdpbusd(s, hi, vibcast(ld_u32(xq, xo + 16 + 4 * p)))
    return s


@njit(inline="always")
def _sums_q8(wp, o, xq, xo, xsum, xs32):
    """integer sums of a block of 16 Q8_0 rows times a token's 32 activation bytes"""
    s = vizero()
    for j in range(8):
        s = vdpbusd(s, vbytes(wp, o + 64 * j), vibcast(ld_u32(xq, xo + 4 * j)))
    return s


@njit(inline="always")
def _scaled(sums, d, xd, bi, acc):
    """acc + a block's integer sums times its 16 rows' scales d and the token's scale xd[bi]"""
    return vfma(vcvt(sums), vmul(d, vbcast(ld(xd, bi))), acc)


# per format: `_finish_*` scales a block's integer sums s (d times the token's xd), then adds
# the offset (-8, -16, -128: times d) or the min (m) through the token's scaled block sum xs32
# (the K-quants: their mins through the sub-block sums xsum); `_sums_*` are one token's sums,
# `_sums8_*` the integer sums of 8 tokens at once (token i's activations at xo + i * k), each
# block's values unpacked once for the 8 (unpacking per token took as many vector operations as
# the dot products, for Q6_K several times as many); the same integer sums either way

@njit(inline="always")
def _finish_q4_0(wp, o, s, xo, xd, xsum, xs32, acc):
    d = vf16(wp, o + 256)
    acc = _scaled(s, d, xd, xo // QK, acc)
    return vfma(d, vbcast(ld(xs32, xo // QK) * np.float32(-8)), acc)


@njit(inline="always")
def _finish_q4_1(wp, o, s, xo, xd, xsum, xs32, acc):
    acc = _scaled(s, vf16(wp, o + 256), xd, xo // QK, acc)
    return vfma(vf16(wp, o + 288), vbcast(ld(xs32, xo // QK)), acc)


@njit(inline="always")
def _finish_q5_0(wp, o, s, xo, xd, xsum, xs32, acc):
    d = vf16(wp, o + 320)
    acc = _scaled(s, d, xd, xo // QK, acc)
    return vfma(d, vbcast(ld(xs32, xo // QK) * np.float32(-16)), acc)


@njit(inline="always")
def _finish_q8_0(wp, o, s, xo, xd, xsum, xs32, acc):
    d = vf16(wp, o + 512)
    acc = _scaled(s, d, xd, xo // QK, acc)
    return vfma(d, vbcast(ld(xs32, xo // QK) * np.float32(-128)), acc)


@njit(inline="always")
def _dot8(a0, a1, a2, a3, a4, a5, a6, a7, z, xq, x, k):
    """each a_i + z's bytes times token i's 4 activation bytes at x + i * k (vpdpbusd), for 8
    tokens"""
    return (vdpbusd(a0, z, vibcast(ld_u32(xq, x))), vdpbusd(a1, z, vibcast(ld_u32(xq, x + k))),
            vdpbusd(a2, z, vibcast(ld_u32(xq, x + 2 * k))),
            vdpbusd(a3, z, vibcast(ld_u32(xq, x + 3 * k))),
            vdpbusd(a4, z, vibcast(ld_u32(xq, x + 4 * k))),
            vdpbusd(a5, z, vibcast(ld_u32(xq, x + 5 * k))),
            vdpbusd(a6, z, vibcast(ld_u32(xq, x + 6 * k))),
            vdpbusd(a7, z, vibcast(ld_u32(xq, x + 7 * k))))


@njit(inline="always")
def _sums8_q4(wp, o, xq, xo, k, xsum, xs32):
    m4 = vibcast(0x0F0F0F0F)
    a0 = vizero(); a1 = vizero(); a2 = vizero(); a3 = vizero()  # noqa: E702
    a4 = vizero(); a5 = vizero(); a6 = vizero(); a7 = vizero()  # noqa: E702
    for p in range(4):
        z = vbytes(wp, o + 64 * p)
        a0, a1, a2, a3, a4, a5, a6, a7 = _dot8(a0, a1, a2, a3, a4, a5, a6, a7, viand(z, m4), xq,
                                               xo + 4 * p, k)
        a0, a1, a2, a3, a4, a5, a6, a7 = _dot8(a0, a1, a2, a3, a4, a5, a6, a7,
                                               viand(vishr(z, 4), m4), xq, xo + 16 + 4 * p, k)
    return a0, a1, a2, a3, a4, a5, a6, a7


@njit(inline="always")
def _sums8_q5(wp, o, xq, xo, k, xsum, xs32):
    m4 = vibcast(0x0F0F0F0F)
    m5 = vibcast(0x10101010)
    h = vbytes(wp, o + 256)
    a0 = vizero(); a1 = vizero(); a2 = vizero(); a3 = vizero()  # noqa: E702
    a4 = vizero(); a5 = vizero(); a6 = vizero(); a7 = vizero()  # noqa: E702
    for p in range(4):
        z = vbytes(wp, o + 64 * p)
        lo = vior(viand(z, m4), viand(vishr(h, p), m5))
        hi = vior(viand(vishr(z, 4), m4), viand(vishl(h, 4 - p), m5))
        a0, a1, a2, a3, a4, a5, a6, a7 = _dot8(a0, a1, a2, a3, a4, a5, a6, a7, lo, xq,
                                               xo + 4 * p, k)
        a0, a1, a2, a3, a4, a5, a6, a7 = _dot8(a0, a1, a2, a3, a4, a5, a6, a7, hi, xq,
                                               xo + 16 + 4 * p, k)
    return a0, a1, a2, a3, a4, a5, a6, a7


@njit(inline="always")
def _sums8_q8(wp, o, xq, xo, k, xsum, xs32):
    a0 = vizero(); a1 = vizero(); a2 = vizero(); a3 = vizero()  # noqa: E702
    a4 = vizero(); a5 = vizero(); a6 = vizero(); a7 = vizero()  # noqa: E702
    for j in range(8):
        a0, a1, a2, a3, a4, a5, a6, a7 = _dot8(a0, a1, a2, a3, a4, a5, a6, a7,
                                               vbytes(wp, o + 64 * j), xq, xo + 4 * j, k)
    return a0, a1, a2, a3, a4, a5, a6, a7


@njit(inline="always")
def _sums_q4_k(wp, o, xq, xo, xsum, xs32):
    """one token's sums of a Q4_K block (256 values, 8 sub-blocks of 32) as ggml_vec_dot_q4_K_q8_K computes it:
    integer sums times each sub-block's 6-bit scale, the mins times the activations' sub-block
    sums (Q8_K's bsums), then d * xd and -dmin * xd. Packed: the qs as 32 words (word 8j + p:
    bytes 32j + 4p.., low nibbles sub-block 2j, high 2j + 1), the 16 rows' scales of sub-block
    s at 2048 + 16s, their mins at 2176 + 16s, d at 2304, dmin at 2336. xs32: each sub-block's
    activation sum as a float (see matmul_q4_k)."""
    m4 = vibcast(0x0F0F0F0F)
    isum = vizero()
    for j in range(4):
        lo = vizero()
        hi = vizero()
        for p in range(8):
            z = vbytes(wp, o + 512 * j + 64 * p)
            lo = vdpbusd(lo, viand(z, m4), vibcast(ld_u32(xq, xo + 64 * j + 4 * p)))
            hi = vdpbusd(hi, viand(vishr(z, 4), m4), vibcast(ld_u32(xq, xo + 64 * j + 32 + 4 * p)))
        isum = viadd(isum, viadd(vimul(lo, vu8(wp, o + 2048 + 32 * j)),
                                 vimul(hi, vu8(wp, o + 2064 + 32 * j))))
    msum = vzero()
    for s in range(8):
        msum = vfma(vcvt(vu8(wp, o + 2176 + 16 * s)), vbcast(ld(xs32, xo // QK + s)), msum)
    return isum, msum


@njit(inline="always")
def _finish_q4_k(wp, o, sums, xo, xd, xsum, xs32, acc):
    """acc + a Q4_K block's integer sums (already times the sub-block scales) times d * xd,
    and its mins' sum (times the activations' sub-block sums) times -dmin * xd; sums: (the
    integer sums, the mins' sum as floats). The mins' sum is of integers under 2**24 (mins
    < 64, sub-block sums of 32 int8 values), so float multiply-adds give it exactly, as
    ggml's integer sums do."""
    isum, msum = sums
    dx = ld(xd, xo // QK_K)
    acc = vfma(vcvt(isum), vmul(vf16(wp, o + 2304), vbcast(dx)), acc)
    return vfma(msum, vmul(vf16(wp, o + 2336), vbcast(-dx)), acc)


@njit(inline="always")
def _nibble_sums8(wp, o, shift, m4, xq, xo, k):
    """integer sums of 16 rows' 32 nibbles (the low ones of the 8 packed words at byte o, or
    with shift 4 the high ones) times each of 8 tokens' 32 activation bytes"""
    a0 = vizero(); a1 = vizero(); a2 = vizero(); a3 = vizero()  # noqa: E702
    a4 = vizero(); a5 = vizero(); a6 = vizero(); a7 = vizero()  # noqa: E702
    for p in range(8):
        z = viand(vishr(vbytes(wp, o + 64 * p), shift), m4)
        a0, a1, a2, a3, a4, a5, a6, a7 = _dot8(a0, a1, a2, a3, a4, a5, a6, a7, z, xq,
                                               xo + 4 * p, k)
    return a0, a1, a2, a3, a4, a5, a6, a7


@njit(inline="always")
def _sums8_q4_k(wp, o, xq, xo, k, xsum, xs32):
    """8 tokens' sums of a Q4_K block: each sub-block's integer sums times its scales, and the
    mins times the sub-block sums, the mins converted once for the 8"""
    m4 = vibcast(0x0F0F0F0F)
    i0 = vizero(); i1 = vizero(); i2 = vizero(); i3 = vizero()  # noqa: E702
    i4 = vizero(); i5 = vizero(); i6 = vizero(); i7 = vizero()  # noqa: E702
    for j in range(4):
        for half in range(2):  # sub-block 2j + half: the low nibbles, then the high
            a0, a1, a2, a3, a4, a5, a6, a7 = _nibble_sums8(
                wp, o + 512 * j, 4 * half, m4, xq, xo + 64 * j + 32 * half, k)
            sc = vu8(wp, o + 2048 + 32 * j + 16 * half)
            i0 = viadd(i0, vimul(a0, sc)); i1 = viadd(i1, vimul(a1, sc))  # noqa: E702
            i2 = viadd(i2, vimul(a2, sc)); i3 = viadd(i3, vimul(a3, sc))  # noqa: E702
            i4 = viadd(i4, vimul(a4, sc)); i5 = viadd(i5, vimul(a5, sc))  # noqa: E702
            i6 = viadd(i6, vimul(a6, sc)); i7 = viadd(i7, vimul(a7, sc))  # noqa: E702
    m0 = vzero(); m1 = vzero(); m2 = vzero(); m3 = vzero()  # noqa: E702
    m4_ = vzero(); m5 = vzero(); m6 = vzero(); m7 = vzero()  # noqa: E702
    g, gk = xo // QK, k // QK
    for s in range(8):
        mv = vcvt(vu8(wp, o + 2176 + 16 * s))
        m0 = vfma(mv, vbcast(ld(xs32, g + s)), m0)
        m1 = vfma(mv, vbcast(ld(xs32, g + gk + s)), m1)
        m2 = vfma(mv, vbcast(ld(xs32, g + 2 * gk + s)), m2)
        m3 = vfma(mv, vbcast(ld(xs32, g + 3 * gk + s)), m3)
        m4_ = vfma(mv, vbcast(ld(xs32, g + 4 * gk + s)), m4_)
        m5 = vfma(mv, vbcast(ld(xs32, g + 5 * gk + s)), m5)
        m6 = vfma(mv, vbcast(ld(xs32, g + 6 * gk + s)), m6)
        m7 = vfma(mv, vbcast(ld(xs32, g + 7 * gk + s)), m7)
    return ((i0, m0), (i1, m1), (i2, m2), (i3, m3), (i4, m4_), (i5, m5), (i6, m6), (i7, m7))


@njit(inline="always")
def _q6_sub(lo, hi, wp, o, j, half, xsum, g, isum):
    """isum + two sub-blocks' integer sums (chunks 2j and 2j + 1, values 16 * half..) times
    their int8 scales, less 32 times the scaled activation sums (the values' -32)"""
    s0 = 4 * j + half
    s1 = 4 * j + 2 + half
    isum = viadd(isum, vimul(vi8(wp, o + 3072 + 16 * s0), visub(lo, vibcast(32 * xsum[g + s0]))))
    return viadd(isum, vimul(vi8(wp, o + 3072 + 16 * s1), visub(hi, vibcast(32 * xsum[g + s1]))))


@njit(inline="always")
def _sums_q6_k(wp, o, xq, xo, xsum, xs32):
    """one token's sums of a Q6_K block (256 values, 16 sub-blocks of 16 with int8 scales) as
    ggml_vec_dot_q6_K_q8_K computes it: per sub-block the integer sums less 32 times the
    activations' sum (Q8_K's bsums), times its scale, then d * xd. Packed by _q6_k_fields:
    nibble words at 512j + 64p, top-bit words at 2048 + 256j + 64w, scales at 3072 + 16s, d at
    3328."""
    m4 = vibcast(0x0F0F0F0F)
    m2 = vibcast(0x30303030)
    isum = vizero()
    g = xo // 16
    for j in range(4):
        for half in range(2):
            lo = vizero()
            hi = vizero()
            for w in range(2 * half, 2 * half + 2):
                h = vbytes(wp, o + 2048 + 256 * j + 64 * w)
                x = xo + 64 * j + 8 * w
                z = vbytes(wp, o + 512 * j + 128 * w)  # nibble word 2w: top bits at 0 and 2
                lo = vdpbusd(lo, vior(viand(z, m4), viand(vishl(h, 4), m2)),
                             vibcast(ld_u32(xq, x)))
                hi = vdpbusd(hi, vior(viand(vishr(z, 4), m4), viand(vishl(h, 2), m2)),
                             vibcast(ld_u32(xq, x + 32)))
                z = vbytes(wp, o + 512 * j + 128 * w + 64)  # word 2w + 1: top bits at 4 and 6
                lo = vdpbusd(lo, vior(viand(z, m4), viand(h, m2)), vibcast(ld_u32(xq, x + 4)))
                hi = vdpbusd(hi, vior(viand(vishr(z, 4), m4), viand(vishr(h, 2), m2)),
                             vibcast(ld_u32(xq, x + 36)))
            isum = _q6_sub(lo, hi, wp, o, j, half, xsum, g, isum)
    return isum


@njit(inline="always")
def _q6_k_sums8(wp, o, j, half, high, m4, m2, xq, xo, k):
    """integer sums of one Q6_K sub-block of 16 rows (4j + half; high: 4j + 2 + half, the
    high nibbles) times each of 8 tokens' activation bytes (token i's block at xo + i * k),
    the 6-bit values assembled once for the 8 as _sums_q6_k assembles them"""
    a0 = vizero(); a1 = vizero(); a2 = vizero(); a3 = vizero()  # noqa: E702
    a4 = vizero(); a5 = vizero(); a6 = vizero(); a7 = vizero()  # noqa: E702
    for w in range(2 * half, 2 * half + 2):
        h = vbytes(wp, o + 2048 + 256 * j + 64 * w)
        x = xo + 64 * j + 8 * w
        z = vbytes(wp, o + 512 * j + 128 * w)
        z1 = vbytes(wp, o + 512 * j + 128 * w + 64)
        if high:
            v0 = vior(viand(vishr(z, 4), m4), viand(vishl(h, 2), m2))
            v1 = vior(viand(vishr(z1, 4), m4), viand(vishr(h, 2), m2))
            x += 32
        else:
            v0 = vior(viand(z, m4), viand(vishl(h, 4), m2))
            v1 = vior(viand(z1, m4), viand(h, m2))
        a0, a1, a2, a3, a4, a5, a6, a7 = _dot8(a0, a1, a2, a3, a4, a5, a6, a7, v0, xq, x, k)
        a0, a1, a2, a3, a4, a5, a6, a7 = _dot8(a0, a1, a2, a3, a4, a5, a6, a7, v1, xq, x + 4, k)
    return a0, a1, a2, a3, a4, a5, a6, a7


@njit(inline="always")
def _q6_k_scale8(wp, o, s, xsum, g, gk, a0, a1, a2, a3, a4, a5, a6, a7, i0, i1, i2, i3, i4,
                 i5, i6, i7):
    """each i_t + sub-block s's integer sums a_t less 32 times token t's activation sum (its
    xsum at g + t * gk + s), times the sub-block's int8 scales, as _q6_sub"""
    sc = vi8(wp, o + 3072 + 16 * s)
    return (viadd(i0, vimul(sc, visub(a0, vibcast(32 * xsum[g + s])))),
            viadd(i1, vimul(sc, visub(a1, vibcast(32 * xsum[g + gk + s])))),
            viadd(i2, vimul(sc, visub(a2, vibcast(32 * xsum[g + 2 * gk + s])))),
            viadd(i3, vimul(sc, visub(a3, vibcast(32 * xsum[g + 3 * gk + s])))),
            viadd(i4, vimul(sc, visub(a4, vibcast(32 * xsum[g + 4 * gk + s])))),
            viadd(i5, vimul(sc, visub(a5, vibcast(32 * xsum[g + 5 * gk + s])))),
            viadd(i6, vimul(sc, visub(a6, vibcast(32 * xsum[g + 6 * gk + s])))),
            viadd(i7, vimul(sc, visub(a7, vibcast(32 * xsum[g + 7 * gk + s])))))


@njit(inline="always")
def _sums8_q6_k(wp, o, xq, xo, k, xsum, xs32):
    """8 tokens' integer sums of a Q6_K block, each sub-block's less its -32 offset and times
    its scales"""
    m4 = vibcast(0x0F0F0F0F)
    m2 = vibcast(0x30303030)
    gk = k // 16  # xsum entries per token
    gx = xo // 16
    i0 = vizero(); i1 = vizero(); i2 = vizero(); i3 = vizero()  # noqa: E702
    i4 = vizero(); i5 = vizero(); i6 = vizero(); i7 = vizero()  # noqa: E702
    for j in range(4):
        for half in range(2):
            a0, a1, a2, a3, a4, a5, a6, a7 = _q6_k_sums8(wp, o, j, half, False, m4, m2, xq, xo, k)
            i0, i1, i2, i3, i4, i5, i6, i7 = _q6_k_scale8(
                wp, o, 4 * j + half, xsum, gx, gk, a0, a1, a2, a3, a4, a5, a6, a7,
                i0, i1, i2, i3, i4, i5, i6, i7)
            a0, a1, a2, a3, a4, a5, a6, a7 = _q6_k_sums8(wp, o, j, half, True, m4, m2, xq, xo, k)
            i0, i1, i2, i3, i4, i5, i6, i7 = _q6_k_scale8(
                wp, o, 4 * j + 2 + half, xsum, gx, gk, a0, a1, a2, a3, a4, a5, a6, a7,
                i0, i1, i2, i3, i4, i5, i6, i7)
    return i0, i1, i2, i3, i4, i5, i6, i7


@njit(inline="always")
def _finish_q6_k(wp, o, isum, xo, xd, xsum, xs32, acc):
    """acc + a Q6_K block's scaled integer sums times d * xd (as the one-token path ends)"""
    return vfma(vcvt(isum), vmul(vf16(wp, o + 3328), vbcast(ld(xd, xo // QK_K))), acc)


# ================================================================== kernels

@njit(inline="always")
def _stream(wp, o, GB):
    """the prefetch of the block STREAM_AHEAD bytes after the one at byte o"""
    for line in range(0, GB, 64):
        prefetch(wp, o + STREAM_AHEAD + line)


@njit(inline="always")
def _tile8(wp, g, nb, GB, VB, sums8, finish, xq, xd, xsum, xs32, t, k, out, o0, N):
    """the 16 results of group g for tokens t..t+7, token i's at out[o0 + i * N:]: each block of
    the group (VB values) loaded and unpacked once for all 8 (sums8), each token's result then
    scaled as its one-token block does (finish)"""
    c0 = vzero(); c1 = vzero(); c2 = vzero(); c3 = vzero()  # noqa: E702
    c4 = vzero(); c5 = vzero(); c6 = vzero(); c7 = vzero()  # noqa: E702
    o = g * nb * GB
    for b in range(nb):
        _stream(wp, o, GB)
        xo = t * k + b * VB
        s0, s1, s2, s3, s4, s5, s6, s7 = sums8(wp, o, xq, xo, k, xsum, xs32)
        c0 = finish(wp, o, s0, xo, xd, xsum, xs32, c0)
        c1 = finish(wp, o, s1, xo + k, xd, xsum, xs32, c1)
        c2 = finish(wp, o, s2, xo + 2 * k, xd, xsum, xs32, c2)
        c3 = finish(wp, o, s3, xo + 3 * k, xd, xsum, xs32, c3)
        c4 = finish(wp, o, s4, xo + 4 * k, xd, xsum, xs32, c4)
        c5 = finish(wp, o, s5, xo + 5 * k, xd, xsum, xs32, c5)
        c6 = finish(wp, o, s6, xo + 6 * k, xd, xsum, xs32, c6)
        c7 = finish(wp, o, s7, xo + 7 * k, xd, xsum, xs32, c7)
        o += GB
    vstore(out, o0 + t * N, c0)
    vstore(out, o0 + (t + 1) * N, c1)
    vstore(out, o0 + (t + 2) * N, c2)
    vstore(out, o0 + (t + 3) * N, c3)
    vstore(out, o0 + (t + 4) * N, c4)
    vstore(out, o0 + (t + 5) * N, c5)
    vstore(out, o0 + (t + 6) * N, c6)
    vstore(out, o0 + (t + 7) * N, c7)


@njit(inline="always")
def _tile1(wp, g, nb, GB, VB, sums1, finish, xq, xd, xsum, xs32, t, k, out, o0, N):
    """group g's 16 results for token t, at out[o0 + t * N:] (the same operations as each of
    _tile8's)"""
    a = vzero()
    o = g * nb * GB
    for b in range(nb):
        _stream(wp, o, GB)
        xo = t * k + b * VB
        a = finish(wp, o, sums1(wp, o, xq, xo, xsum, xs32), xo, xd, xsum, xs32, a)
        o += GB
    vstore(out, o0 + t * N, a)


@njit(inline="always")
def _group(g, wp, parts, xq, xd, xsum, xs32, n, k, out, VB, sums1, sums8, finish):
    """group g's 16 rows for all n tokens into out (flat): part p's rows [parts[p],
    parts[p + 1]) as a C-contiguous (n, rows) array from out[n * parts[p]]; tiles of 8 tokens,
    then the rest one by one (sums1), each token's result scaled by `finish`"""
    _, nb, GB = wp.shape
    p = 0
    while parts[p + 1] <= GROUP * g:
        p += 1
    N = parts[p + 1] - parts[p]
    o0 = n * parts[p] + GROUP * g - parts[p]
    t = 0
    while t + 8 <= n:
        _tile8(wp, g, nb, GB, VB, sums8, finish, xq, xd, xsum, xs32, t, k, out, o0, N)
        t += 8
    while t < n:
        _tile1(wp, g, nb, GB, VB, sums1, finish, xq, xd, xsum, xs32, t, k, out, o0, N)
        t += 1


# One compiled group function per format, called from the parallel loop rather than inlined
# into it: numba's parfor passes copy and re-analyse a loop's whole body, which cost seconds
# of the first run's compilation with the tiles inlined there. Then x (n, k) @ W.T into out
# (flat), parallel over groups of 16 rows unless `serial`, the activations quantized in blocks
# of QK (Q8_0) or, for the K-quants, QK_K (Q8_K) values.

@njit(**_JIT)
def _group_q4_0(g, wp, parts, xq, xd, xsum, xs32, n, k, out):
    _group(g, wp, parts, xq, xd, xsum, xs32, n, k, out, QK, _sums_q4, _sums8_q4,
           _finish_q4_0)


@njit(**_JIT)
def _group_q4_1(g, wp, parts, xq, xd, xsum, xs32, n, k, out):
    _group(g, wp, parts, xq, xd, xsum, xs32, n, k, out, QK, _sums_q4, _sums8_q4,
           _finish_q4_1)


@njit(**_JIT)
def _group_q5_0(g, wp, parts, xq, xd, xsum, xs32, n, k, out):
    _group(g, wp, parts, xq, xd, xsum, xs32, n, k, out, QK, _sums_q5, _sums8_q5,
           _finish_q5_0)


@njit(**_JIT)
def _group_q8_0(g, wp, parts, xq, xd, xsum, xs32, n, k, out):
    _group(g, wp, parts, xq, xd, xsum, xs32, n, k, out, QK, _sums_q8, _sums8_q8,
           _finish_q8_0)


@njit(**_JIT)
def _group_q4_k(g, wp, parts, xq, xd, xsum, xs32, n, k, out):
    _group(g, wp, parts, xq, xd, xsum, xs32, n, k, out, QK_K, _sums_q4_k, _sums8_q4_k,
           _finish_q4_k)


@njit(**_JIT)
def _group_q6_k(g, wp, parts, xq, xd, xsum, xs32, n, k, out):
    _group(g, wp, parts, xq, xd, xsum, xs32, n, k, out, QK_K, _sums_q6_k, _sums8_q6_k,
           _finish_q6_k)


@njit(parallel=True, **_JIT)
def matmul_q4_0(wp, parts, x, out, serial):
    threads = _serial_begin(serial)
    xq, xd, xsum, xs32 = quantize_activations(x, QK)
    for g in prange(wp.shape[0]):
        _group_q4_0(np.int64(g), wp, parts, xq, xd, xsum, xs32, x.shape[0], x.shape[1], out)
    _serial_end(serial, threads)


@njit(parallel=True, **_JIT)
def matmul_q4_1(wp, parts, x, out, serial):
    threads = _serial_begin(serial)
    xq, xd, xsum, xs32 = quantize_activations(x, QK)
    for g in prange(wp.shape[0]):
        _group_q4_1(np.int64(g), wp, parts, xq, xd, xsum, xs32, x.shape[0], x.shape[1], out)
    _serial_end(serial, threads)


@njit(parallel=True, **_JIT)
def matmul_q5_0(wp, parts, x, out, serial):
    threads = _serial_begin(serial)
    xq, xd, xsum, xs32 = quantize_activations(x, QK)
    for g in prange(wp.shape[0]):
        _group_q5_0(np.int64(g), wp, parts, xq, xd, xsum, xs32, x.shape[0], x.shape[1], out)
    _serial_end(serial, threads)


@njit(parallel=True, **_JIT)
def matmul_q8_0(wp, parts, x, out, serial):
    threads = _serial_begin(serial)
    xq, xd, xsum, xs32 = quantize_activations(x, QK)
    for g in prange(wp.shape[0]):
        _group_q8_0(np.int64(g), wp, parts, xq, xd, xsum, xs32, x.shape[0], x.shape[1], out)
    _serial_end(serial, threads)


@njit(parallel=True, **_JIT)
def matmul_q4_k(wp, parts, x, out, serial):
    threads = _serial_begin(serial)
    xq, xd, xsum, xs32 = quantize_activations(x, QK_K)
    for i in range(xs32.size):  # Q4_K's mins take each sub-block's plain sum (exact as a float)
        xs32[i] = np.float32(xsum[2 * i] + xsum[2 * i + 1])
    for g in prange(wp.shape[0]):
        _group_q4_k(np.int64(g), wp, parts, xq, xd, xsum, xs32, x.shape[0], x.shape[1], out)
    _serial_end(serial, threads)


@njit(parallel=True, **_JIT)
def matmul_q6_k(wp, parts, x, out, serial):
    threads = _serial_begin(serial)
    xq, xd, xsum, xs32 = quantize_activations(x, QK_K)
    for g in prange(wp.shape[0]):
        _group_q6_k(np.int64(g), wp, parts, xq, xd, xsum, xs32, x.shape[0], x.shape[1], out)
    _serial_end(serial, threads)


Q4_0.register_kernels("cpu_packed", PackedFormat((_bytes(2, 16, 4), _bytes(0, 2, 2)), matmul_q4_0))
Q4_1.register_kernels("cpu_packed", PackedFormat(
    (_bytes(4, 16, 4), _bytes(0, 2, 2), _bytes(2, 2, 2)), matmul_q4_1))
Q5_0.register_kernels("cpu_packed", PackedFormat(
    (_bytes(6, 16, 4), _q5_0_high_bits, _bytes(0, 2, 2)), matmul_q5_0))
# signed values flipped to unsigned (q + 128)
Q8_0.register_kernels("cpu_packed", PackedFormat((_bytes(2, 32, 4, 0x80), _bytes(0, 2, 2)),
                                                 matmul_q8_0))
Q4_K.register_kernels("cpu_packed", PackedFormat((_q4_k_fields,), matmul_q4_k))
Q6_K.register_kernels("cpu_packed", PackedFormat((_q6_k_fields,), matmul_q6_k))
KERNELS = kernels_of("cpu_packed")


def matmul(packed: PackedWeight, x: np.ndarray, serial: bool) -> list[np.ndarray]:
    """x (n, n_in) float32 C-contiguous @ W.T: float32 (n, rows) for each matrix it holds
    (one unless fused), each C-contiguous."""
    n = x.shape[0]
    out = np.empty(n * packed.n_out, np.float32)
    if n:
        KERNELS[packed.type_name].kernel(packed.data, packed.parts, x, out, serial)
    if len(packed.parts) == 2:
        return [out.reshape(n, packed.n_out)]
    bounds = packed.parts.tolist()
    return [out[n * a:n * b].reshape(n, b - a) for a, b in zip(bounds[:-1], bounds[1:])]
