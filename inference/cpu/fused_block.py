"""A decode step's layer of the common decoder block in a few compiled calls.

`Transformer.block` runs each op through the backend's general methods: on SmolLM2 a decode
step made ~6,000 Python calls (shape checks, copies, dispatch) around ~310 kernel calls, 1.8 ms
of a 4.2 ms step (benchmarks/bench_decode_python.py). A layer here is nine calls over the same
kernels, with the glue between them fused into three small ones:

    h = rms_norm(x)                       ops' row kernel
    q, k, v = wq·h, wk·h, wv·h            one packed product (matmul_many's fused copy)
    _store_qkv(q, k, v, cache)            biases, Q/K norms, RoPE, Q's scale, k and v into the
                                          cache
    a = attention(q, cache)               attention's decode kernel over the visible cells
    x', h' = x + wo·a, rms_norm(x')       _add_rms_norm (wo·a post-normed first where the
                                          family has that norm)
    g, u = gate·h', up·h'                 one packed product
    x' + down·act(g, u)                   SwiGLU or GeGLU's kernel; _add_normed where the FFN's
                                          output is post-normed

Every value is computed by the same operations in the same order as the general path (the same
row functions, float32 adds, the same fp16 rounding, the same attention kernel and arguments), so
a token's logits are bit-identical whichever path ran (tests/test_fused_block.py). What a block
may hold is `backend.DecoderLayer`'s (llama.cpp's llm_build_llama with what Qwen 2/3, Gemma 2/3
and gpt-oss's attention add); a matrix that is not packed (a CPU without VNNI, a format with no
packed kernel) goes through the backend's matmul as before.
"""
from __future__ import annotations

import os

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic, overload

from ..quants.fp16 import HAS_HW_FP16, fp32_to_fp16
from . import matmul as _matmul
from . import matmul_packed
from .attention import (ATTN_DECODE_CELLS, ATTN_FUSED_MAX_TOKENS, _as_kv_rows, _attention_decode,
                        decode_serial)
from .matmul import PARALLEL_MIN_VALUES, packed_serial
from .ops import (GELU_F16_TABLE, NO_SINKS, _geglu_table, _geglu_table_here, _rms_norm_rows,
                  _rms_norm_rows_here, _rope_apply, _swiglu, _swiglu_here)

__all__ = ["FusedBlock", "fusable", "ENABLED"]

# LLAMATUI_FUSED=0 runs every layer op by op (to compare the two)
ENABLED = os.environ.get("LLAMATUI_FUSED", "1") != "0"


def _put(rows, c, i, value):
    """Stores value at rows[c, i]: a cache row's value, as fp16 bits or float32."""


@overload(_put, inline="always")
def _put_impl(rows, c, i, value):
    if rows.dtype == types.uint16:  # GGML_FP32_TO_FP16, as HostKVStore.write rounds
        def put_f16(rows, c, i, value):
            rows[c, i] = np.uint16(fp32_to_fp16(value))
        return put_f16

    def put_f32(rows, c, i, value):
        rows[c, i] = value
    return put_f32


@numba.njit(inline="always")
def _biased(x, b, t, i):
    return x[t, i] + b[i] if b.size else x[t, i]


@numba.njit(cache=True, nogil=True)
def _store_qkv(q, k, v, bq, bk, bv, q_norm, k_norm, eps, cos, sin, n_dims, neox, q_scale, k_rows,
               v_rows, cells, q_out, k_tmp):
    """What comes between the projections and attention, as Transformer.attention and
    ForwardContext.attend order it: q (n, H*d_k), k (n, Hkv*d_k), v (n, Hkv*d_v) each plus its
    bias; q's and k's heads RMS-normed (Qwen 3, Gemma); q and k rotated (n_dims 0: no RoPE)
    into q_out (n, H, d_k) and k_tmp; q times q_scale (Gemma); k and v stored into the cache's
    rows (n_ctx, row; fp16 bits or float32) at `cells`. Biases and norms may be empty: none.
    (Attention's kernel is called apart: called from here, it made this function's first
    compilation 2 s longer.)"""
    n, d_k = q.shape[0], q_out.shape[2]
    q2 = q_out.reshape(n, q.shape[1])
    for t in range(n):
        for i in range(q.shape[1]):
            q2[t, i] = _biased(q, bq, t, i)
        for i in range(k.shape[1]):
            k_tmp[t, i] = _biased(k, bk, t, i)
    if q_norm.size:  # per head: rows of d_k values, normed in place by ops.rms_norm's kernel
        q_heads = q2.reshape(-1, d_k)
        _rms_norm_rows_here(q_heads, q_norm, eps, q_heads)
    if k_norm.size:
        k_heads = k_tmp.reshape(-1, d_k)
        _rms_norm_rows_here(k_heads, k_norm, eps, k_heads)
    if n_dims:  # ops' RoPE kernel, on the heads
        _rope_apply(q_out, cos, sin, n_dims, neox)
        _rope_apply(k_tmp.reshape(n, -1, d_k), cos, sin, n_dims, neox)
    for t in range(n):
        if q_scale != np.float32(1.0):
            for i in range(q.shape[1]):
                q2[t, i] = q2[t, i] * q_scale
        c = cells[t]
        for i in range(k.shape[1]):
            _put(k_rows, c, i, k_tmp[t, i])
        for i in range(v.shape[1]):
            _put(v_rows, c, i, _biased(v, bv, t, i))


@numba.njit(cache=True, nogil=True)
def _add_rms_norm(x, y, post, w, eps, x_out, h_out):
    """x_out = x + y (the residual stream; y first RMS-normed times `post` in place unless it
    is empty: Gemma's post-attention norm), h_out = rms_norm(x_out) * w, by ops.rms_norm's
    kernel"""
    if post.size:
        _rms_norm_rows_here(y, post, eps, y)
    for r in range(x.shape[0]):
        for i in range(x.shape[1]):
            x_out[r, i] = x[r, i] + y[r, i]
    _rms_norm_rows_here(x_out, w, eps, h_out)


@numba.njit(cache=True, nogil=True)
def _add_normed(x, y, post, eps):
    """x += y, y first RMS-normed times `post` in place (Gemma's post-FFN norm)"""
    _rms_norm_rows_here(y, post, eps, y)
    for r in range(x.shape[0]):
        for i in range(x.shape[1]):
            x[r, i] = x[r, i] + y[r, i]


# ================================================================== the layer in one call

@intrinsic
def _call(typingctx, address, args):
    """Calls the compiled function at `address` (the C wrapper of a numba overload:
    `_address`) with the values of the tuple `args`, which must have the types it was compiled
    for: a kernel chosen at run time (a layer's formats, a size's serial or parallel variant)
    without compiling it into the caller (a parallel kernel called directly lengthened the
    caller's first compilation by seconds)."""
    if not isinstance(address, types.Integer) or not isinstance(args, types.BaseTuple):
        return None

    def codegen(context, builder, signature, llargs):
        dmm = context.data_model_manager
        members = list(signature.args[1])
        fnty = ir.FunctionType(dmm.lookup(types.none).get_value_type(),
                               [dmm.lookup(t).get_value_type() for t in members])
        values = [builder.extract_value(llargs[1], i) for i in range(len(members))]
        builder.call(builder.inttoptr(llargs[0], fnty.as_pointer()), values)
        return context.get_dummy_value()
    return types.void(address, args), codegen


def _address(dispatcher, *arg_types) -> int:
    """The address of the C wrapper of `dispatcher` compiled for exactly these argument types
    (numba's first-class function protocol), compiling it if need be."""
    from numba.experimental.function_type import _get_wrapper_address
    return _get_wrapper_address(dispatcher, types.void(*arg_types))


@numba.njit(cache=True, nogil=True)
def _product(kernel, data, parts, n_out, nbytes, h):
    """h (n, k) times a packed matrix (or fused matrices) by its format's kernel at address
    `kernel`: flat (n * n_out), as matmul_packed.matmul computes it"""
    n = h.shape[0]
    out = np.empty(n * n_out, np.float32)
    _call(kernel, (data, parts, h, out, packed_serial(nbytes, n)))
    return out


@numba.njit(cache=True, nogil=True)
def _layer(x, norms, eps, kernels, datas, partss, n_outs, nbytes, n_qkv, n_gu, dims, biases,
           qk_norms, cos, sin, n_dims, neox, q_scale, k_rows, v_rows, cells, mask, visible,
           counts, scale, softcap, sinks, steps, gelu, table):
    """FusedBlock's layer in one call: x (n, e) -> the residual stream after the layer.
    norms: attention's, the FFN's, the post-attention and post-FFN norms (empty: none);
    products 0-2 Q, K, V (n_qkv 1: one fused product), 3 the output, 4-5 gate and up (n_gu 1:
    fused), 6 down, each by the address of its format's kernel; dims: n_head, n_head_kv, d_k,
    d_v, then Q's, K's and the FFN's rows; steps: the addresses of the input norm's, the
    activation's and attention's kernels for this batch's size."""
    n, e = x.shape
    h = np.empty_like(x)
    _call(steps[0], (x, norms[0], eps, h))
    out = _product(kernels[0], datas[0], partss[0], n_outs[0], nbytes[0], h)
    if n_qkv == 1:
        q_rows, k_rows_n = dims[4], dims[5]
        q = out[:n * q_rows].reshape(n, q_rows)
        k = out[n * q_rows:n * (q_rows + k_rows_n)].reshape(n, k_rows_n)
        v = out[n * (q_rows + k_rows_n):].reshape(n, -1)
    else:
        q = out.reshape(n, -1)
        k = _product(kernels[1], datas[1], partss[1], n_outs[1], nbytes[1], h).reshape(n, -1)
        v = _product(kernels[2], datas[2], partss[2], n_outs[2], nbytes[2], h).reshape(n, -1)
    q_out = np.empty((n, dims[0], dims[2]), np.float32)
    _store_qkv(q, k, v, biases[0], biases[1], biases[2], qk_norms[0], qk_norms[1], eps, cos,
               sin, n_dims, neox, q_scale, k_rows, v_rows, cells, q_out, np.empty_like(k))
    n_kv = mask.shape[1]
    att = np.empty((n, dims[0], dims[3]), np.float32)
    _call(steps[2], (q_out, _seen(k_rows, n_kv), _seen(v_rows, n_kv), dims[1], mask, visible,
                     counts, scale, softcap, sinks, np.int64(ATTN_DECODE_CELLS), att,
                     decode_serial(n, n_kv, dims[0], dims[2], dims[3]), False))
    a = _product(kernels[3], datas[3], partss[3], n_outs[3], nbytes[3],
                 att.reshape(n, -1)).reshape(n, e)
    x2 = np.empty_like(x)
    _add_rms_norm(x, a, norms[2], norms[1], eps, x2, h)
    out = _product(kernels[4], datas[4], partss[4], n_outs[4], nbytes[4], h)
    if n_gu == 1:
        f = dims[6]
        g = out[:n * f].reshape(n, f)
        u = out[n * f:].reshape(n, f)
    else:
        g = out.reshape(n, -1)
        u = _product(kernels[5], datas[5], partss[5], n_outs[5], nbytes[5], h).reshape(n, -1)
    act = np.empty_like(g)
    if gelu:
        _call(steps[1], (g, u, table, act))
    else:
        _call(steps[1], (g, u, act))
    d = _product(kernels[6], datas[6], partss[6], n_outs[6], nbytes[6], act).reshape(n, e)
    if norms[3].size:
        _add_normed(x2, d, norms[3], eps)
    else:
        for r in range(n):
            for i in range(e):
                x2[r, i] = x2[r, i] + d[r, i]
    return x2


def _seen(rows, n_kv):
    """Cells [0, n_kv) of a cache's rows as attention's decode kernel reads them
    (attention._as_kv_rows): fp16 bits as bytes, float32 as they are."""


@overload(_seen, inline="always")
def _seen_impl(rows, n_kv):
    if rows.dtype == types.uint16:
        return lambda rows, n_kv: rows[:n_kv].view(np.uint8)
    return lambda rows, n_kv: rows[:n_kv]


def _slot(p) -> tuple:
    """a packed matrix (or fused matrices) as _layer's product slot takes it"""
    bounds = p.parts.tolist()
    return (matmul_packed.KERNELS[p.type_name].kernel, p.data, p.parts, p.n_out, p.nbytes,
            tuple(zip(bounds[:-1], bounds[1:])))


def _vector(v) -> np.ndarray:
    """a layer's optional vector as the kernels take it: float32, an empty array for none"""
    return NO_SINKS if v is None else np.array(v, dtype=np.float32)


def fusable(layer, kv_types: tuple[str, str]) -> bool:
    """Whether FusedBlock computes this DecoderLayer with K and V rows of `kv_types`: whole
    16-value head slices (the decode attention kernel's vectors), float rows (q8_0 ones go the
    general way), the CPU's fp16 conversion for f16 ones (as attention.attention requires)."""
    return ENABLED and layer.head_dim_k % 16 == 0 and layer.head_dim_v % 16 == 0 \
        and all(t == "f32" or (t == "f16" and HAS_HW_FP16) for t in kv_types)


class _Products:
    """x times each of a few matrices of one input size (Q, K, V or gate, up): through their
    packed copies once the backend has packed them (in one product when it fused them), until
    then, and for good where it could not, through backend.matmul_many."""

    def __init__(self, backend, weights):
        self.backend, self.weights = backend, tuple(weights)
        self.packed = None  # the PackedWeights multiplied, once known; () for the backend's way

    def __call__(self, x: np.ndarray) -> list[np.ndarray]:
        if not self.packed or not _matmul.USE_INT8:  # (packed_product's switch)
            outs = self.backend.matmul_many(self.weights, x) if len(self.weights) > 1 \
                else [self.backend.matmul(self.weights[0], x)]
            if self.packed is None:
                self.packed = self._packed()
            return outs
        outs = []
        for p in self.packed:
            outs += matmul_packed.matmul(p, x, packed_serial(p.nbytes, x.shape[0]))
        return outs

    def _packed(self) -> tuple:
        """after the backend's first product (which packs and fuses): what to multiply"""
        first = self.weights[0]
        if len(self.weights) > 1 and first.fused and first.fused[0] == self.weights:
            return (first.fused[1],)
        if all(w.packed for w in self.weights):
            return tuple(w.packed for w in self.weights)
        return ()


class FusedBlock:
    """One DecoderLayer's decode step on the CPU: `__call__(ctx, x)` is Transformer.block's
    result for a batch of up to ATTN_FUSED_MAX_TOKENS tokens."""

    max_tokens = ATTN_FUSED_MAX_TOKENS

    def __init__(self, backend, layer):
        self.il = layer.il
        self.layer = layer
        self.eps = np.float32(layer.eps)
        self.qkv = _Products(backend, (layer.wq, layer.wk, layer.wv))
        self.wo = _Products(backend, (layer.wo,))
        self.gate_up = _Products(backend, (layer.w_gate, layer.w_up))
        self.down = _Products(backend, (layer.w_down,))
        # the optional vectors, an empty array where absent (the kernels' "none")
        self.biases = tuple(_vector(b) for b in (layer.bq, layer.bk, layer.bv))
        self.qk_norms = _vector(layer.q_norm), _vector(layer.k_norm)
        # attention's, the FFN's, the post-attention and post-FFN norms
        self.norms = tuple(_vector(v) for v in (layer.attn_norm, layer.ffn_norm,
                                                 layer.post_attn_norm, layer.post_ffw_norm))
        self.sinks = _vector(layer.sinks)
        self.activation = (_swiglu_here, _swiglu) if layer.activation == "silu" else \
            (_geglu_table_here, _geglu_table)
        self.tables = () if layer.activation == "silu" else (GELU_F16_TABLE,)
        self.q_scale = np.float32(layer.q_scale)
        self.scale, self.softcap = np.float32(layer.kq_scale), np.float32(layer.softcap)
        self.n_dims = 0 if layer.rope is None else layer.rope.n_dims
        self.neox = layer.rope is not None and bool(layer.rope.neox)
        self.rope_key = None if layer.rope is None else layer.rope.key()
        self.backend = backend
        # _layer's constant arguments once every product is packed (None: not yet known;
        # False: some product is not, and the layer runs as calls from here)
        self.compiled = None
        self.steps = {}  # batch size -> the addresses of its norm, activation, attention kernels

    def __call__(self, ctx, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x)
        if self.compiled and _matmul.USE_INT8:
            return self._run_compiled(ctx, x)
        x2 = self._run_calls(ctx, x)
        if self.compiled is None and all(p.packed is not None for p in
                                         (self.qkv, self.wo, self.gate_up, self.down)):
            # the first call packed the matrices: _layer is compiled now (in a load's warm-up)
            self.compiled = self._compile()
            if self.compiled:
                self._run_compiled(ctx, x, compile_only=True)
        return x2

    def _run_calls(self, ctx, x: np.ndarray) -> np.ndarray:
        """the layer as calls from here, each product as _Products has it"""
        attn_norm, ffn_norm, post_attn_norm, post_ffw_norm = self.norms
        h = np.empty_like(x)
        (_rms_norm_rows_here if x.size < PARALLEL_MIN_VALUES else _rms_norm_rows)(
            x, attn_norm, self.eps, h)
        att = self._attention(ctx, x.shape[0], *self.qkv(h))
        (a,) = self.wo(att)
        x2, h2 = np.empty_like(x), np.empty_like(x)
        _add_rms_norm(x, a, post_attn_norm, ffn_norm, self.eps, x2, h2)
        g, u = self.gate_up(h2)
        act = np.empty_like(g)
        self.activation[g.size >= PARALLEL_MIN_VALUES](g, u, *self.tables, act)
        (d,) = self.down(act)
        if not post_ffw_norm.size:
            return np.add(x2, d, out=x2)
        _add_normed(x2, d, post_ffw_norm, self.eps)
        return x2

    def _compile(self):
        """_layer's constant arguments: every product's kernel address, packed matrices and
        sizes in its slots; False where a product is not packed or its parts are not Q, K, V
        (gate, up) in order."""
        L = self.layer
        # per product: (kernel, data, parts, rows, bytes, the rows of each matrix it holds)
        qkv, wo, gate_up, down = (tuple(_slot(w) for w in p.packed)
                                  for p in (self.qkv, self.wo, self.gate_up, self.down))
        q_rows, k_rows, v_rows = (L.n_head * L.head_dim_k, L.n_head_kv * L.head_dim_k,
                                  L.n_head_kv * L.head_dim_v)
        n_ff = L.w_gate.n_out
        whole_qkv = ((0, q_rows), (q_rows, q_rows + k_rows), (q_rows + k_rows,
                                                               q_rows + k_rows + v_rows))
        if not (qkv and wo and gate_up and down) or len(wo) != 1 or len(down) != 1 \
                or (len(qkv), len(gate_up)) not in ((1, 1), (1, 2), (3, 1), (3, 2)) \
                or (len(qkv) == 1 and qkv[0][5] != whole_qkv) \
                or (len(gate_up) == 1 and gate_up[0][5] != ((0, n_ff), (n_ff, 2 * n_ff))):
            return False
        slots = (*qkv, *(qkv[0],) * (3 - len(qkv)), *wo, *gate_up,
                 *(gate_up[0],) * (2 - len(gate_up)), *down)
        if len({(numba.typeof(s[1]), numba.typeof(s[2])) for s in slots}) != 1:
            return False  # one type each, for the tuples _layer indexes
        a1, a2 = types.Array(types.float32, 1, "C"), types.Array(types.float32, 2, "C")
        try:
            kernels = np.array([_address(s[0], numba.typeof(s[1]), numba.typeof(s[2]), a2, a1,
                                         types.boolean) for s in slots], np.int64)
        except (ImportError, AttributeError):  # a numba without the protocol: calls it is
            return False
        return (kernels, tuple(s[1] for s in slots), tuple(s[2] for s in slots),
                np.array([s[3] for s in slots], np.int64),
                np.array([s[4] for s in slots], np.int64), len(qkv), len(gate_up),
                np.array([L.n_head, L.n_head_kv, L.head_dim_k, L.head_dim_v, q_rows, k_rows,
                          n_ff], np.int64))

    def _step_kernels(self, n: int, e: int, n_ff: int, batch, k_rows, v_rows) -> np.ndarray:
        """the addresses of the input norm's, the activation's and attention's kernels for a
        batch of n tokens, with the types _layer passes them"""
        a2, a3 = types.Array(types.float32, 2, "C"), types.Array(types.float32, 3, "C")
        norm = _rms_norm_rows_here if n * e < PARALLEL_MIN_VALUES else _rms_norm_rows
        activation = self.activation[n * n_ff >= PARALLEL_MIN_VALUES]
        gates = (a2, a2, a2) if not self.tables else (a2, a2, numba.typeof(self.tables[0]), a2)
        _, _, mask, visible, counts = batch
        seen = [numba.typeof(_as_kv_rows(rows[:1])) for rows in (k_rows, v_rows)]
        return np.array([
            _address(norm, a2, numba.typeof(self.norms[0]), types.float32, a2),
            _address(activation, *gates),
            _address(_attention_decode, a3, *seen, types.int64, numba.typeof(mask),
                     numba.typeof(visible), numba.typeof(counts), types.float32, types.float32,
                     numba.typeof(self.sinks), types.int64, a3, types.boolean, types.boolean)],
            np.int64)

    def _run_compiled(self, ctx, x: np.ndarray, compile_only: bool = False):
        """the layer in one call of _layer (compile_only: compiled, or loaded from numba's
        cache, and not run)"""
        n, e = x.shape
        batch = self._batch(ctx, n)
        k_rows, v_rows = ctx.kv.k[self.il].data, ctx.kv.v[self.il].data
        kernels, datas, partss, n_outs, nbytes, n_qkv, n_gu, dims = self.compiled
        steps = self.steps.get(n)
        if steps is None:
            steps = self.steps[n] = self._step_kernels(n, e, int(dims[6]), batch, k_rows, v_rows)
        cos, sin, mask, visible, counts = batch
        args = (x, self.norms, self.eps, kernels, datas, partss, n_outs, nbytes, n_qkv, n_gu,
                dims, self.biases, self.qk_norms, cos, sin, self.n_dims, self.neox, self.q_scale,
                k_rows, v_rows, ctx.cells, mask, visible, counts, self.scale, self.softcap,
                self.sinks, steps, bool(self.tables), GELU_F16_TABLE)
        if compile_only:
            return _layer.compile(tuple(numba.typeof(a) for a in args))
        return _layer(*args)

    def _attention(self, ctx, n: int, q, k, v) -> np.ndarray:
        """q, k, v biased, normed and rotated, k and v stored, q attended over the cache:
        (n, H * d_v), as Transformer.attention and ForwardContext.attend compute it."""
        L = self.layer
        cos, sin, mask, visible, counts = self._batch(ctx, n)
        q_out = np.empty((n, L.n_head, L.head_dim_k), np.float32)
        k_rows, v_rows = ctx.kv.k[self.il].data, ctx.kv.v[self.il].data
        _store_qkv(q, k, v, *self.biases, *self.qk_norms, self.eps, cos, sin, self.n_dims,
                   self.neox, self.q_scale, k_rows, v_rows, ctx.cells, q_out, np.empty_like(k))
        n_kv = mask.shape[1]
        out = np.empty((n, L.n_head, L.head_dim_v), np.float32)
        _attention_decode(q_out, _as_kv_rows(k_rows[:n_kv]), _as_kv_rows(v_rows[:n_kv]),
                          L.n_head_kv, mask, visible, counts, self.scale, self.softcap,
                          self.sinks, ATTN_DECODE_CELLS, out,
                          decode_serial(n, n_kv, L.n_head, L.head_dim_k, L.head_dim_v), False)
        return out.reshape(n, -1)

    def _batch(self, ctx, n: int) -> tuple:
        """what the batch's layers of this RoPE and window share, found by the first of them:
        RoPE tables (n, n_dims / 2), the KQ mask and the visible cells (ForwardContext.mask,
        visible_cells); the window read each time, as the op-by-op block does"""
        window = ctx.hp.window(self.il)
        return ctx.shared(("fused", self.rope_key, window),
                          lambda: self._batch_inputs(ctx, n, window))

    def _batch_inputs(self, ctx, n: int, window: int) -> tuple:
        L = self.layer
        if L.rope is None:
            cos = sin = np.zeros((n, 0), np.float32)
        else:
            cos, sin = self.backend.rope_tables(ctx.positions, L.rope)
        visible, counts = ctx.visible_cells(window)
        return cos, sin, ctx.mask(window), visible, counts
