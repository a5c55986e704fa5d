"""The backend seam: every kernel the layer loop runs goes through one of these methods.

`Backend` is the interface. A backend owns what its layers touch on its device: it prepares
weights once (`weight` for matrices, `vector` for norms and biases), allocates the K and V rows of
its layers (`kv_store`; the KVCache keeps only cells and positions), and computes on its own
arrays. The model asks for a backend per layer (`Model.layer_backends`) and moves activations
between backends with `take`, so hidden states cross a device boundary once per boundary per
batch and another backend (a GPU's, for llama.cpp's `-ngl`) can run some layers without the
architecture code changing.

Implementations: `cpu.backend.CPUBackend` (numpy and numba, on the GGUF bytes in place) and
`cuda.backend.CUDABackend` (CuPy and numba-cuda).

Mixture-of-experts layers add three methods: `experts` prepares a 3-D tensor of expert matrices,
`matmul_id` multiplies each token by the experts its router chose (ggml_mul_mat_id: only their
rows are read), and `weighted_sum` adds the experts' outputs with the router's weights.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

import numpy as np

from .rope import RopeSpec
from .catalog import GGML_TYPES


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


class DecoderLayer(NamedTuple):
    """One layer of llama.cpp's common decoder block (llm_build_llama, with what Qwen 2/3 and
    Gemma 2/3 add) as a backend's fused decode step takes it (`Backend.fused_block`): pre-norm
    attention over the layer's own cache (Q, K, V separate, optional biases, per-head Q/K RMS
    norms, RoPE or none, Q scaled before attention, soft-capping, sinks) and a gated FFN
    (SwiGLU or GeGLU), each optionally normed again and added to the residual stream; nothing
    else (Transformer.fused_block says which layers are this). Absent pieces are None."""
    il: int
    attn_norm: object
    wq: object
    wk: object
    wv: object
    bq: object
    bk: object
    bv: object
    q_norm: object
    k_norm: object
    wo: object
    post_attn_norm: object
    ffn_norm: object
    w_gate: object
    w_up: object
    w_down: object
    post_ffw_norm: object
    activation: str  # "silu" (SwiGLU) or "gelu" (GeGLU)
    sinks: object
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    eps: float
    q_scale: float  # Q times this after RoPE (Gemma's ggml_scale of Qcur; 1: none)
    kq_scale: float
    softcap: float
    rope: RopeSpec | None


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
        `read_cells(cells)` (float32, for shifting K), like cpu.backend.HostKVStore."""

    @abstractmethod
    def take(self, x):
        """An activation array from the host or, on a device, from another device, here (a
        device's array reaches the host through its own backend: `move`)."""

    @abstractmethod
    def to_host(self, x) -> np.ndarray:
        """One of this backend's arrays as a numpy array."""

    def fused_block(self, layer: DecoderLayer, kv_types: tuple[str, str]):
        """A callable block(ctx, x) giving Transformer.block's result for `layer` in a decode
        step (at most block.max_tokens tokens), bit for bit, with less host work between its
        kernels; None where this backend has none for it (then the block runs op by op).
        kv_types: the storage types of the layer's K and V rows."""
        return None

    # greedy_tokens runs here: a greedy sampler's token leaves the device instead of its logits
    samples_greedy = False

    def greedy_tokens(self, logits):
        """int32 (n,) of logits (n, n_vocab): each row's greedy token (the lowest id of its
        largest logit), -1 for a row with a NaN or an infinity; on this backend, as llama.cpp's
        greedy sampler's backend_apply puts an argmax in the graph. Only where
        `samples_greedy`."""
        raise NotImplementedError(f"{self.name or type(self).__name__} samples on the host")

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
    def rope(self, x, pos: np.ndarray, spec: RopeSpec):
        """x (n, n_head, head_dim) rotated for positions `pos` (may rotate in place)."""

    @abstractmethod
    def attention(self, q, k, v, mask, scale: float, softcap: float = 0.0, sinks=None):
        """softmax(q·kᵀ·scale + mask)·v with grouped KV heads, k and v as this backend's
        kv_store.read gives them, or as the batch's own float32 K and V (embeddings attend
        without the cache), mask a KQMask (or its dense array): (n, n_head * head_dim_v).
        softcap > 0: q·k becomes tanh(q·k / softcap) · softcap first (Gemma 2's attention
        logit soft-capping). sinks: None, or one logit per query head (this backend's `vector`)
        that joins the softmax's maximum and denominator and weighs no value (gpt-oss,
        ggml_soft_max_add_sinks)."""

    @abstractmethod
    def swiglu(self, gate, up):
        """silu(gate) * up."""

    @abstractmethod
    def swiglu_oai(self, gate, up, alpha: float, limit: float):
        """gpt-oss's clamped SwiGLU: min(gate, limit) · sigmoid(alpha · min(gate, limit)) ·
        (clamp(up, -limit, limit) + 1) (ggml_swiglu_oai)."""

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

    # the Gated DeltaNet recurrence (Qwen 3.5): host arrays in and out, on the host backend
    # (a device backend's layers hand it there: it is small next to the layer's products)

    def ssm_conv(self, state: np.ndarray, x: np.ndarray, w: np.ndarray):
        """ggml_ssm_conv of one sequence: x float32 (n, channels) behind its conv state
        (channels, d_conv - 1), taps w (channels, d_conv): (output (n, channels), new state)."""
        raise NotImplementedError(f"{self.name}: no ssm_conv")

    def gated_delta_net(self, q, k, v, g, beta, state: np.ndarray) -> np.ndarray:
        """ggml_gated_delta_net of one sequence (cpu/delta_net.py): (n, H_v, S), `state`
        (H_v, S, S) updated in place."""
        raise NotImplementedError(f"{self.name}: no gated_delta_net")


def move(x, source: Backend, dest: Backend):
    """Activation `x` of backend `source` as an array of `dest`: to the host through the
    device's own `to_host` (CuPy refuses an implicit conversion to numpy, and only that backend
    knows the stream its kernels wrote x on), onto a device by `dest.take`."""
    if source is dest:
        return x
    if dest.device is None and source.device is not None:
        x = source.to_host(x)
    return dest.take(x)
