"""The CPU backend: the Backend interface on numpy and numba.

Quantized matrix products go through `matmul` (each ggml type's kernels working on the GGUF bytes
in place, packed 8-bit copies where the CPU has VNNI), the rest through `ops` and `attention`.
K and V rows live in host memory (`HostKVStore`), in the cache's storage type.
"""
from __future__ import annotations

import ctypes
import sys

import numba
import numpy as np

from ..backend import Backend, KQMask, QExperts, QWeight
from ..gguf import release_pages
from ..rope import RopeSpec
from . import attention, delta_net, ops
from .fused_block import FusedBlock, fusable
from .matmul import (embedding_rows, matmul, matmul_id, packed_fused, packed_product,
                     packed_weight)
from .matmul_packed import fuse

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
_heap_kept = False


def keep_freed_memory_in_heap() -> None:
    """Tells glibc's malloc to serve large arrays from its heap and keep freed memory there.

    By default each activation array over ~128 KiB is a fresh mmap that is unmapped when freed, so
    every layer page-faults its buffers in again, a measurable share of a prompt's time. With
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

class HostKVStore:
    """The rows of one tensor (K or V of one layer) for all cells, in one storage type, in host
    memory (what CPUBackend.kv_store gives; another backend keeps its layers' rows on its device
    behind the same methods)."""

    def __init__(self, type_name: str, n_ctx: int, n_head: int, head_dim: int):
        self.type = type_name
        self.n_head, self.head_dim = n_head, head_dim
        self.row = n_head * head_dim
        if type_name == "f32":
            shape, dtype = (n_ctx, self.row), np.float32
        elif type_name == "f16":
            shape, dtype = (n_ctx, self.row), np.uint16
        else:
            if self.row % ops.QK8_0:
                raise ValueError(f"q8_0 cache: a row of {self.row} values is not a whole number "
                                 f"of {ops.QK8_0}-value blocks")
            shape, dtype = (n_ctx, self.row // ops.QK8_0 * ops.Q8_0_BLOCK_BYTES), np.uint8
        self.data = np.zeros(shape, dtype)

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    def write(self, cells: np.ndarray, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float32).reshape(len(cells), self.row)
        if self.type == "f32":
            self.data[cells] = x
        elif self.type == "f16":
            self.data[cells] = ops.f32_to_f16_bits(x)
        else:
            self.data[cells] = ops.quantize_q8_0_rows(x)

    def read(self, n: int) -> np.ndarray:
        """Cells [0, n) as (n, n_head, head_dim) for attention: float32 (a view for f32), or the
        fp16 bit patterns themselves (uint16 view) for f16."""
        if self.type == "f16":
            return self.data[:n].reshape(n, self.n_head, self.head_dim)
        return self.read_f32(n)

    def read_f32(self, n: int) -> np.ndarray:
        """float32 (n, n_head, head_dim) of cells [0, n); a view for f32."""
        return self._decode(self.data[:n]).reshape(n, self.n_head, self.head_dim)

    def read_cells(self, cells: np.ndarray) -> np.ndarray:
        return self._decode(self.data[cells]).reshape(len(cells), self.n_head, self.head_dim)

    def _decode(self, raw: np.ndarray) -> np.ndarray:
        if self.type == "f32":
            return raw
        if self.type == "f16":
            return ops.f16_bits_to_f32(raw)
        return ops.dequantize_q8_0_rows(raw, self.row)


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
        """A 1-D tensor (norm weight, bias) as float32, a copy: reading a view of the file each
        step would map the file's pages around it again (the page cache's large folios: up to
        2 MiB of the neighbouring matrices, whose pages were dropped once packed)."""
        return np.array(tensor.dequantize(), dtype=np.float32, copy=True).reshape(-1)

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
        same_kind = len(ws) > 1 and len({(w.type, w.n_in) for w in ws}) == 1
        fused = None
        if same_kind and all(w.packed is None for w in ws):  # packed into one: no second copy
            fused = packed_fused(ws[0].type, [w.rows for w in ws], release=release_pages)
        if fused is None:
            for w in ws:
                if w.packed is None:
                    w.packed = packed_weight(w.type, w.rows, release=release_pages) or False
            if not same_kind or not all(w.packed for w in ws):
                return False
            fused = fuse([w.packed for w in ws])
        whole, parts = fused
        for w, part in zip(ws, parts):
            w.packed = part
        return ws, whole

    def fused_block(self, layer, kv_types: tuple[str, str]) -> FusedBlock | None:
        """cpu/fused_block.py's decode step of a layer, where it takes the layer and cache (on
        the host: it computes on numpy arrays, not through the methods below)."""
        return FusedBlock(self, layer) if self.device is None and fusable(layer, kv_types) \
            else None

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

    def rope(self, x: np.ndarray, pos: np.ndarray, spec: RopeSpec) -> np.ndarray:
        """x (n, n_head, head_dim) rotated for positions `pos`; may rotate x in place."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        cos, sin = self.rope_tables(pos, spec)
        return ops.rope_inplace(x, cos, sin, spec.n_dims, spec.neox)

    def rope_tables(self, pos: np.ndarray, spec: RopeSpec) -> tuple[np.ndarray, np.ndarray]:
        """ops.rope_tables(pos, spec), kept for the batch's other layers and Q/K"""
        key = (spec.key(), np.asarray(pos).tobytes())
        tables = self._rope_cache.get(key)
        if tables is None:
            if len(self._rope_cache) > 8:
                self._rope_cache.clear()
            tables = self._rope_cache[key] = ops.rope_tables(pos, spec)
        return tables

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask,
                  scale: float, softcap: float = 0.0, sinks=None) -> np.ndarray:
        """softmax(q·kᵀ·scale + mask)·v with grouped KV heads: (n, n_head * head_dim_v).
        k and v come from the cache (float32, or uint16 fp16 bit patterns) or from the batch
        itself (float32); sinks: each head's sink logit, or None."""
        q = np.asarray(q, dtype=np.float32)
        if not isinstance(mask, KQMask):
            return attention.attention(q, k, v, mask, scale, softcap, sinks=sinks)
        if len(q) <= attention.ATTN_FUSED_MAX_TOKENS:
            return attention.attention(q, k, v, mask.dense(), scale, softcap, cells=mask.cells(),
                                       sinks=sinks)
        out = attention.attention(q, k, v, mask.dense(), scale, softcap, sinks=sinks)
        if 0 < mask.ctx.out_rows.size < len(q):
            rows, cells = mask.sampled()
            # rows whose logits are sampled take the per-token kernel in any batch, so that a
            # token's logits are the same whether its prompt came with others, alone or cached
            out[rows] = attention.attention(np.ascontiguousarray(q[rows]), k, v, mask.dense()[rows],
                                            scale, softcap, cells=cells, sinks=sinks)
        return out

    def swiglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return ops.swiglu(gate, up)

    def swiglu_oai(self, gate: np.ndarray, up: np.ndarray, alpha: float,
                   limit: float) -> np.ndarray:
        return ops.swiglu_oai(gate, up, alpha, limit)

    def geglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return ops.geglu(gate, up)

    def gelu(self, x: np.ndarray) -> np.ndarray:
        return ops.gelu(x)

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.add(a, b, dtype=np.float32)

    def scale(self, x: np.ndarray, s: float) -> np.ndarray:
        return np.multiply(x, np.float32(s), dtype=np.float32)

    def ssm_conv(self, state: np.ndarray, x: np.ndarray, w: np.ndarray):
        return delta_net.ssm_conv(state, x, w)

    def gated_delta_net(self, q, k, v, g, beta, state: np.ndarray) -> np.ndarray:
        return delta_net.gated_delta_net(q, k, v, g, beta, state)

    def __repr__(self):
        return f"CPUBackend(threads={numba.get_num_threads()})"
