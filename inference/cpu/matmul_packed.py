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

Formats (rows a multiple of 32 values, a multiple of 16 rows): Q4_0, Q4_1, Q8_0, each registered
against its class as its "cpu_packed" kernels (`PackedFormat`: what to pack, and its kernel; the
block's bytes come from the class). Per group of 16
rows and block b the packed bytes are: the quantized values as 16-lane vectors (Q4_*: 4 vectors
of 64 bytes, lane i = bytes 4p..4p+3 of row i's qs, low nibbles values 4p.., high nibbles
16 + 4p..; Q8_0: 8 vectors, lane i = values 4j..4j+3 of row i, sign bit flipped to unsigned),
then the 16 rows' scales d (halves), then (Q4_1) their mins m. The activations are quantized as
`matmul_int8.quantize_activations` does (Q8_0 blocks of 32, with their scaled sums `xs32`); the
offsets of Q4_0 (-8) and Q8_0 (-128 after the flip) and Q4_1's mins go through those sums.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit, prange

from ..quants import get_quant_type, kernels_of
from ..quants.legacy import Q4_0, Q4_1, Q8_0
from .matmul_int8 import quantize_activations
from .matmul_kernels import _serial_begin, _serial_end
from .simd import (ld, ld_u32, prefetch_stream, vbcast, vbytes, vcvt, vdpbusd, vf16, vfma, viand,
                   vibcast, vishr, vizero, vmul, vstore, vzero)

GROUP = 16  # rows interleaved, one per lane
QK = Q8_0.block_size  # values per block: the activations' (Q8_0) and every packed format's
PACK_CHUNK = 16 << 20  # bytes of a matrix's rows packed at a time
# how far ahead of the block in use the weights are asked for, non-temporally: a step reads each
# weight once, and the hint keeps them from evicting the KV cache and activations from L2/L3 (a
# plain prefetch, or none, leaves the hardware prefetchers' copies in every cache level)
STREAM_AHEAD = 2048
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


# ================================================================== packing (numpy, at load)

def _shaped(dst: np.ndarray, *shape: int) -> np.ndarray:
    """a view of dst with `shape` (never a copy: writes must land in dst)"""
    view = dst.reshape(shape)
    if not np.may_share_memory(view, dst):  # numpy 2.5 deprecates setting .shape, which raised
        raise ValueError(f"no view of {dst.shape} has shape {shape}")
    return view


def _put_words(dst, qs, xor=0):
    """dst (groups, nb, n_words * 64) <- word p of each row of a group one after the other (lane
    i = row i); qs uint8 (n_out, nb, 4 * n_words), a block's quantized bytes"""
    n_groups, nb, width = dst.shape
    n_words = width // (4 * GROUP)
    src = qs.reshape(n_groups, GROUP, nb, n_words, 4).transpose(0, 2, 3, 1, 4)
    out = _shaped(dst, n_groups, nb, n_words, GROUP, 4)
    if xor:
        np.bitwise_xor(src, np.uint8(xor), out=out)
    else:
        out[...] = src


def _put_halves(dst, halves):
    """dst (groups, nb, 32) <- the 16 rows' halves of each block (row i at bytes 2i, 2i + 1)"""
    n_groups, nb = dst.shape[:2]
    _shaped(dst, n_groups, nb, GROUP, 2)[...] = \
        halves.reshape(n_groups, GROUP, nb, 2).transpose(0, 2, 1, 3)


class PackedFormat(NamedTuple):
    """How a format is packed and multiplied, registered against its class as its "cpu_packed"
    kernels: (first byte, bytes) within a block of what is packed, in order (the quantized
    values, d, then m where the format has one), the byte XORed into the quantized values (0:
    none) and the kernel below."""
    parts: tuple[tuple[int, int], ...]
    xor: int
    kernel: object  # kernel(wp, parts, x, out, serial)


def packs(type_name: str, n_out: int, n_in: int) -> bool:
    """Whether `pack` takes a matrix of this format and shape."""
    return type_name in KERNELS and n_out % GROUP == 0 and n_in % QK == 0 and n_out > 0


def pack(type_name: str, weight: np.ndarray, release=None) -> PackedWeight:
    """The rows of a ggml matrix (uint8 (n_out, row_bytes)) interleaved for the kernels below,
    written straight into the packed array (no temporary copies of the matrix), PACK_CHUNK bytes
    of rows at a time; release(rows) after each chunk is packed lets the caller drop the
    source's pages as it goes (a 262,144-token LM head would otherwise be resident twice)."""
    parts, xor, _ = KERNELS[type_name]
    type_size = get_quant_type(type_name).type_size
    n_out, row_bytes = weight.shape
    nb = row_bytes // type_size
    if not packs(type_name, n_out, nb * QK) or row_bytes % type_size:
        raise ValueError(f"{type_name} {weight.shape} cannot be packed")
    rows = np.asarray(weight).reshape(n_out, nb, type_size)
    group_block = GROUP * sum(size for _, size in parts)
    data = np.empty((n_out // GROUP, nb, group_block), np.uint8)
    step = max(1, PACK_CHUNK // (GROUP * row_bytes)) * GROUP
    for r0 in range(0, n_out, step):
        r1 = min(n_out, r0 + step)
        chunk, dst = rows[r0:r1], data[r0 // GROUP:r1 // GROUP]
        (at, size), o = parts[0], GROUP * parts[0][1]
        _put_words(dst[:, :, :o], chunk[:, :, at:at + size], xor)
        for at, size in parts[1:]:
            _put_halves(dst[:, :, o:o + 2 * GROUP], chunk[:, :, at:at + 2])
            o += 2 * GROUP
        if release is not None:
            release(weight[r0:r1])
    data.flags.writeable = False  # one compiled signature, as the file's rows
    return PackedWeight(type_name, data, n_out, nb * QK, _bounds([n_out]))


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


# ================================================================== one token, one block

@njit(inline="always")
def _sums_q4(wp, o, xq, xo):
    """integer sums of a block of 16 Q4 rows times a token's 32 activation bytes"""
    m4 = vibcast(0x0F0F0F0F)
    s = vizero()
    for p in range(4):
        z = vbytes(wp, o + 64 * p)
        s = vdpbusd(s, viand(z, m4), vibcast(ld_u32(xq, xo + 4 * p)))
        s = vdpbusd(s, viand(vishr(z, 4), m4), vibcast(ld_u32(xq, xo + 16 + 4 * p)))
    return s


@njit(inline="always")
def _sums_q8(wp, o, xq, xo):
    s = vizero()
    for j in range(8):
        s = vdpbusd(s, vbytes(wp, o + 64 * j), vibcast(ld_u32(xq, xo + 4 * j)))
    return s


@njit(inline="always")
def _scaled(sums, d, xd, bi, acc):
    """acc + a block's integer sums times its 16 rows' scales d and the token's scale xd[bi]"""
    return vfma(vcvt(sums), vmul(d, vbcast(ld(xd, bi))), acc)


# per format: the scaled sums, then the offset (-8, -128: times d) or the min (m) through the
# token's scaled block sum xs32[bi]

@njit(inline="always")
def _block_q4_0(wp, o, xq, xo, xd, xs32, bi, acc):
    d = vf16(wp, o + 256)
    acc = _scaled(_sums_q4(wp, o, xq, xo), d, xd, bi, acc)
    return vfma(d, vbcast(ld(xs32, bi) * np.float32(-8)), acc)


@njit(inline="always")
def _block_q4_1(wp, o, xq, xo, xd, xs32, bi, acc):
    acc = _scaled(_sums_q4(wp, o, xq, xo), vf16(wp, o + 256), xd, bi, acc)
    return vfma(vf16(wp, o + 288), vbcast(ld(xs32, bi)), acc)


@njit(inline="always")
def _block_q8_0(wp, o, xq, xo, xd, xs32, bi, acc):
    d = vf16(wp, o + 512)
    acc = _scaled(_sums_q8(wp, o, xq, xo), d, xd, bi, acc)
    return vfma(d, vbcast(ld(xs32, bi) * np.float32(-128)), acc)


# ================================================================== kernels

@njit(inline="always")
def _stream(wp, o, GB):
    """the non-temporal hint for the block STREAM_AHEAD bytes after the one at byte o"""
    for line in range(0, GB, 64):
        prefetch_stream(wp, o + STREAM_AHEAD + line)


@njit(inline="always")
def _tile8(wp, g, nb, GB, block, xq, xd, xs32, t, k, out, o0, N):
    """the 16 results of group g for tokens t..t+7, token i's at out[o0 + i * N:]: each block of
    the group loaded once for all 8"""
    a0 = vzero(); a1 = vzero(); a2 = vzero(); a3 = vzero()  # noqa: E702
    a4 = vzero(); a5 = vzero(); a6 = vzero(); a7 = vzero()  # noqa: E702
    o = g * nb * GB
    for b in range(nb):
        _stream(wp, o, GB)
        xo = t * k + b * QK
        bi = t * nb + b
        a0 = block(wp, o, xq, xo, xd, xs32, bi, a0)
        a1 = block(wp, o, xq, xo + k, xd, xs32, bi + nb, a1)
        a2 = block(wp, o, xq, xo + 2 * k, xd, xs32, bi + 2 * nb, a2)
        a3 = block(wp, o, xq, xo + 3 * k, xd, xs32, bi + 3 * nb, a3)
        a4 = block(wp, o, xq, xo + 4 * k, xd, xs32, bi + 4 * nb, a4)
        a5 = block(wp, o, xq, xo + 5 * k, xd, xs32, bi + 5 * nb, a5)
        a6 = block(wp, o, xq, xo + 6 * k, xd, xs32, bi + 6 * nb, a6)
        a7 = block(wp, o, xq, xo + 7 * k, xd, xs32, bi + 7 * nb, a7)
        o += GB
    vstore(out, o0 + t * N, a0)
    vstore(out, o0 + (t + 1) * N, a1)
    vstore(out, o0 + (t + 2) * N, a2)
    vstore(out, o0 + (t + 3) * N, a3)
    vstore(out, o0 + (t + 4) * N, a4)
    vstore(out, o0 + (t + 5) * N, a5)
    vstore(out, o0 + (t + 6) * N, a6)
    vstore(out, o0 + (t + 7) * N, a7)


@njit(inline="always")
def _tile1(wp, g, nb, GB, block, xq, xd, xs32, t, k, out, o0, N):
    """group g's 16 results for token t, at out[o0 + t * N:] (the same operations as each of
    _tile8's)"""
    a = vzero()
    o = g * nb * GB
    for b in range(nb):
        _stream(wp, o, GB)
        a = block(wp, o, xq, t * k + b * QK, xd, xs32, t * nb + b, a)
        o += GB
    vstore(out, o0 + t * N, a)


@njit(inline="always")
def _group(g, wp, parts, xq, xd, xs32, n, k, out, block):
    """group g's 16 rows for all n tokens into out (flat): part p's rows [parts[p],
    parts[p + 1]) as a C-contiguous (n, rows) array from out[n * parts[p]]"""
    _, nb, GB = wp.shape
    p = 0
    while parts[p + 1] <= GROUP * g:
        p += 1
    N = parts[p + 1] - parts[p]
    o0 = n * parts[p] + GROUP * g - parts[p]
    t = 0
    while t + 8 <= n:
        _tile8(wp, g, nb, GB, block, xq, xd, xs32, t, k, out, o0, N)
        t += 8
    while t < n:
        _tile1(wp, g, nb, GB, block, xq, xd, xs32, t, k, out, o0, N)
        t += 1


# One compiled group function per format, called from the parallel loop rather than inlined
# into it: numba's parfor passes copy and re-analyse a loop's whole body, which cost seconds
# of the first run's compilation with the tiles inlined there.

@njit(**_JIT)
def _group_q4_0(g, wp, parts, xq, xd, xs32, n, k, out):
    _group(g, wp, parts, xq, xd, xs32, n, k, out, _block_q4_0)


@njit(**_JIT)
def _group_q4_1(g, wp, parts, xq, xd, xs32, n, k, out):
    _group(g, wp, parts, xq, xd, xs32, n, k, out, _block_q4_1)


@njit(**_JIT)
def _group_q8_0(g, wp, parts, xq, xd, xs32, n, k, out):
    _group(g, wp, parts, xq, xd, xs32, n, k, out, _block_q8_0)


# x (n, k) @ W.T into out (flat), parallel over groups of 16 rows unless `serial`

@njit(parallel=True, **_JIT)
def matmul_q4_0(wp, parts, x, out, serial):
    threads = _serial_begin(serial)
    xq, xd, _, xs32 = quantize_activations(x, QK)
    for g in prange(wp.shape[0]):
        _group_q4_0(np.int64(g), wp, parts, xq, xd, xs32, x.shape[0], x.shape[1], out)
    _serial_end(serial, threads)


@njit(parallel=True, **_JIT)
def matmul_q4_1(wp, parts, x, out, serial):
    threads = _serial_begin(serial)
    xq, xd, _, xs32 = quantize_activations(x, QK)
    for g in prange(wp.shape[0]):
        _group_q4_1(np.int64(g), wp, parts, xq, xd, xs32, x.shape[0], x.shape[1], out)
    _serial_end(serial, threads)


@njit(parallel=True, **_JIT)
def matmul_q8_0(wp, parts, x, out, serial):
    threads = _serial_begin(serial)
    xq, xd, _, xs32 = quantize_activations(x, QK)
    for g in prange(wp.shape[0]):
        _group_q8_0(np.int64(g), wp, parts, xq, xd, xs32, x.shape[0], x.shape[1], out)
    _serial_end(serial, threads)


Q4_0.register_kernels("cpu_packed", PackedFormat(((2, 16), (0, 2)), 0, matmul_q4_0))
Q4_1.register_kernels("cpu_packed", PackedFormat(((4, 16), (0, 2), (2, 2)), 0, matmul_q4_1))
# signed values flipped to unsigned (q + 128)
Q8_0.register_kernels("cpu_packed", PackedFormat(((2, 32), (0, 2)), 0x80, matmul_q8_0))
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
