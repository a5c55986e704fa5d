"""`CUDABackend`: the layers llama.cpp's `-ngl` offloads, run on one GPU.

It owns what its layers touch on its device (the `Backend` interface of inference/backend.py):

- weights: each matrix's GGUF blocks uploaded as they are (quantized; ggml-cuda keeps them so
  too), norms and biases as float32; a tensor asked for twice (a tied output matrix that is also
  the input embedding) is uploaded once;
- matrix products: up to `MAX_TOKENS` tokens (decoding) through the fused dequantize-dot kernel
  of each weight type (matvec.py, ggml's mul_mat_vec_q); more (a prompt) by dequantizing the
  weight to fp16 tiles and multiplying them with cuBLAS (ggml_cuda_op_mul_mat_cublas);
- mixture-of-experts products (`matmul_id`, ggml_mul_mat_id) as ggml-cuda's fallback does them
  (ggml_cuda_mul_mat_id without its fused kernels): the batch's (token, expert) pairs grouped
  per chosen expert, each group gathered, multiplied by that expert's matrix through `matmul`
  above and scattered back, so only the chosen experts' rows are read;
- RMS norm, RoPE, SwiGLU / GeGLU, the embedding lookup (elementwise.py, dequant.py);
- greedy sampling (`greedy_tokens`, sampling.py): a greedy sequence's token id is all that
  leaves the device, not its logits;
- the K and V rows of its layers (`DeviceKVStore`, written by kv.py's kernels) and attention over
  them: decoding through the kernel that builds the mask from the cells' positions
  (attention.py, ggml's flash_attn_ext_vec), prompts through GEMMs over the dequantized cells;
- `begin_batch`: the batch's token ids, positions, cells, and the cells' positions and sequences,
  uploaded once per micro-batch into buffers that keep their addresses, so that a decode step
  captured in a CUDA graph (graphs.py) reads the next step's inputs on replay.

Everything goes through a `runtime.DeviceRuntime` (CuPy on a GPU, numba's simulator in CI), so
CI runs this code as it is. Activations leave the device only through `to_host` and arrive
only through `take`: the model calls `take` once per device boundary per batch, and the
`crossings` counter here lets tests check that nothing else moves.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from ..backend import Backend, KQMask, QExperts, QWeight
from . import attention as attention_kernels
from .attention import CellMask, DeviceKV
from . import kv as kv_kernels
from .dequant import DEVICE_TYPES, UnsupportedDeviceTypeError, dequantize_rows
from .elementwise import GELU_TABLE, geglu, rms_norm, rope, swiglu, swiglu_oai
from .matvec import MAX_TOKENS, matvec
from .runtime import DeviceRuntime, array_device
from .sampling import greedy_tokens

# values of a prompt's dequantized fp16 weight tile at a time (128 MiB)
TILE_VALUES = 64 << 20
# attention scores of a prompt chunk at a time (128 MiB of float32)
SCORE_VALUES = 32 << 20


class DeviceWeight:
    """A weight matrix on the device as stored in the GGUF file: `rows` uint8 (n_out, row_bytes)
    device array, `type` (ggml name), `n_out`, `n_in`."""

    __slots__ = ("name", "type", "rows", "n_out", "n_in")

    def __init__(self, name, type_name, rows, n_out, n_in):
        self.name, self.type, self.rows = name, type_name, rows
        self.n_out, self.n_in = int(n_out), int(n_in)

    @classmethod
    def of(cls, host: QWeight, rows) -> "DeviceWeight":
        """The device copy of a host QWeight whose rows were uploaded as `rows`."""
        return cls(host.name, host.type, rows, host.n_out, host.n_in)

    @property
    def nbytes(self) -> int:
        return int(self.rows.nbytes)

    def __repr__(self):
        return f"DeviceWeight({self.name!r}, {self.type}, {self.n_out}x{self.n_in})"


class DeviceExperts:
    """A 3-D tensor of expert matrices on the device as stored in the GGUF file: `rows` uint8
    (n_expert, n_out, row_bytes) device array, `type`, `n_expert`, `n_out`, `n_in`."""

    __slots__ = ("name", "type", "rows", "n_expert", "n_out", "n_in")

    def __init__(self, name, type_name, rows, n_expert, n_out, n_in):
        self.name, self.type, self.rows = name, type_name, rows
        self.n_expert, self.n_out, self.n_in = int(n_expert), int(n_out), int(n_in)

    @classmethod
    def of(cls, host: QExperts, rows) -> "DeviceExperts":
        """The device copy of host QExperts whose rows were uploaded as `rows`."""
        return cls(host.name, host.type, rows, host.n_expert, host.n_out, host.n_in)

    @property
    def nbytes(self) -> int:
        return int(self.rows.nbytes)

    def expert(self, e: int) -> DeviceWeight:
        """Expert e's matrix (a view of its rows, no copy)."""
        return DeviceWeight(f"{self.name}[{e}]", self.type, self.rows[e], self.n_out, self.n_in)

    def __repr__(self):
        shape = f"{self.n_expert}x{self.n_out}x{self.n_in}"
        return f"DeviceExperts({self.name!r}, {self.type}, {shape})"


class DeviceKVStore:
    """The K or V rows of one layer for every cell, on the backend's device, in the cache's
    storage type (cpu.backend.HostKVStore's interface)."""

    def __init__(self, backend: "CUDABackend", type_name: str, n_ctx: int, n_head: int,
                 head_dim: int):
        self.backend, self.type = backend, type_name
        self.n_head, self.head_dim = n_head, head_dim
        self.row = n_head * head_dim
        dtype, width = kv_kernels.storage(type_name, self.row)
        self.data = backend.rt.zeros((n_ctx, width), dtype)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def write(self, cells: np.ndarray, x) -> None:
        """Rows of x (n, n_head, head_dim), on this device (or a host array: a K shift), into
        `cells`."""
        be = self.backend
        if not be.rt.owns(x):
            x = be.rt.upload(np.ascontiguousarray(x, dtype=np.float32))
        be.rt.op(kv_kernels.write_rows, self.type, x.reshape(len(cells), self.row),
                 be.batch_array(cells, "cells"), self.data, stream=be.rt.kernel_stream)

    def read(self, n: int) -> DeviceKV:
        """What `CUDABackend.attention` reads: every cell's bytes (it looks at the first n_kv
        itself, from the device's copy of n_kv)."""
        return DeviceKV(self.data.view(np.uint8), self.type, self.n_head, self.head_dim)

    def read_f32(self, n: int) -> np.ndarray:
        return self.read_cells(np.arange(n))

    def read_cells(self, cells: np.ndarray) -> np.ndarray:
        """float32 (len(cells), n_head, head_dim) on the host (for shifting K)."""
        be = self.backend
        out = be.kv_f32(self.read(0), be.rt.upload(np.asarray(cells, np.int64)), len(cells))
        return be.rt.download(out).reshape(len(cells), self.n_head, self.head_dim)


class _BatchBuffers:
    """The device copies of one micro-batch's inputs; allocated once, so their addresses stay.
    The token ids, positions, cells, first sequences and n_kv are one int64 array, uploaded
    with one copy from a host staging array of the same layout; the cells' positions and
    sequences are two more copies."""

    NAMES = ("tokens", "positions", "cells", "seq_first")

    def __init__(self, rt: DeviceRuntime, n_tokens: int, n_ctx: int, n_seq: int):
        self.host = np.zeros(len(self.NAMES) * n_tokens + 1, np.int64)
        self.inputs = rt.zeros(self.host.shape, np.int64)
        for i, name in enumerate(self.NAMES):
            setattr(self, name, self.inputs[i * n_tokens:(i + 1) * n_tokens])
        self.n_kv = self.inputs[-1:]
        self.cell_pos = rt.zeros(n_ctx, np.int32)
        self.cell_seq = rt.zeros((n_ctx, n_seq), np.bool_)
        self.shape = (n_tokens, n_ctx, n_seq)

    def upload(self, rt: DeviceRuntime, host: dict, n_kv: int, kv) -> None:
        cap = self.shape[0]
        for i, name in enumerate(self.NAMES):
            values = host[name]
            self.host[i * cap:i * cap + len(values)] = values
        self.host[-1] = n_kv
        rt.upload_into(self.inputs, self.host)
        rt.upload_into(self.cell_pos[:n_kv], kv.pos[:n_kv])
        rt.upload_into(self.cell_seq[:n_kv], kv.seq[:n_kv])


class CUDABackend(Backend):
    """The `Backend` of one GPU (see the module docstring)."""

    name = "cuda"
    samples_greedy = True

    def __init__(self, runtime: DeviceRuntime):
        self.rt = runtime
        self.device = runtime.index
        self.peers: dict[int, DeviceRuntime] = {runtime.index: runtime}  # the model's devices
        self.crossings: Counter = Counter()  # activations moved: "in" (take), "out" (to_host)
        self.weight_bytes = 0
        self.kv_bytes = 0
        self._weights: dict[str, DeviceWeight] = {}
        self._vectors: dict[str, object] = {}
        self._rope_factors: dict = {}
        self._row_ids = None  # 0, 1, ... on the device (dequantizing whole matrices)
        self._gelu = None
        self._no_sinks = None  # the attention kernel's "no sinks": an empty device array
        self._buffers: _BatchBuffers | None = None
        self._batch = None  # the ForwardContext whose inputs the buffers hold
        self._batch_host: dict[str, np.ndarray] = {}

    def __repr__(self):
        return f"CUDABackend(GPU {self.device})"

    # ---------------------------------------------------------------- weights and data

    def weight(self, tensor) -> DeviceWeight:
        """A 2-D GGUF tensor's blocks, uploaded as they are (once per tensor name)."""
        return self._blocks(tensor, QWeight, DeviceWeight)

    def experts(self, tensor) -> DeviceExperts:
        """A 3-D GGUF tensor of expert matrices, its blocks uploaded as they are (once)."""
        return self._blocks(tensor, QExperts, DeviceExperts)

    def _blocks(self, tensor, host_kind, device_kind):
        """The device copy of `tensor` as device_kind (DeviceWeight, DeviceExperts), made from
        host_kind's view of its blocks on first use."""
        w = self._weights.get(tensor.name)
        if w is None:
            if tensor.type not in DEVICE_TYPES:
                raise UnsupportedDeviceTypeError(tensor.type)
            host = host_kind.from_tensor(tensor)
            w = self._weights[tensor.name] = device_kind.of(host, self.rt.upload(host.rows))
            self.weight_bytes += w.nbytes
        return w

    def vector(self, tensor):
        v = self._vectors.get(tensor.name)
        if v is None:
            host = np.ascontiguousarray(tensor.dequantize(), dtype=np.float32).reshape(-1)
            v = self._vectors[tensor.name] = self.rt.upload(host)
            self.weight_bytes += int(v.nbytes)
        return v

    def kv_store(self, type_name: str, n_ctx: int, n_head: int, head_dim: int) -> DeviceKVStore:
        store = DeviceKVStore(self, type_name, n_ctx, n_head, head_dim)
        self.kv_bytes += store.nbytes
        return store

    @property
    def vram_bytes(self) -> int:
        """Device memory the model's weights and KV rows take here."""
        return self.weight_bytes + self.kv_bytes

    def begin_batch(self, ctx) -> None:
        """Uploads the micro-batch's inputs into the fixed buffers (see _BatchBuffers)."""
        kv, n = ctx.kv, ctx.n_tokens
        shape = (max(n, ctx.model.n_ubatch), kv.n_ctx, kv.n_seq_max)
        b = self._buffers
        if b is None or any(want > have for want, have in zip(shape, b.shape)):
            b = self._buffers = _BatchBuffers(self.rt, *shape)
        host = {"tokens": ctx.tokens, "positions": ctx.positions, "cells": ctx.cells,
                "seq_first": ctx.seq_first}
        b.upload(self.rt, host, ctx.n_kv, kv)
        self._batch, self._batch_host = ctx, host

    @property
    def batch_buffers(self) -> _BatchBuffers | None:
        """The device buffers of the batch inputs (graphs.py keeps graphs that read them)."""
        return self._buffers

    def batch_array(self, values: np.ndarray, name: str):
        """The device copy of the current batch's `name` input when `values` is that input
        (the same array object), else `values` uploaded."""
        if self._batch_host.get(name) is values:
            return getattr(self._buffers, name)[:len(values)]
        return self.rt.upload(np.ascontiguousarray(values, dtype=np.int64))

    def take(self, x):
        """An activation from any backend, here: one crossing when it was elsewhere."""
        if self.rt.owns(x):
            return x
        self.crossings["in"] += 1
        if array_device(x) is None:
            return self.rt.upload(np.ascontiguousarray(x, dtype=np.float32))
        return self.rt.copy_from(x, self.peers[array_device(x)])

    def to_host(self, x) -> np.ndarray:
        self.crossings["out"] += 1
        return self.rt.download(x)

    def close(self) -> None:
        self.weight_bytes = self.kv_bytes = 0
        self._weights.clear()
        self._vectors.clear()
        self._rope_factors.clear()
        self._buffers = self._batch = self._row_ids = self._gelu = self._no_sinks = None
        self._batch_host = {}
        self.rt.free_memory()

    # ---------------------------------------------------------------- kernels

    def _empty(self, shape, dtype=np.float32):
        return self.rt.empty(shape, dtype)

    def _ids(self, n: int):
        """0 .. n-1 as int64 on the device."""
        if self._row_ids is None or self._row_ids.shape[0] < n:
            self._row_ids = self.rt.upload(np.arange(max(n, 1024), dtype=np.int64))
        return self._row_ids[:n]

    def get_rows(self, w: DeviceWeight, ids: np.ndarray):
        """Rows `ids` of `w` as float32 (n, n_in) on the device (the embedding lookup)."""
        ids = np.asarray(ids)
        if ids.size and (ids.min() < 0 or ids.max() >= w.n_out):
            raise ValueError(f"{w}: row id out of range [0, {w.n_out})")
        out = self._empty((ids.size, w.n_in))
        self.rt.op(dequantize_rows, w.type, w.rows, self.batch_array(ids, "tokens"), out,
                   stream=self.rt.kernel_stream)
        return out

    def matmul(self, w: DeviceWeight, x):
        """x (n, n_in) float32 times wᵀ: (n, n_out)."""
        if len(x.shape) != 2 or x.shape[1] != w.n_in:
            raise ValueError(f"matmul {w}: input of shape {tuple(x.shape)}")
        n = x.shape[0]
        out = self._empty((n, w.n_out))
        if n <= MAX_TOKENS:
            self.rt.op(matvec, w.type, w.rows, x, out, stream=self.rt.kernel_stream)
        elif w.type == "F32":
            self.rt.gemm(x, w.rows.view(np.float32), out)
        else:
            x16 = self._empty(x.shape, np.float16)
            self.rt.op(self.rt.xp.copyto, x16, x, casting="same_kind")
            if w.type == "F16":
                self.rt.gemm(x16, w.rows.view(np.float16), out)
            else:
                self._gemm_tiles(w, x16, out)
        return out

    def matmul_id(self, w: DeviceExperts, x, ids: np.ndarray):
        """x (n, n_in), or (n, n_used, n_in), times the experts `ids` (int64 (n, n_used), on the
        host) chose: (n, n_used, n_out). The (token, slot) pairs are sorted by expert on the
        host and their order uploaded once; then per chosen expert its pairs' inputs are
        gathered, multiplied by its matrix (`matmul`: the fused kernel for a few pairs, fp16
        tiles and a GEMM for many) and scattered into their places."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 2:
            raise ValueError(f"matmul_id {w}: expert ids of shape {ids.shape}")
        n, n_used = ids.shape
        if tuple(x.shape) not in ((n, w.n_in), (n, n_used, w.n_in)):
            raise ValueError(f"matmul_id {w}: input of shape {tuple(x.shape)} for {n} tokens "
                             f"of {n_used} experts")
        flat = ids.reshape(-1)
        if flat.size and (flat.min() < 0 or flat.max() >= w.n_expert):
            raise ValueError(f"matmul_id {w}: expert id out of range [0, {w.n_expert})")
        order = np.argsort(flat, kind="stable")
        sources = order // n_used if len(x.shape) == 2 else order
        index = self.rt.upload(np.concatenate([order, sources]))  # one copy per product
        x_rows = x.reshape(-1, w.n_in)
        out = self._empty((n * n_used, w.n_out))
        bounds = np.cumsum(np.bincount(flat, minlength=w.n_expert))
        start = 0
        for e, end in enumerate(bounds):
            if end > start:
                picked = self._empty((end - start, w.n_in))
                self.rt.op(self.rt.xp.take, x_rows, index[flat.size + start:flat.size + end],
                           axis=0, out=picked)
                self.rt.op(_put_rows, self.matmul(w.expert(e), picked), index[start:end], out)
            start = end
        return out.reshape(n, n_used, w.n_out)

    def weighted_sum(self, x, weights: np.ndarray):
        """x (n, k, d) summed over k, each slice times its weight (float32 (n, k) on the host),
        added in the CPU's (and ggml's) order: (n, d)."""
        weights = self.rt.upload(np.ascontiguousarray(weights, dtype=np.float32))
        out = self._empty((x.shape[0], x.shape[2]))
        self.rt.op(_weighted_sum, x, weights, out)
        return out

    def _gemm_tiles(self, w: DeviceWeight, x16, out):
        """x16 · wᵀ through fp16 tiles of w, TILE_VALUES at a time."""
        rows = max(1, min(w.n_out, TILE_VALUES // w.n_in))
        tile = self._empty((rows, w.n_in), np.float16)
        ids = self._ids(w.n_out)
        for r0 in range(0, w.n_out, rows):
            m = min(rows, w.n_out - r0)
            self.rt.op(dequantize_rows, w.type, w.rows, ids[r0:r0 + m], tile[:m],
                       stream=self.rt.kernel_stream)
            if m == w.n_out:
                self.rt.gemm(x16, tile, out)
            else:
                part = self._empty((x16.shape[0], m))
                self.rt.gemm(x16, tile[:m], part)
                self.rt.op(self.rt.xp.copyto, out[:, r0:r0 + m], part)

    def greedy_tokens(self, logits):
        """Each row's greedy token, int32 (n,) on the device (sampling.py's kernel): what a
        greedy decode step downloads instead of the logits."""
        out = self._empty((logits.shape[0],), np.int32)
        self.rt.op(greedy_tokens, logits, out, stream=self.rt.kernel_stream)
        return out

    def rms_norm(self, x, w, eps: float):
        d = x.shape[-1]
        out = self._empty(x.shape)
        self.rt.op(rms_norm, x.reshape(-1, d), w, eps, out.reshape(-1, d),
                   stream=self.rt.kernel_stream)
        return out

    def rope(self, x, pos: np.ndarray, spec):
        """Rotates x (n, n_head, head_dim) in place for the batch's positions (the kernel
        builds the angles as the CPU's rope cache does)."""
        key = spec.key()
        factors = self._rope_factors.get(key)
        if factors is None:
            host = spec.freq_factors if spec.freq_factors is not None else \
                np.ones(spec.n_dims // 2, np.float32)
            factors = self._rope_factors[key] = self.rt.upload(host)
        self.rt.op(rope, x, self.batch_array(pos, "positions"), spec, factors,
                   stream=self.rt.kernel_stream)
        return x

    def attention(self, q, k, v, mask, scale: float, softcap: float = 0.0, sinks=None):
        """softmax(q·kᵀ·scale + mask)·v: over the cache (k, v as DeviceKVStore.read gives them,
        mask a KQMask), or over the batch's own K and V (float32 activations, a dense mask:
        embeddings without the cache). softcap > 0 soft-caps q·k first; sinks (a `vector`, one
        logit per head) join the softmax. (n, n_head * d_v)."""
        n, n_head, d_k = q.shape
        if not isinstance(k, DeviceKV):  # the batch's own K and V
            d_v = v.shape[2]
            out = self._empty((n, n_head, d_v))
            bias = self.rt.upload(np.ascontiguousarray(np.asarray(mask), dtype=np.float32))
            self.rt.op(_attention_scores, self.rt.xp, q, k.reshape(k.shape[0], -1),
                       v.reshape(v.shape[0], -1), bias, np.float32(scale), np.float32(softcap),
                       k.shape[1], out, sinks)
            return out.reshape(n, n_head * d_v)
        if not isinstance(mask, KQMask):
            raise TypeError("CUDABackend.attention over the cache takes a KQMask (the cells' "
                            "positions and sequences are on the device), not a dense mask")
        if mask.ctx is not self._batch:
            self.begin_batch(mask.ctx)
        out = self._empty((n, n_head, v.head_dim))
        b = self._buffers
        if n <= MAX_TOKENS:
            if sinks is None:
                if self._no_sinks is None:
                    self._no_sinks = self.rt.upload(np.zeros(0, np.float32))
                sinks = self._no_sinks
            cells = CellMask(b.cell_pos, b.cell_seq, b.positions[:n], b.seq_first[:n], mask.n_swa,
                             n_kv=b.n_kv)
            self.rt.op(attention_kernels.attention, q, k, v, cells, scale, out,
                       stream=self.rt.kernel_stream, softcap=softcap, sinks=sinks)
        else:
            self._attention_gemm(q, k, v, mask, scale, softcap, sinks, out)
        return out.reshape(n, n_head * v.head_dim)

    def kv_f32(self, kv: DeviceKV, ids, n: int):
        """Cells `ids` (device int64) of a K or V store as float32 (n, n_head * head_dim)."""
        out = self._empty((n, kv.n_head * kv.head_dim))
        if n:
            self.rt.op(dequantize_rows, attention_kernels.KV_TYPES[kv.type], kv.data, ids, out,
                       stream=self.rt.kernel_stream)
        return out

    def _attention_gemm(self, q, k: DeviceKV, v: DeviceKV, mask: KQMask, scale, softcap, sinks,
                        out):
        """A prompt's attention: K and V of cells [0, n_kv) dequantized to float32, then per
        chunk of query tokens scores = q·kᵀ (one batched GEMM per KV head group), the mask built
        from the cells' positions and sequences, softmax, and the GEMM with V (ggml's
        non-flash-attention path: mul_mat, soft_max_ext, mul_mat)."""
        n, n_head, d_k = q.shape
        n_kv, n_head_kv = mask.n_kv, k.n_head
        ids = self._ids(n_kv)
        kf, vf = self.kv_f32(k, ids, n_kv), self.kv_f32(v, ids, n_kv)
        b = self._buffers
        step = max(1, SCORE_VALUES // max(1, n_head * n_kv))
        for t0 in range(0, n, step):
            t1 = min(n, t0 + step)
            self.rt.op(_attention_chunk, self.rt.xp, q[t0:t1], kf, vf, b.cell_pos[:n_kv],
                       b.cell_seq[:n_kv], b.positions[t0:t1], b.seq_first[t0:t1], mask.n_swa,
                       np.float32(scale), np.float32(softcap), n_head_kv, out[t0:t1], sinks)

    def swiglu(self, gate, up):
        out = self._empty(gate.shape)
        self.rt.op(swiglu, gate, up, out, stream=self.rt.kernel_stream)
        return out

    def swiglu_oai(self, gate, up, alpha: float, limit: float):
        out = self._empty(gate.shape)
        self.rt.op(swiglu_oai, gate, up, alpha, limit, out, stream=self.rt.kernel_stream)
        return out

    def geglu(self, gate, up):
        if self._gelu is None:
            self._gelu = self.rt.upload(GELU_TABLE)
        out = self._empty(gate.shape)
        self.rt.op(geglu, gate, up, out, self._gelu, stream=self.rt.kernel_stream)
        return out

    def gelu(self, x):
        """gelu_tanh(x) through ggml's fp16 table, as the CPU (the GeGLU kernel times 1)."""
        flat = x.reshape(-1, x.shape[-1])
        ones = self._empty(flat.shape)
        self.rt.op(ones.fill, np.float32(1.0))
        return self.geglu(flat, ones).reshape(x.shape)

    def layer_norm(self, x, w, b, eps: float):
        """LayerNorm over the last axis times w plus b (None: no bias), the mean and variance
        summed in float64 as ggml's CPU op (and cpu.ops.layer_norm) sums them."""
        out = self._empty(x.shape)
        self.rt.op(_layer_norm, self.rt.xp, x, w, b, np.float32(eps), out)
        return out

    def add(self, a, b):
        out = self._empty(np.broadcast_shapes(tuple(a.shape), tuple(b.shape)))
        self.rt.op(self.rt.xp.add, a, b, out=out)
        return out

    def scale(self, x, s: float):
        out = self._empty(x.shape)
        self.rt.op(self.rt.xp.multiply, x, np.float32(s), out=out)
        return out


def _attention_chunk(xp, q, kf, vf, cell_pos, cell_seq, tok_pos, tok_seq, n_swa, scale,
                     softcap, n_head_kv, out, sinks=None):
    """Attention of the query tokens q (m, n_head, d_k) over float32 K and V of the cache's
    cells (n_kv, n_head_kv * d) into out (m, n_head, d_v), the mask built from the cells'
    positions and sequences (cpu.attention.build_kq_mask), with array module xp (CuPy, or numpy
    simulated)."""
    visible = (cell_pos[None, :] >= 0) & (cell_pos[None, :] <= tok_pos[:, None]) \
        & cell_seq[:, tok_seq].T
    if n_swa > 0:
        visible &= (tok_pos[:, None] - cell_pos[None, :]) < n_swa
    bias = xp.where(visible, np.float32(0), np.float32(-np.inf)).astype(np.float32)
    _attention_scores(xp, q, kf, vf, bias, scale, softcap, n_head_kv, out, sinks)


def _attention_scores(xp, q, kf, vf, bias, scale, softcap, n_head_kv, out, sinks=None):
    """softmax(softcap(q·kᵀ)·scale + bias)·v: q (m, n_head, d_k), kf (n_kv, n_head_kv * d_k),
    vf (n_kv, n_head_kv * d_v) float32, bias (m, n_kv) of 0 / -inf; one batched GEMM per KV
    head group for the scores and one for the values (ggml's mul_mat, soft_max_ext, mul_mat).
    sinks (n_head,) or None: each head's sink logit joins its rows' maximum and sum
    (ggml_soft_max_add_sinks)."""
    m, n_head, d_k = q.shape
    n_kv = kf.shape[0]
    d_v = vf.shape[1] // n_head_kv
    grp = n_head // n_head_kv
    qh = q.reshape(m, n_head_kv, grp, d_k).transpose(1, 2, 0, 3).reshape(n_head_kv, grp * m, d_k)
    kh = kf.reshape(n_kv, n_head_kv, d_k).transpose(1, 2, 0)
    s = xp.matmul(qh, kh).reshape(n_head_kv, grp, m, n_kv)
    if softcap > 0:
        s *= np.float32(1.0) / softcap
        xp.tanh(s, out=s)
        s *= softcap
    s *= scale
    s += bias
    if sinks is None:
        s -= s.max(axis=-1, keepdims=True)
        xp.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)
    else:
        sink = sinks.reshape(n_head_kv, grp, 1, 1)
        mx = xp.maximum(s.max(axis=-1, keepdims=True), sink)
        s -= mx
        xp.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True) + xp.exp(sink - mx)
    vh = vf.reshape(n_kv, n_head_kv, d_v).transpose(1, 0, 2)
    o = xp.matmul(s.reshape(n_head_kv, grp * m, n_kv), vh)
    out[...] = o.reshape(n_head_kv, grp, m, d_v).transpose(2, 0, 1, 3).reshape(m, n_head, d_v)


def _put_rows(rows, index, out):
    """out[index] = rows (a group of matmul_id's products back in their places)."""
    out[index] = rows


def _weighted_sum(x, weights, out):
    out[...] = x[:, 0] * weights[:, 0:1]
    for j in range(1, x.shape[1]):
        out += x[:, j] * weights[:, j:j + 1]


def _layer_norm(xp, x, w, b, eps, out):
    d = x.shape[-1]
    mean = (x.astype(np.float64).sum(axis=-1, keepdims=True) / d).astype(np.float32)
    c = x - mean
    var = ((c.astype(np.float64) ** 2).sum(axis=-1, keepdims=True) / d).astype(np.float32)
    out[...] = c * (np.float32(1.0) / xp.sqrt(var + eps)) * w
    if b is not None:
        out += b


__all__ = ["CUDABackend", "DeviceExperts", "DeviceKVStore", "DeviceWeight"]
