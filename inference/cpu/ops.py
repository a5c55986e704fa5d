"""Numeric kernels of the forward pass (CPU, numba), each following the ggml CPU op it replaces.

- `rms_norm`: `y = x / sqrt(mean(x²) + eps) * w`, the sum of squares in float64 like ggml's
  `ggml_float`, the rest in float32 (ggml_compute_forward_rms_norm_f32 then ggml_mul).
- `rope_tables` / `rope_inplace` / `rope_apply`: ggml's rope cache (`theta = pos`, multiplied by
  `theta_scale = base^(-2/n_dims)` step by step across pairs, `cos(freq_scale * theta / ff)`,
  with rope_yarn's ramp back to the unscaled angle and its magnitude when the `RopeSpec` has
  YaRN), rotating consecutive pairs (NORM) or `(i, i + n_dims/2)` (NEOX); dims past `n_dims` are
  left as they are.
- `softmax_masked_inplace`: ggml_soft_max_ext: `x * scale + mask`, max, `exp` (ggml's vector
  expf, `exp_f32`), sums in float64; with a soft-cap, `x` is first `tanh(x / cap) * cap`
  (llama.cpp's attn_soft_cap graph: ggml_scale, ggml_tanh, ggml_scale); attention sinks (one
  logit per head) join the maximum and the sum as ggml_soft_max_add_sinks has them.
- `layer_norm`: ggml_compute_forward_norm_f32 (the mean and the variance summed in float64 like
  `ggml_float`, the rest in float32) then ggml_mul and ggml_add: `(x - mean) / sqrt(var + eps)
  * w + b` (BERT's norms).
- `swiglu`: `silu(g) * u`; `swiglu_oai`: gpt-oss's clamped form; `geglu`: `gelu_tanh(g) * u`
  looked up in ggml's fp16 GELU table (input rounded to fp16, table values fp16), exact beyond
  ±10 like ggml_vec_geglu_f32;
  `gelu`: the same table on its own (ggml_vec_gelu_f32, BERT's FFN).
- f16 and Q8_0 row conversions for the KV cache (Q8_0 with `roundf`, as quantize_row_q8_0_ref).

Attention and its KQ mask are in `attention`.

Kernels that divide use numba's "numpy" error model: a division by zero gives inf or NaN as in
ggml's C, instead of raising ZeroDivisionError inside a kernel, so that broken weights (NaN, inf)
flow through to the logits, where the scheduler stops with NonFiniteLogitsError.

Element-wise kernels run on numba's threads for a prompt's worth of rows and on the calling
thread alone for a token's (waking threads costs more than a few thousand values take).
"""
from __future__ import annotations

import math

import numba
import numpy as np

from ..rope import RopeSpec

from ..quants.base import F16_TO_F32
from ..quants.fp16 import f32_to_f16_bits as _f32_to_f16_bits
from ..quants.fp16 import (GELU_COEF_A, GELU_F16_TABLE, GELU_SQRT_2_OVER_PI, HAS_HW_FP16,
                           bits_f32, f32_bits, fp32_to_fp16, fp32_to_fp16_hw)
from ..quants.legacy import Q8_0
from .matmul import PARALLEL_MIN_VALUES
from .simd import (threads_get, threads_set)

# ----------------------------------------------------------------------------- RMS norm


@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def _sum_of_squares(x, r):
    """sum(x[r] ** 2): each square in float32, summed in float64 (ggml_float) in any order
    (vectorized; a float64 sum of float32 squares rounds the same to float32 in all but the
    rarest cases)."""
    s = 0.0
    for i in range(x.shape[1]):
        s += np.float64(x[r, i] * x[r, i])
    return s


@numba.njit(inline="always")
def _rms_norm_row(x, w, eps, out, r):
    d = x.shape[1]
    s = _sum_of_squares(x, r)
    mean = np.float32(s / d)
    scale = np.float32(1.0) / np.float32(math.sqrt(mean + eps))
    for i in range(d):
        out[r, i] = (x[r, i] * scale) * w[i]


# Each row kernel twice: parallel over rows, and on the calling thread for a row or a few (a
# decode step's). Numba's parallel loops cost a first run ~0.3 s of compilation each, which a
# short prompt and its reply then need not pay.

@numba.njit(cache=True, nogil=True, parallel=True, error_model="numpy")
def _rms_norm_rows(x, w, eps, out):
    for r in numba.prange(x.shape[0]):
        _rms_norm_row(x, w, eps, out, r)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _rms_norm_rows_here(x, w, eps, out):
    for r in range(x.shape[0]):
        _rms_norm_row(x, w, eps, out, r)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """RMS-normalizes the last axis of `x` and multiplies by `w` (same length); new array."""
    shape = x.shape
    d = shape[-1]
    if w.shape != (d,):
        raise ValueError(f"rms_norm: weight of shape {w.shape} for rows of {d}")
    x2 = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, d)
    out = np.empty_like(x2)
    kernel = _rms_norm_rows_here if x2.size < PARALLEL_MIN_VALUES else _rms_norm_rows
    kernel(x2, np.ascontiguousarray(w, dtype=np.float32), np.float32(eps), out)
    return out.reshape(shape)


# ----------------------------------------------------------------------------- LayerNorm


@numba.njit(cache=True, nogil=True, parallel=True)
def _layer_norm_rows(x, w, b, eps, out, serial):
    threads = threads_get()
    if serial:
        threads_set(1)
    n_rows, d = x.shape
    for r in numba.prange(n_rows):
        s = 0.0
        for i in range(d):
            s += np.float64(x[r, i])
        mean = np.float32(s / d)
        var = 0.0
        for i in range(d):
            c = x[r, i] - mean
            out[r, i] = c
            var += np.float64(c * c)
        scale = np.float32(1.0) / np.float32(math.sqrt(np.float32(var / d) + eps))
        for i in range(d):
            out[r, i] = (out[r, i] * scale) * w[i] + b[i]
    if serial:
        threads_set(threads)


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, eps: float) -> np.ndarray:
    """LayerNorm over the last axis of `x`, times `w`, plus `b` (None: no bias); new array."""
    shape = x.shape
    d = shape[-1]
    if w.shape != (d,) or (b is not None and b.shape != (d,)):
        raise ValueError(f"layer_norm: weight {w.shape}, bias {None if b is None else b.shape} "
                         f"for rows of {d}")
    x2 = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, d)
    bias = np.zeros(d, np.float32) if b is None else np.ascontiguousarray(b, dtype=np.float32)
    out = np.empty_like(x2)
    _layer_norm_rows(x2, np.ascontiguousarray(w, dtype=np.float32), bias, np.float32(eps), out,
                     x2.size < PARALLEL_MIN_VALUES)
    return out.reshape(shape)


# ----------------------------------------------------------------------------- RoPE


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _rope_tables(pos, half, theta_scale, freq_scale, freq_factors, corr_lo, corr_hi, ext_factor,
                 mscale, cos_out, sin_out):
    one = np.float32(1.0)
    zero = np.float32(0.0)
    ramp_width = max(np.float32(0.001), corr_hi - corr_lo)
    for t in range(pos.size):
        theta = np.float32(pos[t])
        for i in range(half):
            extrap = theta / freq_factors[i]
            th = freq_scale * extrap
            if ext_factor != zero:  # YaRN: pairs below corr_lo extrapolate, above corr_hi scale
                y = (np.float32(i) - corr_lo) / ramp_width
                mix = (one - min(one, max(zero, y))) * ext_factor
                th = th * (one - mix) + extrap * mix
            cos_out[t, i] = math.cos(th) * mscale
            sin_out[t, i] = math.sin(th) * mscale
            theta = theta * theta_scale


def rope_tables(pos: np.ndarray, spec: RopeSpec,
                magnitude: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin, float32 (n_tokens, n_dims/2), for the rotation angles of `spec` at `pos`
    (ggml_rope_cache_init with rope_yarn), multiplied by the spec's magnitude unless
    `magnitude` is False (a pure rotation)."""
    half = spec.n_dims // 2
    pos = np.ascontiguousarray(pos, dtype=np.int64).reshape(-1)
    ff = np.ones(half, np.float32) if spec.freq_factors is None else spec.freq_factors
    corr_lo, corr_hi = spec.yarn_corr_dims()
    cos = np.empty((pos.size, half), np.float32)
    sin = np.empty((pos.size, half), np.float32)
    _rope_tables(pos, half, spec.theta_scale(), np.float32(spec.freq_scale), ff, corr_lo, corr_hi,
                 np.float32(spec.ext_factor), spec.mscale() if magnitude else np.float32(1.0),
                 cos, sin)
    return cos, sin


@numba.njit(cache=True, nogil=True)
def _rope_apply(x, cos, sin, n_dims, neox):
    n, n_head, _ = x.shape
    half = n_dims // 2
    for t in range(n):
        for h in range(n_head):
            for i in range(half):
                c = cos[t, i]
                s = sin[t, i]
                if neox:
                    j0 = i
                    j1 = i + half
                else:
                    j0 = 2 * i
                    j1 = 2 * i + 1
                x0 = x[t, h, j0]
                x1 = x[t, h, j1]
                x[t, h, j0] = x0 * c - x1 * s
                x[t, h, j1] = x0 * s + x1 * c


def rope_inplace(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, n_dims: int,
                 neox: bool) -> np.ndarray:
    """Rotates `x` (n_tokens, n_head, head_dim), C-contiguous float32, in place; returns it."""
    if x.ndim != 3 or x.dtype != np.float32 or not x.flags.c_contiguous:
        raise ValueError("rope: x must be C-contiguous float32 (n_tokens, n_head, head_dim)")
    if n_dims > x.shape[2] or cos.shape != (x.shape[0], n_dims // 2):
        raise ValueError(f"rope: tables {cos.shape} do not fit x {x.shape} with n_dims {n_dims}")
    _rope_apply(x, cos, sin, n_dims, bool(neox))
    return x


# ----------------------------------------------------------------------------- softmax / attention


# ggml_v_expf's constants (ARM's optimized-routines expf): 2^n by the exponent bits, times a
# degree-5 polynomial on the remainder; ~1.5 ulp, and a loop of it vectorizes
_EXP_SHIFT = np.float32(float.fromhex("0x1.8p23"))
_EXP_LOG2E = np.float32(float.fromhex("0x1.715476p+0"))
_EXP_LN2_HI = np.float32(float.fromhex("0x1.62e4p-1"))
_EXP_LN2_LO = np.float32(float.fromhex("0x1.7f7d1cp-20"))
_EXP_C = tuple(np.float32(float.fromhex(h)) for h in (
    "0x1.0e4020p-7", "0x1.573e2ep-5", "0x1.555e66p-3", "0x1.fffdb6p-2", "0x1.ffffecp-1"))
# 2^(n-1) must be a normal float: below _EXP_MIN the result is taken as 0, above _EXP_MAX it is inf
_EXP_MIN = np.float32(-86.5)
_EXP_MAX = np.float32(88.72283)  # log(FLT_MAX)


# contract only: reassociation would fold (x * log2e + shift) - shift into x * log2e
@numba.njit(cache=True, nogil=True, fastmath={"contract"})
def exp_f32(x):
    """exp(x) for float32 as ggml's vector expf computes it (~1.5 ulp); 0 below -86.5 (and for
    -inf), inf above log(FLT_MAX), NaN for NaN."""
    z = x * _EXP_LOG2E + _EXP_SHIFT
    n = z - _EXP_SHIFT  # x * log2(e) rounded to an integer
    b = x - n * _EXP_LN2_HI
    b = b - n * _EXP_LN2_LO
    u = b * b
    c4, c3, c2, c1, c0 = _EXP_C
    j = ((c4 * b + c3) * u + (c2 * b + c1)) * u + (c0 * b + np.float32(1.0))
    # z's low mantissa bits hold n: shifted into the exponent field of 0.5 they make 2^(n-1),
    # which stays finite for n = 128; the exact doubling after it gives 2^n
    half_scale = bits_f32((f32_bits(z) << np.uint32(23)) + np.uint32(0x3F000000))
    r = j * half_scale * np.float32(2.0)
    if x < _EXP_MIN:
        r = np.float32(0.0)
    elif x > _EXP_MAX:
        r = np.float32(np.inf)
    return r


@numba.njit(cache=True, nogil=True)
def _exp_values(x, out):
    for i in range(x.size):
        out[i] = exp_f32(x[i])


def exp_values(x: np.ndarray) -> np.ndarray:
    """exp_f32 over a float32 array (1-D)."""
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    out = np.empty_like(x)
    _exp_values(x, out)
    return out


@numba.njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _softcapped(x, softcap):
    """llama.cpp's attention logit soft-capping, tanh(x / cap) * cap as its graph computes it
    (ggml_scale by 1/cap, ggml_tanh, ggml_scale by cap); x itself when softcap is 0."""
    if softcap > np.float32(0.0):
        return math.tanh(x * (np.float32(1.0) / softcap)) * softcap
    return x


@numba.njit(cache=True, nogil=True, parallel=True, fastmath={"reassoc", "contract"},
            error_model="numpy")
def _softmax_masked(s, mask, scale, softcap, sinks):
    # s: (B, n, n_kv) scores, mask: (n, n_kv); rows in parallel (a prompt's chunk has hundreds);
    # sinks: (B,) logits joining each row's denominator, or empty
    b_count, n, n_kv = s.shape
    for r in numba.prange(b_count * n):
        b = r // n
        t = r % n
        mx = np.float32(-np.inf)
        for j in range(n_kv):
            v = _softcapped(s[b, t, j], softcap) * scale + mask[t, j]
            s[b, t, j] = v
            mx = max(mx, v)
        if sinks.size:
            mx = max(mx, sinks[b])
        for j in range(n_kv):
            s[b, t, j] = exp_f32(s[b, t, j] - mx)  # masked cells: exp(-inf) = 0
        total = 0.0
        for j in range(n_kv):
            total += np.float64(s[b, t, j])
        if sinks.size:
            total += np.float64(exp_f32(sinks[b] - mx))
        inv = np.float32(1.0 / total)
        for j in range(n_kv):
            s[b, t, j] *= inv


NO_SINKS = np.zeros(0, np.float32)  # what the kernels take for "no attention sinks"


def softmax_masked_inplace(s: np.ndarray, mask: np.ndarray, scale: float,
                           softcap: float = 0.0, sinks: np.ndarray | None = None) -> np.ndarray:
    """Row softmax of `s * scale + mask` over the last axis, in place (s soft-capped first when
    softcap > 0). s: (B, n, n_kv) float32 C-contiguous, mask: (n, n_kv) float32 (0 or -inf).
    sinks: float32 (B,), one logit per row group (attention head) that joins the softmax's
    maximum and denominator but weighs no value (ggml_soft_max_add_sinks, gpt-oss)."""
    _softmax_masked(s, np.ascontiguousarray(mask, dtype=np.float32), np.float32(scale),
                    np.float32(softcap), NO_SINKS if sinks is None else sinks)
    return s


# ----------------------------------------------------------------------------- gated activations


@numba.njit(inline="always")
def _swiglu_row(g, u, out, r):
    for i in range(g.shape[1]):
        x = g[r, i]
        out[r, i] = x / (np.float32(1.0) + exp_f32(-x)) * u[r, i]  # ggml_v_silu's form


@numba.njit(cache=True, nogil=True, parallel=True)
def _swiglu(g, u, out):
    for r in numba.prange(g.shape[0]):
        _swiglu_row(g, u, out, r)


@numba.njit(cache=True, nogil=True)
def _swiglu_here(g, u, out):
    for r in range(g.shape[0]):
        _swiglu_row(g, u, out, r)


def _gated(name: str, kernels, gate: np.ndarray, up: np.ndarray, *tables) -> np.ndarray:
    """kernel(gate, up, *tables, out) on float32 2-D arrays of one shape: a new array; kernels:
    (parallel over rows, on this thread), the second for a product too small to share."""
    g = np.ascontiguousarray(gate, dtype=np.float32)
    u = np.ascontiguousarray(up, dtype=np.float32)
    if g.shape != u.shape or g.ndim != 2:
        raise ValueError(f"{name}: gate {g.shape} and up {u.shape}")
    out = np.empty_like(g)
    kernels[g.size < PARALLEL_MIN_VALUES](g, u, *tables, out)
    return out


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up, float32, same shape (2-D)."""
    return _gated("swiglu", (_swiglu, _swiglu_here), gate, up)


@numba.njit(inline="always")
def _swiglu_oai_row(g, u, alpha, limit, out, r):
    for i in range(g.shape[1]):
        x = min(g[r, i], limit)
        y = min(max(u[r, i], -limit), limit)
        # libm's expf, as ggml's scalar loop
        out[r, i] = x / (np.float32(1.0) + math.exp(alpha * -x)) * (y + np.float32(1.0))


@numba.njit(cache=True, nogil=True, parallel=True)
def _swiglu_oai(g, u, alpha, limit, out):
    for r in numba.prange(g.shape[0]):
        _swiglu_oai_row(g, u, alpha, limit, out, r)


@numba.njit(cache=True, nogil=True)
def _swiglu_oai_here(g, u, alpha, limit, out):
    for r in range(g.shape[0]):
        _swiglu_oai_row(g, u, alpha, limit, out, r)


def swiglu_oai(gate: np.ndarray, up: np.ndarray, alpha: float, limit: float) -> np.ndarray:
    """gpt-oss's clamped SwiGLU (ggml_compute_forward_swiglu_oai_f32): x = min(gate, limit),
    y = clamp(up, -limit, limit), x · sigmoid(alpha · x) · (y + 1); float32, 2-D."""
    return _gated("swiglu_oai", (_swiglu_oai, _swiglu_oai_here), gate, up, np.float32(alpha),
                  np.float32(limit))




# the table index: x rounded to fp16 as F16C rounds (the CPU's instruction where there is one)
_fp16_index = fp32_to_fp16_hw if HAS_HW_FP16 else fp32_to_fp16


@numba.njit(inline="always")
def _geglu_row(g, u, table, out, r):
    for i in range(g.shape[1]):
        x = g[r, i]
        y = table[_fp16_index(x)] * u[r, i]  # branch-free, so the loop vectorizes
        if x <= -10.0:
            y = np.float32(0.0)
        elif x >= 10.0:
            y = x * u[r, i]
        out[r, i] = y


@numba.njit(cache=True, nogil=True, parallel=True)
def _geglu_table(g, u, table, out):
    for r in numba.prange(g.shape[0]):
        _geglu_row(g, u, table, out, r)


@numba.njit(cache=True, nogil=True)
def _geglu_table_here(g, u, table, out):
    for r in range(g.shape[0]):
        _geglu_row(g, u, table, out, r)


@numba.njit(cache=True, nogil=True, parallel=True)
def _gelu_table(x, table, out, serial):
    threads = threads_get()
    if serial:
        threads_set(1)
    n, d = x.shape
    for r in numba.prange(n):
        for i in range(d):
            v = x[r, i]
            y = table[_fp16_index(v)]
            if v <= -10.0:
                y = np.float32(0.0)
            elif v >= 10.0:
                y = v
            out[r, i] = y
    if serial:
        threads_set(threads)


def gelu(x: np.ndarray) -> np.ndarray:
    """gelu_tanh(x) as ggml's CPU computes it (ggml_vec_gelu_f32 with GGML_GELU_FP16: the fp16
    table), float32, same shape (BERT's FFN)."""
    x2 = np.ascontiguousarray(x, dtype=np.float32)
    flat = x2.reshape(-1, x2.shape[-1]) if x2.ndim else x2.reshape(1, 1)
    out = np.empty_like(flat)
    _gelu_table(flat, GELU_F16_TABLE, out, flat.size < PARALLEL_MIN_VALUES)
    return out.reshape(x2.shape)


def geglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gelu_tanh(gate) * up as ggml's CPU computes it (fp16 GELU table), float32 (2-D)."""
    return _gated("geglu", (_geglu_table, _geglu_table_here), gate, up, GELU_F16_TABLE)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """Exact tanh-form GELU in float32 (reference for tests)."""
    x = np.asarray(x, dtype=np.float32)
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(
        GELU_SQRT_2_OVER_PI * x * (np.float32(1.0) + GELU_COEF_A * x * x)))


# ----------------------------------------------------------------------------- f16 / Q8_0 rows
# F16_TO_F32 (imported above) is inference/quants' table, the engine's one.


@numba.njit(cache=True, nogil=True)
def _f16_rows_to_f32(bits, lut, out):
    n, d = bits.shape
    for r in range(n):
        for i in range(d):
            out[r, i] = lut[bits[r, i]]


def f16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """uint16 fp16 bit patterns (rows, d) -> float32 (rows, d)."""
    out = np.empty(bits.shape, np.float32)
    if bits.size:
        _f16_rows_to_f32(bits, F16_TO_F32, out)
    return out


def f32_to_f16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> uint16 fp16 bit patterns, round to nearest even (GGML_FP32_TO_FP16)."""
    return _f32_to_f16_bits(np.asarray(x, dtype=np.float32))


# Q8_0's values and bytes per block (its class's catalog geometry; compile-time constants of the
# kernels below)
QK8_0, Q8_0_BLOCK_BYTES = Q8_0.block_size, Q8_0.type_size


def quantize_q8_0_rows(x: np.ndarray) -> np.ndarray:
    """float32 (rows, d) -> Q8_0 bytes (rows, d / QK8_0 * Q8_0_BLOCK_BYTES), as ggml's quantize_row_q8_0_ref:
    d = amax/127 stored as fp16, q = roundf(x * (1/d)) with the float32 d."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, d = x.shape
    if d % QK8_0:
        raise ValueError(f"Q8_0: a row of {d} values is not a whole number of {QK8_0}-blocks")
    nb = d // QK8_0
    xb = x.reshape(rows, nb, QK8_0)
    amax = np.abs(xb).max(axis=2)
    dd = amax / np.float32(127.0)
    with np.errstate(divide="ignore"):
        inv = np.where(dd != 0, np.float32(1.0) / dd, np.float32(0.0)).astype(np.float32)
    v = (xb * inv[:, :, None]).astype(np.float64)
    q = np.trunc(v + np.copysign(0.5, v)).astype(np.int8)  # roundf: half away from zero
    out = np.empty((rows, nb, Q8_0_BLOCK_BYTES), np.uint8)
    out[:, :, :2] = dd.astype(np.float16).view(np.uint8).reshape(rows, nb, 2)
    out[:, :, 2:] = q.view(np.uint8)
    return out.reshape(rows, nb * Q8_0_BLOCK_BYTES)


@numba.njit(cache=True, nogil=True)
def _dequantize_q8_0(raw, lut, out):
    n, d = out.shape
    nb = d // QK8_0
    for r in range(n):
        for b in range(nb):
            o = b * Q8_0_BLOCK_BYTES
            scale = lut[np.uint16(raw[r, o]) | (np.uint16(raw[r, o + 1]) << np.uint16(8))]
            for j in range(QK8_0):
                q = np.int32(raw[r, o + 2 + j])
                if q >= 128:
                    q -= 256
                out[r, b * QK8_0 + j] = np.float32(q) * scale


def dequantize_q8_0_rows(raw: np.ndarray, d: int) -> np.ndarray:
    """Q8_0 bytes (rows, d / QK8_0 * Q8_0_BLOCK_BYTES) -> float32 (rows, d)."""
    out = np.empty((raw.shape[0], d), np.float32)
    if raw.shape[0]:
        _dequantize_q8_0(raw, F16_TO_F32, out)
    return out


def rope_apply(x: np.ndarray, pos: np.ndarray, spec: RopeSpec, magnitude: bool = True) -> np.ndarray:
    """Rotates x (n_tokens, n_head, head_dim) in place for positions `pos` as `spec` says;
    returns it. magnitude=False rotates only: moving an already rotated K by a position shift
    must not multiply it by the magnitude again (llama.cpp's K-shift does, with YaRN or
    rope.scaling.attn_factor; a K so shifted would no longer be the K of its new position)."""
    cos, sin = rope_tables(pos, spec, magnitude)
    return rope_inplace(x, cos, sin, spec.n_dims, spec.neox)
