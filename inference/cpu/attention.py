"""Attention on the CPU (numba), as ggml's CPU computes it, and the KQ mask it reads.

- `attention`: softmax(q·kᵀ·scale + mask)·v with grouped-query heads (query head `h` reads KV
  head `h // (n_head / n_head_kv)`, like ggml's mul_mat broadcasting), q·k soft-capped first
  when asked (Gemma 2), each head's attention sink (gpt-oss: a logit that joins the softmax's
  denominator, weighing no value) when given. A few query tokens (decoding) go through one fused
  numba kernel that reads an f16 cache's bits directly and skips masked cells; more (a prompt)
  through the GEMM, a chunk of query rows at a time over only the cells the chunk can see.
- `visible_cells`: each token's visible cells in position order, for the fused kernel.
- `build_kq_mask`: llama.cpp's KQ mask (0 or -inf) from the cells' positions and sequences:
  a key is visible when its cell belongs to the token's first sequence, its position is not after
  the token's, and (sliding window) `pos_q - pos_k < n_swa`.
"""
from __future__ import annotations


import numba
import numpy as np
from numba.core import types
from numba.extending import overload

from ..memory import ATTENTION_SCORE_FLOATS
from ..quants.fp16 import HAS_HW_FP16
from .matmul import PARALLEL_MIN_FLOPS
from .matmul_kernels import gemm_nn_f32
from .ops import (F16_TO_F32, NO_SINKS, _softcapped, exp_f32, f16_bits_to_f32,
                  softmax_masked_inplace)
from .simd import (prefetch, threads_get, threads_set, vadd, vbcast, vf16, vfma, vhmax, vload, vmax,
                   vmul, vreduce16, vstore, vsum, vzero)


# at most this many query tokens go through the fused kernel (decode); more through the GEMM.
# Up to here the fused kernel is the faster one, for a step of many sequences most of all (each
# token visits its own sequence's cells alone); the measured ratios are in docs/performance.md.
ATTN_FUSED_MAX_TOKENS = 16
# query rows per GEMM chunk: causal masks let a chunk skip the cells after its last token, so
# smaller chunks skip more (64 of 512 tokens: 56 % of the full score matrix is computed)
ATTN_CHUNK_TOKENS = 64
# and the scores of one chunk stay under ATTENTION_SCORE_FLOATS however long the context
_ATTN_SCORE_BUDGET = ATTENTION_SCORE_FLOATS


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray,
              scale: float, softcap: float = 0.0,
              cells: tuple[np.ndarray, np.ndarray] | None = None,
              sinks: np.ndarray | None = None) -> np.ndarray:
    """q (n, n_head, d_k) float32; k (n_kv, n_head_kv, d_k), v (n_kv, n_head_kv, d_v) as float32
    or as fp16 bit patterns (uint16, the f16 KV cache's storage); mask (n, n_kv); softcap > 0:
    the scores q·k are soft-capped to (-softcap, softcap) before the scale (Gemma 2). cells:
    each token's visible cells in the order its sums visit them (`visible_cells`; the forward
    pass lists them once per batch, by position, so that a token's result does not depend on
    where the cache put its cells), and the per-token kernel for any number of tokens; the mask
    is then llama.cpp's KQ mask, 0 on every visible cell, and is not read again. Default: the
    mask's cells (any finite value added to the scores), in cell order, and the per-token
    kernel up to ATTN_FUSED_MAX_TOKENS tokens. sinks: float32 (n_head,), each head's sink
    logit (ggml_soft_max_add_sinks: it joins the maximum and the denominator), or None.
    Returns float32 (n, n_head * d_v)."""
    n, n_head, d_k = q.shape
    n_kv, n_head_kv, d_v = v.shape
    if k.shape != (n_kv, n_head_kv, d_k) or mask.shape != (n, n_kv):
        raise ValueError(f"attention: q {q.shape}, k {k.shape}, v {v.shape}, mask {mask.shape}")
    if n_head % n_head_kv:
        raise ValueError(f"attention: {n_head} query heads over {n_head_kv} KV heads")
    mask = np.ascontiguousarray(mask, dtype=np.float32)
    k2 = np.ascontiguousarray(k).reshape(n_kv, n_head_kv * d_k)
    v2 = np.ascontiguousarray(v).reshape(n_kv, n_head_kv * d_v)
    q = np.ascontiguousarray(q, dtype=np.float32)
    cap = np.float32(softcap)
    if sinks is not None and np.shape(sinks) != (n_head,):
        raise ValueError(f"attention: sinks of shape {np.shape(sinks)} for {n_head} heads")
    # a writable copy (a model's are read-only file views), as NO_SINKS: one compiled signature
    sinks = NO_SINKS if sinks is None else np.array(sinks, dtype=np.float32)
    if n <= ATTN_FUSED_MAX_TOKENS or cells is not None:
        out = np.empty((n, n_head, d_v), np.float32)
        # the vector kernel needs whole 16-value head slices, and for an f16 cache the CPU's
        # fp16 loads (F16C on x86; without it LLVM would call a helper numba does not link)
        if d_k % 16 or d_v % 16 or (k2.dtype == np.uint16 and not HAS_HW_FP16):
            _attention_rows(q, k2, v2, F16_TO_F32, mask, np.float32(scale), cap, sinks, out)
        else:
            visible, counts = cells if cells is not None else visible_cells(mask)
            _attention_decode(q, _as_kv_rows(k2), _as_kv_rows(v2), n_head_kv, mask, visible,
                              counts, np.float32(scale), cap, sinks, ATTN_DECODE_CELLS, out,
                              decode_serial(n, n_kv, n_head, d_k, d_v), cells is None)
        return out.reshape(n, n_head * d_v)
    if d_k % 16 or d_v % 16:  # head sizes the 16-lane GEMM cannot take
        return _attention_numpy(q, k2, v2, mask, scale, cap, sinks, d_k, d_v)
    return _attention_gemm(q, k2, v2, mask, scale, cap, sinks, d_k, d_v)


def _query_chunks(mask: np.ndarray, rows_per_token: int, align: int):
    """(t0, t1, lo, hi): chunks of query rows, each with the span of cells [lo, hi) its tokens can
    see (causal, sliding window), widened to multiples of `align`. A chunk has at most
    ATTN_CHUNK_TOKENS tokens and its scores (rows_per_token * tokens * cells) stay within
    _ATTN_SCORE_BUDGET floats."""
    n, n_kv = mask.shape
    n_pad = -(-n_kv // align) * align
    step = max(1, min(ATTN_CHUNK_TOKENS, _ATTN_SCORE_BUDGET // max(1, rows_per_token * n_pad)))
    for t0 in range(0, n, step):
        t1 = min(n, t0 + step)
        cols = np.flatnonzero((mask[t0:t1] == 0).any(axis=0))
        lo, hi = (int(cols[0]), int(cols[-1]) + 1) if cols.size else (0, 1)
        yield t0, t1, lo // align * align, min(n_pad, -(-hi // align) * align)


def _attention_gemm(q, k2, v2, mask, scale, softcap, sinks, d_k, d_v):
    """A prompt's attention through the numba GEMM (both matrix products use every thread).
    K and V are converted once to float32 per KV head, K transposed (d_k, cell) and V as rows
    (cell, d_v), so that both products are `x @ w` with the broadcast kernel; cells are
    zero-padded to whole 16-cell vectors (masked out, so they weigh exactly 0)."""
    n, n_head, _ = q.shape
    n_kv = mask.shape[1]
    n_head_kv = k2.shape[1] // d_k
    grp = n_head // n_head_kv
    n_pad = -(-n_kv // 16) * 16
    kt = np.zeros((n_head_kv, d_k, n_pad), np.float32)
    vf = np.zeros((n_head_kv, n_pad, d_v), np.float32)
    _kv_heads_f32(k2, v2, F16_TO_F32, kt, vf)
    kt.flags.writeable = vf.flags.writeable = False  # as weights are: one compiled signature
    out = np.empty((n, n_head, d_v), np.float32)
    for t0, t1, lo, hi in _query_chunks(mask, grp, 16):
        m = t1 - t0
        chunk_mask = np.full((m, hi - lo), -np.inf, np.float32)  # padding cells stay masked
        chunk_mask[:, :min(hi, n_kv) - lo] = mask[t0:t1, lo:hi]
        for g in range(n_head_kv):
            # the group's query heads stacked row-wise: (grp * m, d_k)
            qh = np.ascontiguousarray(q[t0:t1, g * grp:(g + 1) * grp].transpose(1, 0, 2)).reshape(
                grp * m, d_k)
            s = np.empty((grp * m, hi - lo), np.float32)
            gemm_nn_f32(qh, kt[g], lo, s, 2 * s.size * d_k < PARALLEL_MIN_FLOPS)
            softmax_masked_inplace(s.reshape(grp, m, hi - lo), chunk_mask, scale, softcap,
                                   sinks[g * grp:(g + 1) * grp] if sinks.size else None)
            o = np.empty((grp * m, d_v), np.float32)
            gemm_nn_f32(s, vf[g, lo:hi], 0, o, 2 * o.size * (hi - lo) < PARALLEL_MIN_FLOPS)
            out[t0:t1, g * grp:(g + 1) * grp] = o.reshape(grp, m, d_v).transpose(1, 0, 2)
    return out.reshape(n, n_head * d_v)


def _attention_numpy(q, k2, v2, mask, scale, softcap, sinks, d_k, d_v):
    """The batch path for head sizes that are not whole 16-lane vectors: numpy matmuls."""
    n, n_head, _ = q.shape
    n_kv = mask.shape[1]
    n_head_kv = k2.shape[1] // d_k
    grp = n_head // n_head_kv
    k = (f16_bits_to_f32(k2) if k2.dtype == np.uint16 else k2).reshape(n_kv, n_head_kv, d_k)
    v = (f16_bits_to_f32(v2) if v2.dtype == np.uint16 else v2).reshape(n_kv, n_head_kv, d_v)
    kt = k.transpose(1, 2, 0)  # (n_head_kv, d_k, n_kv)
    vh = v.transpose(1, 0, 2)  # (n_head_kv, n_kv, d_v)
    out = np.empty((n, n_head, d_v), np.float32)
    for t0, t1, lo, hi in _query_chunks(mask, n_head, 1):
        m = t1 - t0
        qh = q[t0:t1].reshape(m, n_head_kv, grp, d_k).transpose(1, 2, 0, 3).reshape(
            n_head_kv, grp * m, d_k)
        s = np.matmul(qh, kt[:, :, lo:hi])  # (n_head_kv, grp * m, hi - lo)
        softmax_masked_inplace(s.reshape(n_head, m, hi - lo), mask[t0:t1, lo:hi], scale,
                               softcap, sinks if sinks.size else None)
        o = np.matmul(s, vh[:, lo:hi])  # (n_head_kv, grp * m, d_v)
        out[t0:t1] = o.reshape(n_head_kv, grp, m, d_v).transpose(2, 0, 1, 3).reshape(m, n_head, d_v)
    return out.reshape(n, n_head * d_v)


@numba.njit(cache=True, nogil=True)
def _kv_heads_f32(k, v, lut, kt, vf):
    # k (n_kv, Hkv*Dk), v (n_kv, Hkv*Dv): f32 or fp16 bits
    # -> kt (Hkv, Dk, n_pad), vf (Hkv, n_pad, Dv)
    n_kv = k.shape[0]
    n_head_kv, d_k, _ = kt.shape
    d_v = vf.shape[2]
    for g in range(n_head_kv):
        for j in range(n_kv):
            for c in range(d_k):
                kt[g, c, j] = _load(k, j, g * d_k + c, lut)
            for c in range(d_v):
                vf[g, j, c] = _load(v, j, g * d_v + c, lut)


@numba.njit(cache=True, nogil=True)
def decode_serial(n, n_kv, n_head, d_k, d_v):
    """Whether `_attention_decode` of n tokens over n_kv cells stays on the calling thread"""
    return n * n_kv * n_head * (d_k + d_v) < 1 << 16


# cells per work item of the decode kernel: a token's heads over a long cache split into pieces
# whose partial softmaxes are merged (flash-decoding), so every thread has work
ATTN_DECODE_CELLS = 256


def _as_kv_rows(a: np.ndarray) -> np.ndarray:
    """A cache's K or V rows for `_attention_decode`: fp16 bits as their bytes (uint8), float32
    as they are."""
    return a.view(np.uint8) if a.dtype == np.uint16 else np.ascontiguousarray(a, np.float32)


def _kv_vec(a, row, col):
    """16 values of a cache row (row `row`, from value `col`) as float32."""


@overload(_kv_vec, inline="always")
def _kv_vec_impl(a, row, col):
    if a.dtype == types.uint8:  # fp16 bytes, converted by the CPU (F16C's vcvtph2ps)
        return lambda a, row, col: vf16(a, row * a.shape[1] + 2 * col)
    return lambda a, row, col: vload(a, row * a.shape[1] + col)


def _kv_prefetch(a, row, col, n):
    """Asks for the cache lines of n values of a cache row (row `row`, from value `col`): fp16
    rows only (a float32 cache is not this kernel's common case)."""


@overload(_kv_prefetch, inline="always")
def _kv_prefetch_impl(a, row, col, n):
    if a.dtype == types.uint8:  # fp16 bytes
        def impl(a, row, col, n):
            base = row * a.shape[1] + 2 * col
            for b in range(0, 2 * n, 64):
                prefetch(a, base + b)
        return impl
    return lambda a, row, col, n: None


@numba.njit(cache=True, nogil=True, inline="always")
def _scale_and_max(s, so, span, scale):
    """s.flat[so : so + span] *= scale (IEEE products, as the scalar loop's); returns their
    maximum, 16 at a time."""
    vs = vbcast(scale)
    vm = vbcast(np.float32(-np.inf))
    i = 0
    while i + 16 <= span:
        x = vmul(vload(s, so + i), vs)
        vstore(s, so + i, x)
        vm = vmax(vm, x)
        i += 16
    mx = vhmax(vm)
    while i < span:
        x = s.flat[so + i] * scale
        s.flat[so + i] = x
        mx = max(mx, x)
        i += 1
    return mx


@numba.njit(cache=True, nogil=True, inline="always")
def _scores16(q, qo, k, ko, cells, m, d_k, s, so):
    """s.flat[so + i] = q.flat[qo : qo + d_k] . (row cells[m + i] of k from value ko), i < 16:
    one accumulator per cell, reduced together (no horizontal sum per cell)."""
    j0 = cells[m]; j1 = cells[m + 1]; j2 = cells[m + 2]; j3 = cells[m + 3]  # noqa: E702
    j4 = cells[m + 4]; j5 = cells[m + 5]; j6 = cells[m + 6]; j7 = cells[m + 7]  # noqa: E702
    j8 = cells[m + 8]; j9 = cells[m + 9]; j10 = cells[m + 10]; j11 = cells[m + 11]  # noqa: E702
    j12 = cells[m + 12]; j13 = cells[m + 13]; j14 = cells[m + 14]; j15 = cells[m + 15]  # noqa: E702
    a0 = vzero(); a1 = vzero(); a2 = vzero(); a3 = vzero()  # noqa: E702
    a4 = vzero(); a5 = vzero(); a6 = vzero(); a7 = vzero()  # noqa: E702
    a8 = vzero(); a9 = vzero(); a10 = vzero(); a11 = vzero()  # noqa: E702
    a12 = vzero(); a13 = vzero(); a14 = vzero(); a15 = vzero()  # noqa: E702
    for c in range(0, d_k, 16):
        qv = vload(q, qo + c)
        col = ko + c
        a0 = vfma(qv, _kv_vec(k, j0, col), a0)
        a1 = vfma(qv, _kv_vec(k, j1, col), a1)
        a2 = vfma(qv, _kv_vec(k, j2, col), a2)
        a3 = vfma(qv, _kv_vec(k, j3, col), a3)
        a4 = vfma(qv, _kv_vec(k, j4, col), a4)
        a5 = vfma(qv, _kv_vec(k, j5, col), a5)
        a6 = vfma(qv, _kv_vec(k, j6, col), a6)
        a7 = vfma(qv, _kv_vec(k, j7, col), a7)
        a8 = vfma(qv, _kv_vec(k, j8, col), a8)
        a9 = vfma(qv, _kv_vec(k, j9, col), a9)
        a10 = vfma(qv, _kv_vec(k, j10, col), a10)
        a11 = vfma(qv, _kv_vec(k, j11, col), a11)
        a12 = vfma(qv, _kv_vec(k, j12, col), a12)
        a13 = vfma(qv, _kv_vec(k, j13, col), a13)
        a14 = vfma(qv, _kv_vec(k, j14, col), a14)
        a15 = vfma(qv, _kv_vec(k, j15, col), a15)
    vstore(s, so, vreduce16(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14,
                            a15))


def visible_cells(mask: np.ndarray, order: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(visible int32 (n, n_kv), counts int64 (n,)): visible[t, :counts[t]] are the cells token t
    may see (mask above -inf), in `order` (default: cell order). The same for every layer of a
    batch: the forward pass lists them once (KQMask.cells)."""
    mask = np.ascontiguousarray(mask, dtype=np.float32)
    if order is None:
        order = np.arange(mask.shape[1], dtype=np.int64)
    visible = np.empty(mask.shape, np.int32)
    counts = np.empty(mask.shape[0], np.int64)
    _visible_cells(mask, np.ascontiguousarray(order, dtype=np.int64), visible, counts)
    return visible, counts


@numba.njit(cache=True, nogil=True)
def _visible_cells(mask, order, visible, counts):
    for t in range(mask.shape[0]):
        m = 0
        for i in range(mask.shape[1]):
            j = order[i]
            if mask[t, j] != -np.inf:
                visible[t, m] = j
                m += 1
        counts[t] = m


@numba.njit(cache=True, nogil=True, inline="always")
def _weighted_rows(s, r, span, v, cells, vo, d_v, o, oo):
    """o.flat[oo : oo + d_v] = sum over i < span of s[r, i] * (row cells[i] of v from value vo):
    64 values (four accumulators) at a time, so that each row's weight and address serve four
    vectors; 16 at a time for the rest, two cells at a time (two FMA chains)."""
    c = 0
    while c + 64 <= d_v:
        a0 = vzero(); a1 = vzero(); a2 = vzero(); a3 = vzero()  # noqa: E702
        col = vo + c
        for i in range(span):
            p = vbcast(s[r, i])
            j = cells[i]
            a0 = vfma(p, _kv_vec(v, j, col), a0)
            a1 = vfma(p, _kv_vec(v, j, col + 16), a1)
            a2 = vfma(p, _kv_vec(v, j, col + 32), a2)
            a3 = vfma(p, _kv_vec(v, j, col + 48), a3)
        vstore(o, oo + c, a0); vstore(o, oo + c + 16, a1)  # noqa: E702
        vstore(o, oo + c + 32, a2); vstore(o, oo + c + 48, a3)  # noqa: E702
        c += 64
    while c < d_v:
        a0 = vzero(); a1 = vzero()  # noqa: E702
        col = vo + c
        i = 0
        while i + 2 <= span:
            a0 = vfma(vbcast(s[r, i]), _kv_vec(v, cells[i], col), a0)
            a1 = vfma(vbcast(s[r, i + 1]), _kv_vec(v, cells[i + 1], col), a1)
            i += 2
        if i < span:
            a0 = vfma(vbcast(s[r, i]), _kv_vec(v, cells[i], col), a0)
        vstore(o, oo + c, vadd(a0, a1))
        c += 16


@numba.njit(cache=True, nogil=True, inline="always")
def _weighted_rows4(s, r0, nh, span, v, cells, vo, d_v, o, oo):
    """`_weighted_rows` for nh (3 or 4) rows r0.. of s at once, into o.flat[oo + h * d_v:],
    with the same sums (one chain per 16 values): each V vector is converted once for all of
    them (grouped-query heads share their KV head's rows)."""
    r1, r2, r3 = r0 + 1, r0 + 2, r0 + 3  # r3 read only when nh is 4
    c = 0
    while c < d_v:
        w = 32 if c + 32 <= d_v else 16  # values this pass: two vectors, or the last one
        a0 = vzero(); a1 = vzero(); b0 = vzero(); b1 = vzero()  # noqa: E702
        e0 = vzero(); e1 = vzero(); f0 = vzero(); f1 = vzero()  # noqa: E702
        col = vo + c
        for i in range(span):
            j = cells[i]
            x0 = _kv_vec(v, j, col)
            x1 = _kv_vec(v, j, col + 16) if w == 32 else x0
            p = vbcast(s[r0, i])
            a0 = vfma(p, x0, a0); a1 = vfma(p, x1, a1)  # noqa: E702
            p = vbcast(s[r1, i])
            b0 = vfma(p, x0, b0); b1 = vfma(p, x1, b1)  # noqa: E702
            p = vbcast(s[r2, i])
            e0 = vfma(p, x0, e0); e1 = vfma(p, x1, e1)  # noqa: E702
            if nh == 4:  # loop-invariant: LLVM makes a loop for each case
                p = vbcast(s[r3, i])
                f0 = vfma(p, x0, f0); f1 = vfma(p, x1, f1)  # noqa: E702
        vstore(o, oo + c, a0); vstore(o, oo + d_v + c, b0)  # noqa: E702
        vstore(o, oo + 2 * d_v + c, e0)
        if nh == 4:
            vstore(o, oo + 3 * d_v + c, f0)
        if w == 32:
            vstore(o, oo + c + 16, a1); vstore(o, oo + d_v + c + 16, b1)  # noqa: E702
            vstore(o, oo + 2 * d_v + c + 16, e1)
            if nh == 4:
                vstore(o, oo + 3 * d_v + c + 16, f1)
        c += w


@numba.njit(cache=True, nogil=True, parallel=True, fastmath={"reassoc", "contract"},
            error_model="numpy")
def _attention_decode(q, k, v, n_head_kv, mask, visible, counts, scale, softcap, sinks, piece,
                      out, serial, additive):
    # q (n, H, Dk) f32; k (n_kv, Hkv*Dk), v (n_kv, Hkv*Dv) as fp16 bytes (uint8) or f32;
    # out (n, H, Dv). Only the cells a token can see are visited, listed first (in a batch of
    # several sequences each token sees its own sequence's cells alone, scattered over the
    # cache). Work item = (token, KV head, piece of `piece` of those cells): scores, their max m,
    # sum l and the p-weighted V rows o, merged afterwards as exp(m - M)-weighted sums.
    # additive: the mask's values on visible cells are added to the scores (else they are 0,
    # and the softmax's loops run over contiguous scores alone, vectorized). sinks (H,) or
    # empty: join each head's softmax once, when its pieces' sums are final (_normalizer).
    threads = threads_get()
    if serial:
        threads_set(1)
    n, n_head, d_k = q.shape
    d_v = out.shape[2]
    grp = n_head // n_head_kv
    n_pieces = max(1, (counts.max() + piece - 1) // piece)
    items = n * n_head_kv * n_pieces
    part_m = np.empty((items, grp), np.float32)
    part_l = np.empty((items, grp), np.float32)
    part_o = np.empty((items, grp, d_v), np.float32)
    for it in numba.prange(items):  # one call per item: the parallel loop stays small to
        # compile (numba's parfor passes on the inlined body took seconds)
        _attend_item(np.int64(it), q, k, v, n_head_kv, mask, visible, counts, scale, softcap,
                     sinks, piece, out, additive, n_pieces, part_m, part_l, part_o)
    for t in range(n if n_pieces > 1 else 0):  # the pieces merged, on this thread
        for g in range(n_head_kv):
            base = (t * n_head_kv + g) * n_pieces
            for r in range(grp):
                mx = np.float32(-np.inf)
                for pc in range(n_pieces):
                    mx = max(mx, part_m[base + pc, r])
                total = np.float32(0.0)
                for c in range(d_v):
                    out[t, g * grp + r, c] = 0.0
                for pc in range(n_pieces):
                    if part_m[base + pc, r] == -np.inf:
                        continue
                    w = exp_f32(part_m[base + pc, r] - mx)
                    total += w * part_l[base + pc, r]
                    for c in range(d_v):
                        out[t, g * grp + r, c] += w * part_o[base + pc, r, c]
                inv = _normalizer(mx, total, sinks, g * grp + r)
                for c in range(d_v):
                    out[t, g * grp + r, c] *= inv
    if serial:
        threads_set(threads)


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"}, error_model="numpy")
def _attend_item(it, q, k, v, n_head_kv, mask, visible, counts, scale, softcap, sinks, piece,
                 out, additive, n_pieces, part_m, part_l, part_o):
    """`_attention_decode`'s work item `it`: (token, KV head, piece of cells)."""
    n_head, d_k = q.shape[1], q.shape[2]
    d_v = out.shape[2]
    grp = n_head // n_head_kv
    t = it // (n_head_kv * n_pieces)
    g = (it // n_pieces) % n_head_kv
    m0 = (it % n_pieces) * piece
    span = min(counts[t], m0 + piece) - m0
    if span <= 0:  # nothing visible (or fewer pieces for this token): skipped
        for r in range(grp):
            part_m[it, r] = -np.inf
            part_l[it, r] = 0.0
        return
    cells = visible[t, m0:m0 + span]
    s = np.empty((grp, span), np.float32)
    for r in range(grp):
        qo = (t * n_head + g * grp + r) * d_k
        ko = g * d_k
        for mb in range(0, span, 16):
            if r == 0:  # the next cells' K rows and these cells' V rows, ahead of use:
                # in a step of many sequences the cache is far outside the CPU's caches,
                # and a sequence's cells are interleaved with the others'
                for i in range(mb + 16, min(mb + 32, span)):
                    _kv_prefetch(k, cells[i], ko, d_k)
                for i in range(mb, min(mb + 16, span)):
                    _kv_prefetch(v, cells[i], g * d_v, d_v)
            if mb + 16 <= span:
                _scores16(q, qo, k, ko, cells, mb, d_k, s, r * span + mb)
            else:  # the last cells one at a time
                for i in range(mb, span):
                    acc = vzero()
                    for c in range(0, d_k, 16):
                        acc = vfma(vload(q, qo + c), _kv_vec(k, cells[i], ko + c), acc)
                    s[r, i] = vsum(acc)
        mx = np.float32(-np.inf)
        if additive or softcap > np.float32(0.0):
            for i in range(span):
                x = _softcapped(s[r, i], softcap) * scale
                if additive:
                    x += mask[t, cells[i]]
                s[r, i] = x
                mx = max(mx, x)
        else:
            mx = _scale_and_max(s, r * span, span, scale)
        total = np.float32(0.0)
        for i in range(span):
            e = exp_f32(s[r, i] - mx) if mx != -np.inf else np.float32(0.0)
            s[r, i] = e
            total += e
        part_m[it, r] = mx
        part_l[it, r] = total
    r = 0
    while r < grp:  # the p-weighted V rows, up to four query heads per pass over them
        if grp - r >= 3:
            nh = min(4, grp - r)
            _weighted_rows4(s, r, nh, span, v, cells, g * d_v, d_v, part_o,
                            (it * grp + r) * d_v)
            r += nh
        else:
            _weighted_rows(s, r, span, v, cells, g * d_v, d_v, part_o,
                           (it * grp + r) * d_v)
            r += 1
    if n_pieces == 1:  # the only piece: its rows are the result (as the merge gives them)
        for r in range(grp):
            inv = _normalizer(part_m[it, r], part_l[it, r], sinks, g * grp + r)
            for c in range(d_v):
                out[t, g * grp + r, c] = part_o[it, r, c] * inv


@numba.njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _normalizer(mx, total, sinks, h):
    """What head h's exp(score - mx)-weighted V sum is multiplied by: 1 / total, the sum of
    those weights, or with a sink logit (ggml_soft_max_add_sinks) the same as if the sink had
    been one more score of no value: the maximum becomes max(mx, sink) and exp(sink - max)
    joins the sum."""
    if sinks.size == 0:
        return np.float32(1.0) / total
    m = max(mx, sinks[h])
    rescale = exp_f32(mx - m)
    return rescale / (total * rescale + exp_f32(sinks[h] - m))


def _load(a, i, j, lut):
    """a[i, j] as float32: fp16 bit patterns (uint16) through `lut`, float32 as they are."""


@overload(_load, inline="always")
def _load_impl(a, i, j, lut):
    if isinstance(a.dtype, types.Integer):
        return lambda a, i, j, lut: lut[a[i, j]]
    return lambda a, i, j, lut: a[i, j]


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"}, error_model="numpy")
def _attention_rows(q, k, v, lut, mask, scale, softcap, sinks, out):
    # q (n, H, D) f32; k (n_kv, Hkv*D), v (n_kv, Hkv*Dv) f32 or fp16 bits; out (n, H, Dv)
    n, n_head, d_k = q.shape
    n_kv = mask.shape[1]
    d_v = out.shape[2]
    n_head_kv = k.shape[1] // d_k
    grp = n_head // n_head_kv
    s = np.empty((grp, n_kv), np.float32)
    row = np.empty(max(d_k, d_v), np.float32)
    for t in range(n):
        for g in range(n_head_kv):
            h0 = g * grp
            for j in range(n_kv):
                if mask[t, j] == -np.inf:
                    for r in range(grp):
                        s[r, j] = -np.inf
                    continue
                for c in range(d_k):
                    row[c] = _load(k, j, g * d_k + c, lut)
                for r in range(grp):
                    acc = np.float32(0.0)
                    for c in range(d_k):
                        acc += q[t, h0 + r, c] * row[c]
                    s[r, j] = _softcapped(acc, softcap) * scale + mask[t, j]
            for r in range(grp):
                mx = np.float32(-np.inf)
                for j in range(n_kv):
                    mx = max(mx, s[r, j])
                if sinks.size:
                    mx = max(mx, sinks[h0 + r])
                total = 0.0
                for j in range(n_kv):
                    e = exp_f32(s[r, j] - mx)
                    s[r, j] = e
                    total += np.float64(e)
                if sinks.size:
                    total += np.float64(exp_f32(sinks[h0 + r] - mx))
                inv = np.float32(1.0 / total)
                for j in range(n_kv):
                    s[r, j] *= inv
                for c in range(d_v):
                    out[t, h0 + r, c] = 0.0
            for j in range(n_kv):
                if mask[t, j] == -np.inf:
                    continue
                for c in range(d_v):
                    row[c] = _load(v, j, g * d_v + c, lut)
                for r in range(grp):
                    p = s[r, j]
                    for c in range(d_v):
                        out[t, h0 + r, c] += p * row[c]


@numba.njit(cache=True, nogil=True)
def _build_kq_mask(cell_pos, cell_seq, tok_pos, tok_seq, n_swa, out):
    n, n_kv = out.shape
    for t in range(n):
        p1 = tok_pos[t]
        s = tok_seq[t]
        for j in range(n_kv):
            p0 = cell_pos[j]
            visible = p0 >= 0 and cell_seq[j, s] and p0 <= p1
            if visible and n_swa > 0 and p1 - p0 >= n_swa:
                visible = False
            out[t, j] = 0.0 if visible else -np.inf


def build_kq_mask(cell_pos: np.ndarray, cell_seq: np.ndarray, tok_pos: np.ndarray,
                  tok_seq: np.ndarray, n_kv: int, n_swa: int = 0) -> np.ndarray:
    """float32 (n_tokens, n_kv): 0 where token t may attend cell j, -inf elsewhere.
    cell_pos (n_cells,) int32 (-1 = empty), cell_seq (n_cells, n_seq) bool, tok_pos/tok_seq (n,)."""
    out = np.empty((len(tok_pos), n_kv), np.float32)
    _build_kq_mask(cell_pos, cell_seq, np.ascontiguousarray(tok_pos, dtype=np.int64),
                   np.ascontiguousarray(tok_seq, dtype=np.int64), int(n_swa), out)
    return out
