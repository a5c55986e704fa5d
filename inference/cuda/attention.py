"""Softmax attention over the device KV cache (f32, f16 or q8_0 rows), for decoding.

    attention(q, DeviceKV(k_rows, "f16", n_head_kv, d_k), DeviceKV(v_rows, "f16", n_head_kv, d_v),
              CellMask(cell_pos, cell_seq, tok_pos, tok_seq, n_swa), scale, out)

computes what `cpu.attention.attention` computes with the mask of
`cpu.attention.build_kq_mask`: token t's query head h attends the cells j < n_kv that hold a
position of the token's sequence not after its own (and, with a sliding window n_swa > 0, less
than n_swa before it), through KV head h // (n_head / n_head_kv). The mask is built in the
kernel from the cells' positions and sequences, so nothing of size n_tok x n_kv is uploaded per
step. The number of cells n_kv is read from device memory, not passed as a launch argument, so
that a CUDA graph captured once serves every later step (llama.cpp updates its graphs' kernel
parameters instead). softcap > 0 soft-caps each score q·k to tanh(q·k / softcap) · softcap
before the scale (Gemma 2's attention logit soft-capping, as ggml's flash-attention kernels take
it). sinks (gpt-oss): one logit per query head that joins the softmax's running maximum and sum
once the cells are done (ggml's flash attention adds them the same way), weighing no value; an
empty array when the model has none.

One thread block per (query head, token), as ggml's flash_attn_ext_vec (ggml-cuda/fattn-vec.cuh)
does for decoding: the cells go by in tiles of one cell per thread. A thread computes its
cell's score (decoding K 16 values at a time with the weight decoders of dequant.py), the
block finds the tile's maximum and the online-softmax rescale (flash attention's running max
and sum), then each thread accumulates the probability-weighted V values of its own output
dimensions (neighbouring threads read neighbouring V values). Masked cells are skipped, as the
CPU kernels skip them. float32 throughout: equal to the CPU up to float32 rounding.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import cuda, types

from .dequant import CHUNK, DEVICE_TYPES
from .kv import Q8_0_BLOCK_BYTES, QK8_0
from .device import (NEG_INF, ONE, SIMULATED, ZERO, bits_f32, block_max, block_sum, device_function,
                     half_at, i8_at, u32_at)

# the KV cache's storage types (kv_cache.CACHE_TYPES), as ggml type names
KV_TYPES = {"f32": "F32", "f16": "F16", "q8_0": "Q8_0"}
# cells per tile = threads per block (the simulator runs threads as Python threads: one warp)
TILE = 32 if SIMULATED else 128
MAX_HEAD_DIM = 512
_SLOTS = MAX_HEAD_DIM // TILE  # output dimensions per thread, at most


@device_function
def f32_value(a, row, col):
    return bits_f32(u32_at(a, row, 4 * col))


@device_function
def f16_value(a, row, col):
    return half_at(a, row, 2 * col)


@device_function
def q8_0_value(a, row, col):
    """Value `col` of a Q8_0 row: q * d of its block (cpu.ops.dequantize_q8_0_rows)."""
    offset = Q8_0_BLOCK_BYTES * (col // QK8_0)
    return np.float32(i8_at(a, row, offset + 2 + col % QK8_0)) * half_at(a, row, offset)


_VALUE_READERS = {"f32": f32_value, "f16": f16_value, "q8_0": q8_0_value}


@device_function
def visible(cell_pos, cell_seq, j, pos, seq, n_swa):
    """May a token at `pos` of sequence `seq` attend cell j (cpu.attention.build_kq_mask)?"""
    p0 = cell_pos[j]
    if p0 < 0 or not cell_seq[j, seq] or p0 > pos:
        return False
    return n_swa <= 0 or pos - p0 < n_swa


def _make_attention_kernel(k_type: str, v_type: str):
    k_dt = DEVICE_TYPES[KV_TYPES[k_type]]
    k_decoder, k_block_bytes, k_cpb = k_dt.decoder, k_dt.block_bytes, k_dt.chunks_per_block
    v_value = _VALUE_READERS[v_type]

    @cuda.jit
    def attention_kernel(q, k, v, n_head_kv, cell_pos, cell_seq, tok_pos, tok_seq, n_swa,
                         n_kv_buf, scale, softcap, sinks, out):
        q_row = cuda.shared.array(MAX_HEAD_DIM, np.float32)
        p = cuda.shared.array(TILE, np.float32)
        scratch = cuda.shared.array(32, np.float32)
        h = cuda.blockIdx.x
        t = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        n_head, d_k = q.shape[1], q.shape[2]
        d_v = out.shape[2]
        g = h // (n_head // n_head_kv)
        n_kv = n_kv_buf[0]
        for c in range(tid, d_k, TILE):
            q_row[c] = q[t, h, c]
        cuda.syncthreads()
        pos = tok_pos[t]
        seq = tok_seq[t]
        vals = cuda.local.array(CHUNK, types.float32)
        acc = cuda.local.array(_SLOTS, types.float32)
        for i in range(_SLOTS):
            acc[i] = ZERO
        m = NEG_INF  # running maximum and sum of exp(score - m), the same in every thread
        total = ZERO
        first_chunk = g * d_k // CHUNK
        for j0 in range(0, n_kv, TILE):
            j = j0 + tid
            s = NEG_INF
            if j < n_kv and visible(cell_pos, cell_seq, j, pos, seq, n_swa):
                dot = ZERO
                for kc in range(d_k // CHUNK):
                    ci = first_chunk + kc
                    k_decoder(k, j, (ci // k_cpb) * k_block_bytes, ci % k_cpb, vals)
                    for e in range(CHUNK):
                        dot += q_row[CHUNK * kc + e] * vals[e]
                if softcap > ZERO:
                    dot = math.tanh(dot * (ONE / softcap)) * softcap
                s = dot * scale
            m_new = max(m, block_max(s, scratch))
            if m_new == NEG_INF:  # nothing visible yet (the same in every thread)
                continue
            weight = math.exp(s - m_new) if s != NEG_INF else ZERO
            rescale = math.exp(m - m_new) if m != NEG_INF else ZERO
            p[tid] = weight
            total = total * rescale + block_sum(weight, scratch)  # its barrier publishes p
            m = m_new
            for i in range(_SLOTS):
                acc[i] *= rescale
            for jj in range(min(TILE, n_kv - j0)):
                pj = p[jj]
                if pj != ZERO:
                    for i in range(_SLOTS):
                        c = tid + i * TILE
                        if c < d_v:
                            acc[i] += pj * v_value(v, j0 + jj, g * d_v + c)
            cuda.syncthreads()  # p is rewritten by the next tile
        if sinks.shape[0] > 0:  # the sink as one more score of no value
            m_new = max(m, sinks[h])
            rescale = math.exp(m - m_new) if m != NEG_INF else ZERO
            total = total * rescale + math.exp(sinks[h] - m_new)
            for i in range(_SLOTS):
                acc[i] *= rescale
        for i in range(_SLOTS):
            c = tid + i * TILE
            if c < d_v:
                out[t, h, c] = acc[i] / total

    return attention_kernel


_attention_kernels: dict[tuple[str, str], object] = {}


def attention_kernel(k_type: str, v_type: str):
    key = (k_type, v_type)
    kernel = _attention_kernels.get(key)
    if kernel is None:
        for name in key:
            if name not in KV_TYPES:
                raise ValueError(f"attention: KV cache type {name!r} is not one of "
                                 f"{', '.join(KV_TYPES)}")
        kernel = _attention_kernels[key] = _make_attention_kernel(k_type, v_type)
    return kernel


def kv_row_bytes(cache_type: str, n_values: int) -> int:
    """Bytes of one cell's K or V row of `n_values` values in a cache of `cache_type`."""
    dt = DEVICE_TYPES[KV_TYPES[cache_type]]
    return dt.row_bytes(n_values) if n_values % dt.block_values == 0 else -1


class DeviceKV:
    """One layer's K or V rows as attention reads them: the cache's bytes, uint8 (n_cells,
    row_bytes), of storage type `type` ('f32', 'f16', 'q8_0'), n_head heads of head_dim values
    per cell."""

    __slots__ = ("data", "type", "n_head", "head_dim")

    def __init__(self, data, type_name, n_head, head_dim):
        self.data, self.type, self.n_head, self.head_dim = data, type_name, n_head, head_dim


@dataclass(frozen=True)
class CellMask:
    """What the kernel builds each token's mask from (cpu.attention.build_kq_mask's inputs, as
    device arrays): cell_pos int32 (n_cells,) (-1 = empty), cell_seq bool (n_cells, n_seq);
    tok_pos, tok_seq integer (n_tok,); n_swa: the sliding window (0: none); n_kv: the cells to
    look at, an int (None: all), or an int32 device array of one value (then at most n_cells,
    not checked here: it stays on the device, so a captured CUDA graph reads each step's)."""
    cell_pos: object
    cell_seq: object
    tok_pos: object
    tok_seq: object
    n_swa: int = 0
    n_kv: object = None


def attention(q, k: DeviceKV, v: DeviceKV, mask: CellMask, scale: float, out, stream=0,
              softcap: float = 0.0, sinks=None):
    """softmax(q·kᵀ·scale + mask)·v over the mask's cells [0, n_kv) into out.

    q: float32 (n_tok, n_head, d_k); k, v: the cache's rows (DeviceKV; on the CPU's cache a
    numpy view `.view(np.uint8)` of its arrays), both of n_head_kv heads; out: float32 (n_tok,
    n_head, d_v), written; sinks: float32 (n_head,) sink logits, or none (an empty array).
    Returns out.
    """
    n_tok, n_head, d_k = q.shape
    d_v = out.shape[2]
    n_head_kv = k.n_head
    cell_pos, cell_seq, tok_pos, tok_seq = mask.cell_pos, mask.cell_seq, mask.tok_pos, mask.tok_seq
    n_kv, n_kv_buf = mask.n_kv, None
    if n_kv is not None and not isinstance(n_kv, (int, np.integer)):
        n_kv_buf, n_kv = n_kv, 0
    n_kv = int(cell_pos.shape[0] if n_kv is None else n_kv)
    if q.dtype != np.float32 or out.dtype != np.float32:
        raise ValueError(f"attention: q and out must be float32, got {q.dtype}, {out.dtype}")
    if v.n_head != n_head_kv:
        raise ValueError(f"attention: K has {n_head_kv} heads, V {v.n_head}")
    if n_head_kv <= 0 or n_head % n_head_kv:
        raise ValueError(f"attention: {n_head} query heads over {n_head_kv} KV heads")
    if d_k % CHUNK or d_k > MAX_HEAD_DIM or d_v > MAX_HEAD_DIM:
        raise ValueError(f"attention: head sizes {d_k}/{d_v}: K's must be a multiple of {CHUNK}, "
                         f"both at most {MAX_HEAD_DIM}")
    for label, rows, d in (("k", k, d_k), ("v", v, d_v)):
        a, type_name = rows.data, rows.type
        row_bytes = kv_row_bytes(type_name, n_head_kv * d) if type_name in KV_TYPES else None
        if a.dtype != np.uint8 or len(a.shape) != 2 or a.shape[1] != row_bytes \
                or a.shape[0] < n_kv:
            raise ValueError(f"attention: {label} must be uint8 rows of {row_bytes} bytes "
                             f"({type_name} x {n_head_kv * d}) for {n_kv} cells, "
                             f"got {a.dtype} {tuple(a.shape)}")
    if tuple(out.shape[:2]) != (n_tok, n_head) or tuple(tok_pos.shape) != (n_tok,) \
            or tuple(tok_seq.shape) != (n_tok,) or n_kv > cell_seq.shape[0]:
        raise ValueError(f"attention: q {tuple(q.shape)}, out {tuple(out.shape)}, "
                         f"{tuple(tok_pos.shape)} token positions, {n_kv} cells")
    if sinks is None:  # the backend passes its own empty device array instead (a CUDA graph
        sinks = np.zeros(0, np.float32)  # must not capture a copy from the host)
    elif tuple(sinks.shape) not in ((0,), (n_head,)) or sinks.dtype != np.float32:
        raise ValueError(f"attention: sinks must be float32 ({n_head},) or empty, got "
                         f"{sinks.dtype} {tuple(sinks.shape)}")
    if n_kv_buf is None:
        if not n_kv:
            return out
        n_kv_buf = np.array([n_kv], np.int32)
    if n_tok:
        attention_kernel(k.type, v.type)[(n_head, n_tok), TILE, stream](
            q, k.data, v.data, n_head_kv, cell_pos, cell_seq, tok_pos, tok_seq, int(mask.n_swa),
            n_kv_buf, np.float32(scale), np.float32(softcap), sinks, out)
    return out

