"""The backend seam: every kernel the layer loop runs goes through one of these methods.

`Backend` is the interface. A backend owns what its layers touch on its device: it prepares
weights once (`weight` for matrices, `vector` for norms and biases), allocates the K and V rows of
its layers (`kv_store`; the KVCache keeps only cells and positions), and computes on its own
arrays. The model asks for a backend per layer (`Model.layer_backends`) and moves activations
between backends with `take`, so hidden states cross a device boundary once per boundary per
batch and another backend (a GPU's, for llama.cpp's `-ngl`) can run some layers without the
architecture code changing.

`CPUBackend` runs on numpy/numba: quantized matrix products through `llamatui.inference.matmul`
(K-quant and legacy kernels working on the GGUF bytes in place), the rest through `ops`.

Mixture-of-experts layers add three methods: `experts` prepares a 3-D tensor of expert matrices,
`matmul_id` multiplies each token by the experts its router chose (ggml_mul_mat_id: only their
rows are read), and `weighted_sum` adds the experts' outputs with the router's weights.
"""
from __future__ import annotations

import ctypes
import sys
from abc import ABC, abstractmethod

import numba
import numpy as np

from . import ops
from .catalog import GGML_TYPES
from .gguf import release_pages
from .kv_cache import HostKVStore
from .matmul import embedding_rows, matmul, matmul_id, packed_product, packed_weight
from .matmul_packed import fuse


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
_heap_kept = False


def keep_freed_memory_in_heap() -> None:
    """Tells glibc's malloc to serve large arrays from its heap and keep freed memory there.

    By default each activation array over ~128 KiB is a fresh mmap that is unmapped when freed, so
    every layer page-faults its buffers in again: about 10 % of a 512-token prompt here. With
    this they are reused; peak RSS is unchanged (up to 64 MiB freed after a prompt stays with
    the process, as llama.cpp's compute buffers do). A no-op off glibc."""
    global _heap_kept
    if _heap_kept or not sys.platform.startswith("linux"):
        return
    _heap_kept = True
    try:
        libc = ctypes.CDLL("libc.so.6")
        # activations stay in the heap; big long-lived arrays (a KV cache) still get their own
        # mapping, returned to the system when freed
        libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)
        libc.mallopt(_M_TRIM_THRESHOLD, 64 << 20)
    except (OSError, AttributeError):  # musl and others: no mallopt
        pass


# at import, before a model's tokenizer fills the heap with small objects: set later, it helps less
keep_freed_memory_in_heap()


class QWeight:
    """A weight matrix as stored in the GGUF file: `type` (ggml name), `rows` (uint8, one row of
    blocks per output: (n_out, row_bytes), zero-copy), `n_out`, `n_in`."""

    __slots__ = ("name", "type", "rows", "n_out", "n_in", "packed", "fused")

    def __init__(self, name: str, type_name: str, rows: np.ndarray, n_out: int, n_in: int):
        self.name, self.type, self.rows = name, type_name, rows
        self.n_out, self.n_in = int(n_out), int(n_in)
        # the CPU's interleaved copy for matmul (matmul.packed_weight), made at the first product
        # (a tensor only looked up, as an untied token embedding, is never copied); False: none
        self.packed = None
        # on the first of matrices multiplied together (CPUBackend.matmul_many): (the matrices,
        # their packed copies as one), made at their first product; False: they cannot be
        self.fused = None

    @classmethod
    def from_tensor(cls, tensor) -> "QWeight":
        shape = tuple(tensor.shape)
        if len(shape) != 2:
            raise ValueError(f"{tensor.name}: a weight matrix needs 2 dimensions, has {shape}")
        n_out, n_in = shape
        row_bytes = GGML_TYPES[tensor.type].row_bytes(n_in)
        rows = np.asarray(tensor.data).view(np.uint8).reshape(n_out, row_bytes)
        return cls(tensor.name, tensor.type, rows, n_out, n_in)

    def __repr__(self):
        return f"QWeight({self.name!r}, {self.type}, {self.n_out}x{self.n_in})"


class QExperts:
    """A 3-D tensor of expert matrices as stored in the GGUF file (ffn_up_exps, say): `type`,
    `rows` (uint8 (n_expert, n_out, row_bytes), zero-copy), `n_expert`, `n_out`, `n_in`."""

    __slots__ = ("name", "type", "rows", "n_expert", "n_out", "n_in")

    def __init__(self, name: str, type_name: str, rows: np.ndarray, n_expert: int, n_out: int,
                 n_in: int):
        self.name, self.type, self.rows = name, type_name, rows
        self.n_expert, self.n_out, self.n_in = int(n_expert), int(n_out), int(n_in)

    @classmethod
    def from_tensor(cls, tensor) -> "QExperts":
        shape = tuple(tensor.shape)
        if len(shape) != 3:
            raise ValueError(f"{tensor.name}: expert matrices need 3 dimensions, has {shape}")
        n_expert, n_out, n_in = shape
        row_bytes = GGML_TYPES[tensor.type].row_bytes(n_in)
        rows = np.asarray(tensor.data).view(np.uint8).reshape(n_expert, n_out, row_bytes)
        return cls(tensor.name, tensor.type, rows, n_expert, n_out, n_in)

    def __repr__(self):
        return f"QExperts({self.name!r}, {self.type}, {self.n_expert}x{self.n_out}x{self.n_in})"


class KQMask:
    """The KQ mask of one micro-batch for one window size, as `Backend.attention` takes it:
    `dense()` is llama.cpp's (n_tokens, n_kv) mask of 0 / -inf (built once per batch and window,
    for the CPU); a device backend builds the same mask from what it uploaded in `begin_batch`
    (the cells' positions and sequences, the tokens' positions and sequences), so no mask of
    n_tokens x n_kv crosses to it. `ctx` is the batch's ForwardContext."""

    __slots__ = ("ctx", "n_swa")

    def __init__(self, ctx, n_swa: int):
        self.ctx, self.n_swa = ctx, int(n_swa)

    @property
    def n_kv(self) -> int:
        return self.ctx.n_kv

    def dense(self) -> np.ndarray:
        return self.ctx.mask(self.n_swa)

    def cells(self) -> tuple[np.ndarray, np.ndarray]:
        """Each token's visible cells, by position (ForwardContext.visible_cells)."""
        return self.ctx.visible_cells(self.n_swa)

    def sampled(self) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """The rows whose logits are sampled and their visible cells, by position."""
        return self.ctx.sampled_cells(self.n_swa)

    def __array__(self, dtype=None, copy=None):
        m = self.dense()
        return m if dtype is None else m.astype(dtype, copy=False)


class Backend(ABC):
    """What a device must do to run layers. Arrays are the backend's own (numpy here, device
    arrays on a GPU); `take` brings an activation from another backend, `to_host` gives numpy."""

    name = ""
    device: int | None = None  # the GPU it runs on, None for the host

    def begin_batch(self, ctx) -> None:
        """Called once per micro-batch before its layers run (ctx: the ForwardContext): a device
        backend uploads the batch's token ids, positions, cells and the cells' positions and
        sequences here, once, rather than with every layer."""

    def close(self) -> None:
        """Releases what the backend holds on its device."""

    @abstractmethod
    def weight(self, tensor):
        """A 2-D GGUF tensor prepared for `matmul` / `get_rows` (raw quantized blocks)."""

    @abstractmethod
    def experts(self, tensor):
        """A 3-D GGUF tensor of expert matrices (n_expert, n_out, n_in) prepared for
        `matmul_id`."""

    @abstractmethod
    def vector(self, tensor):
        """A 1-D tensor (norm weight, bias) as float32."""

    @abstractmethod
    def kv_store(self, type_name: str, n_ctx: int, n_head: int, head_dim: int):
        """The K or V rows of one layer for n_ctx cells, kept on this device: an object with
        `nbytes`, `write(cells, x)`, `read(n)` (what `attention` takes), `read_f32(n)` and
        `read_cells(cells)` (float32, for shifting K), like kv_cache.HostKVStore."""

    @abstractmethod
    def take(self, x):
        """An activation array from any backend, here."""

    @abstractmethod
    def to_host(self, x) -> np.ndarray:
        """One of this backend's arrays as a numpy array."""

    @abstractmethod
    def get_rows(self, w, ids: np.ndarray):
        """Rows `ids` of `w`, float32 (n, n_in) (the token embedding lookup)."""

    @abstractmethod
    def matmul(self, w, x):
        """x (n, n_in) float32 times wᵀ: (n, n_out)."""

    def matmul_many(self, ws, x) -> list:
        """x times each of several matrices that read it (Q, K and V; gate and up): their
        products as `matmul` gives them, which a backend may compute as one."""
        return [self.matmul(w, x) for w in ws]

    @abstractmethod
    def matmul_id(self, w, x, ids: np.ndarray):
        """ggml_mul_mat_id: each token times the matrices of the experts chosen for it. ids:
        int64 (n, n_used) on the host; x (n, n_in), one input for all of a token's experts, or
        (n, n_used, n_in); result (n, n_used, n_out). Reads only the chosen experts."""

    @abstractmethod
    def weighted_sum(self, x, weights: np.ndarray):
        """x (n, k, d) summed over k, each slice times its weight: weights float32 (n, k) on the
        host; result (n, d). (build_moe_ffn's ggml_mul by the expert weights, then its adds.)"""

    @abstractmethod
    def rms_norm(self, x, w, eps: float):
        """RMS norm over the last axis, times `w`."""

    @abstractmethod
    def layer_norm(self, x, w, b, eps: float):
        """LayerNorm over the last axis, times `w`, plus `b` (None: no bias): BERT's norms."""

    @abstractmethod
    def rope(self, x, pos: np.ndarray, spec: ops.RopeSpec):
        """x (n, n_head, head_dim) rotated for positions `pos` (may rotate in place)."""

    @abstractmethod
    def attention(self, q, k, v, mask, scale: float, softcap: float = 0.0):
        """softmax(q·kᵀ·scale + mask)·v with grouped KV heads, k and v as this backend's
        kv_store.read gives them, or as the batch's own float32 K and V (embeddings attend
        without the cache), mask a KQMask (or its dense array): (n, n_head * head_dim_v).
        softcap > 0: q·k becomes tanh(q·k / softcap) · softcap first (Gemma 2's attention
        logit soft-capping)."""

    @abstractmethod
    def swiglu(self, gate, up):
        """silu(gate) * up."""

    @abstractmethod
    def geglu(self, gate, up):
        """gelu_tanh(gate) * up (ggml's fp16-table GELU)."""

    @abstractmethod
    def gelu(self, x):
        """gelu_tanh(x) (ggml's fp16-table GELU): BERT's FFN activation."""

    @abstractmethod
    def add(self, a, b):
        """a + b (broadcasting a bias over rows)."""

    @abstractmethod
    def scale(self, x, s: float):
        """x * s."""


class CPUBackend(Backend):
    """numpy/numba kernels on the host."""

    name = "cpu"

    def __init__(self, n_threads: int | None = None):
        if n_threads is not None:
            numba.set_num_threads(max(1, min(int(n_threads), numba.config.NUMBA_NUM_THREADS)))
        self._rope_cache: dict = {}

    # ---------------------------------------------------------------- weights and data

    def weight(self, tensor) -> QWeight:
        """A 2-D GGUF tensor prepared for `matmul` / `get_rows` (no copy on the CPU)."""
        return QWeight.from_tensor(tensor)

    def experts(self, tensor) -> QExperts:
        """A 3-D GGUF tensor of expert matrices for `matmul_id` (no copy on the CPU)."""
        return QExperts.from_tensor(tensor)

    def vector(self, tensor) -> np.ndarray:
        """A 1-D tensor (norm weight, bias) as float32."""
        return np.ascontiguousarray(tensor.dequantize(), dtype=np.float32).reshape(-1)

    def kv_store(self, type_name: str, n_ctx: int, n_head: int, head_dim: int) -> HostKVStore:
        return HostKVStore(type_name, n_ctx, n_head, head_dim)

    def take(self, x) -> np.ndarray:
        """An activation array from any backend, here."""
        return np.asarray(x, dtype=np.float32)

    def to_host(self, x) -> np.ndarray:
        """One of this backend's arrays as a numpy array."""
        return np.asarray(x)

    # ---------------------------------------------------------------- kernels

    def get_rows(self, w: QWeight, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` of `w`, float32 (n, n_in) (the token embedding lookup)."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= w.n_out):
            raise ValueError(f"{w}: row id out of range [0, {w.n_out})")
        return embedding_rows(w.type, w.rows, ids)

    def matmul(self, w: QWeight, x: np.ndarray) -> np.ndarray:
        """x (n, n_in) float32 times wᵀ: (n, n_out)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != w.n_in:
            raise ValueError(f"matmul {w}: input of shape {x.shape}")
        if w.packed is None:
            # read once to pack, chunk by chunk: then only the packed copy stays resident
            w.packed = packed_weight(w.type, w.rows, release=release_pages) or False
        return matmul(w.type, w.rows, x, packed=w.packed or None)

    def matmul_many(self, ws, x: np.ndarray) -> list[np.ndarray]:
        """x (n, n_in) times each of `ws`: one product where their packed copies could be fused
        (same format and input size: matmul_packed.fuse), so that a step launches the threads
        and quantizes x once instead of once per matrix (on SmolLM2 7 products a layer become
        4); else one product each. Each result is its own C-contiguous array either way."""
        ws = tuple(ws)
        fused = ws[0].fused
        if fused is None:
            fused = ws[0].fused = self._fuse(ws)
        if fused and fused[0] == ws:
            x = np.ascontiguousarray(x, dtype=np.float32)
            if x.ndim != 2 or x.shape[1] != ws[0].n_in:
                raise ValueError(f"matmul {ws[0]}: input of shape {x.shape}")
            outs = packed_product(fused[1], x)
            if outs is not None:
                return outs
        return [self.matmul(w, x) for w in ws]

    def _fuse(self, ws: tuple) -> tuple | bool:
        """(ws, their packed copies as one), each w.packed becoming a view of it; False when
        they are not all packed of one format and input size."""
        for w in ws:
            if w.packed is None:
                w.packed = packed_weight(w.type, w.rows, release=release_pages) or False
        if len(ws) < 2 or not all(w.packed for w in ws) \
                or len({(w.type, w.n_in) for w in ws}) > 1:
            return False
        whole, parts = fuse([w.packed for w in ws])
        for w, part in zip(ws, parts):
            w.packed = part
        return ws, whole

    def matmul_id(self, w: QExperts, x: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """x (n, n_in) or (n, n_used, n_in) times the experts `ids` (n, n_used) chose:
        (n, n_used, n_out)."""
        if x.shape[-1] != w.n_in:
            raise ValueError(f"matmul_id {w}: input of shape {x.shape}")
        return matmul_id(w.type, w.rows, x, ids)

    def weighted_sum(self, x: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """x (n, k, d) summed over k times weights (n, k): (n, d), added in ggml's order."""
        weights = np.asarray(weights, dtype=np.float32)[:, :, None]
        out = x[:, 0] * weights[:, 0]
        for j in range(1, x.shape[1]):
            out += x[:, j] * weights[:, j]
        return out

    def rms_norm(self, x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        """RMS norm over the last axis, times `w`."""
        return ops.rms_norm(x, w, eps)

    def layer_norm(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                   eps: float) -> np.ndarray:
        return ops.layer_norm(x, w, b, eps)

    def rope(self, x: np.ndarray, pos: np.ndarray, spec: ops.RopeSpec) -> np.ndarray:
        """x (n, n_head, head_dim) rotated for positions `pos`; may rotate x in place."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        key = (spec.key(), np.asarray(pos).tobytes())
        tables = self._rope_cache.get(key)
        if tables is None:
            if len(self._rope_cache) > 8:
                self._rope_cache.clear()
            tables = self._rope_cache[key] = spec.tables(pos)
        return ops.rope_inplace(x, tables[0], tables[1], spec.n_dims, spec.neox)

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask,
                  scale: float, softcap: float = 0.0) -> np.ndarray:
        """softmax(q·kᵀ·scale + mask)·v with grouped KV heads: (n, n_head * head_dim_v).
        k and v come from the cache (float32, or uint16 fp16 bit patterns) or from the batch
        itself (float32)."""
        q = np.asarray(q, dtype=np.float32)
        if not isinstance(mask, KQMask):
            return ops.attention(q, k, v, mask, scale, softcap)
        if len(q) <= ops.ATTN_FUSED_MAX_TOKENS:
            return ops.attention(q, k, v, mask.dense(), scale, softcap, cells=mask.cells())
        out = ops.attention(q, k, v, mask.dense(), scale, softcap)
        if 0 < mask.ctx.out_rows.size < len(q):
            rows, cells = mask.sampled()
            # rows whose logits are sampled take the per-token kernel in any batch, so that a
            # token's logits are the same whether its prompt came with others, alone or cached
            out[rows] = ops.attention(np.ascontiguousarray(q[rows]), k, v, mask.dense()[rows],
                                      scale, softcap, cells=cells)
        return out

    def swiglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return ops.swiglu(gate, up)

    def geglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return ops.geglu(gate, up)

    def gelu(self, x: np.ndarray) -> np.ndarray:
        return ops.gelu(x)

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.add(a, b, dtype=np.float32)

    def scale(self, x: np.ndarray, s: float) -> np.ndarray:
        return np.multiply(x, np.float32(s), dtype=np.float32)

    def __repr__(self):
        return f"CPUBackend(threads={numba.get_num_threads()})"
