"""RMS norm, RoPE and the gated activations on the device.

Each kernel computes what its CPU twin in `llamatui.inference.cpu.ops` computes, in float32:
- `rms_norm`: y = x / sqrt(mean(x²) + eps) * w, one block per row (ggml-cuda/norm.cu
  rms_norm_f32); the sum of squares is a float32 tree sum (the CPU sums in float64).
- `rope`: NORM (pairs 2i, 2i+1) or NEOX (pairs i, i + n_dims/2) rotation in place, with
  frequency factors and YaRN (ggml-cuda/rope.cu rope_norm / rope_neox, rope_yarn). The angle is
  built as ggml's CPU rope cache builds it, `theta = pos` multiplied by theta_scale once per
  pair, so the angles are bit for bit the CPU's (rope.cu's powf gives slightly different ones at
  long positions). Products that feed a sum (YaRN's mix, the rotation) are rounded on their
  own (`mul_rn`): NVVM would fuse them into FMAs, which the CPU never does, and a fused mix moves
  a far position's angle by one rounding of the angle (about 1e-3 radians at position 30000).
  The simulator computes in numpy, which never fuses: only a GPU shows the difference.
- `swiglu`: silu(g) * u (ggml-cuda/unary.cu swiglu); `swiglu_oai`: gpt-oss's clamped form
  (unary.cu swiglu_oai_kernel).
- `geglu`: gelu_tanh(g) * u through ggml's fp16 GELU table as the CPU computes it (g rounded to
  fp16 indexes the table; exact beyond ±10): bit for bit cpu.ops.geglu.
(The argmax of greedy sampling is sampling.py's.)
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda

from ..quants.fp16 import GELU_F16_TABLE
from .device import ONE, SIMULATED, WARP, ZERO, block_sum, f32_to_half_bits, mul_rn

# threads per block; the simulator runs each thread as a Python thread and each barrier as a
# polling round over them, so it gets one warp (the kernels take any whole number of warps)
NORM_THREADS = 32 if SIMULATED else 256
ELEMENT_THREADS = 256
_TEN = np.float32(10.0)
_MINUS_TEN = np.float32(-10.0)


def _blocks(n: int, threads: int) -> int:
    return (n + threads - 1) // threads


def _check_f32(name: str, **arrays) -> None:
    for label, a in arrays.items():
        if a.dtype != np.float32:
            raise ValueError(f"{name}: {label} must be float32, got {a.dtype}")


# ----------------------------------------------------------------------------- RMS norm


@cuda.jit
def rms_norm_kernel(x, w, eps, out):
    """out[r] = (x[r] * (1 / sqrt(mean(x[r]²) + eps))) * w: block r, threads striding the row."""
    scratch = cuda.shared.array(WARP, np.float32)
    r = cuda.blockIdx.x
    d = x.shape[1]
    s = ZERO
    for i in range(cuda.threadIdx.x, d, cuda.blockDim.x):
        s += x[r, i] * x[r, i]
    total = block_sum(s, scratch)
    scale = ONE / math.sqrt(total / np.float32(d) + eps)
    for i in range(cuda.threadIdx.x, d, cuda.blockDim.x):
        out[r, i] = (x[r, i] * scale) * w[i]


def rms_norm(x, w, eps: float, out, stream=0):
    """RMS norm of the rows of x (n, d) times w (d,) into out (n, d); float32. Returns out."""
    _check_f32("rms_norm", x=x, w=w, out=out)
    if len(x.shape) != 2 or tuple(w.shape) != (x.shape[1],) or out.shape != x.shape:
        raise ValueError(f"rms_norm: x {tuple(x.shape)}, w {tuple(w.shape)}, "
                         f"out {tuple(out.shape)}")
    if x.shape[0]:
        rms_norm_kernel[x.shape[0], NORM_THREADS, stream](x, w, np.float32(eps), out)
    return out


# ----------------------------------------------------------------------------- RoPE


@cuda.jit
def _rope_kernel(x, pos, freq_factors, theta_scale, freq_scale, n_dims, neox, corr_lo, corr_hi,
                ext_factor, mscale):
    """Rotates pair i of head h of token t (one thread each) by freq_scale * theta / ff[i]
    (YaRN's ramp back to theta / ff[i] when ext_factor is set), cos and sin times mscale."""
    k = cuda.grid(1)
    n_tok, n_head, _ = x.shape
    half = n_dims // 2
    if k >= n_tok * n_head * half:
        return
    i = k % half
    h = (k // half) % n_head
    t = k // (half * n_head)
    theta = np.float32(pos[t])
    for _ in range(i):  # the CPU's rope cache: theta_scale applied once per pair
        theta = theta * theta_scale
    extrap = theta / freq_factors[i]
    angle = freq_scale * extrap
    if ext_factor != 0:  # cpu.ops.rope_tables' YaRN mix, in the same float32 steps
        one = np.float32(1.0)
        y = (np.float32(i) - corr_lo) / max(np.float32(0.001), corr_hi - corr_lo)
        mix = (one - min(one, max(np.float32(0.0), y))) * ext_factor
        angle = mul_rn(angle, one - mix) + mul_rn(extrap, mix)
    c = math.cos(angle) * mscale
    s = math.sin(angle) * mscale
    if neox:
        j0 = i
        j1 = i + half
    else:
        j0 = 2 * i
        j1 = 2 * i + 1
    x0 = x[t, h, j0]
    x1 = x[t, h, j1]
    x[t, h, j0] = mul_rn(x0, c) - mul_rn(x1, s)
    x[t, h, j1] = mul_rn(x0, s) + mul_rn(x1, c)


def rope(x, pos, spec, freq_factors, stream=0):
    """Rotates x (n_tok, n_head, head_dim) float32 in place for positions `pos` (n_tok,) with
    the layer's `RopeSpec`. `freq_factors`: the spec's factors as a device float32 array of
    n_dims/2 (ones when the spec has none). Returns x."""
    _check_f32("rope", x=x, freq_factors=freq_factors)
    half = spec.n_dims // 2
    if len(x.shape) != 3 or spec.n_dims > x.shape[2] or spec.n_dims % 2:
        raise ValueError(f"rope: x {tuple(x.shape)} with n_dims {spec.n_dims}")
    if tuple(pos.shape) != (x.shape[0],) or tuple(freq_factors.shape) != (half,):
        raise ValueError(f"rope: {tuple(pos.shape)} positions and {tuple(freq_factors.shape)} "
                         f"frequency factors for x {tuple(x.shape)} with n_dims {spec.n_dims}")
    n = x.shape[0] * x.shape[1] * half
    if n:
        corr_lo, corr_hi = spec.yarn_corr_dims()
        _rope_kernel[_blocks(n, ELEMENT_THREADS), ELEMENT_THREADS, stream](
            x, pos, freq_factors, spec.theta_scale(), np.float32(spec.freq_scale), spec.n_dims,
            spec.neox, corr_lo, corr_hi, np.float32(spec.ext_factor), spec.mscale())
    return x


# ----------------------------------------------------------------------------- gated activations


@cuda.jit
def swiglu_kernel(g, u, out):
    """out = g / (1 + exp(-g)) * u, one thread per value (ggml_v_silu's form)."""
    k = cuda.grid(1)
    d = g.shape[1]
    if k < g.shape[0] * d:
        r = k // d
        i = k % d
        x = g[r, i]
        out[r, i] = x / (ONE + math.exp(-x)) * u[r, i]


@cuda.jit
def swiglu_oai_kernel(g, u, alpha, limit, out):
    """x = min(g, limit), y = clamp(u, -limit, limit): out = x / (1 + exp(-alpha x)) * (y + 1),
    one thread per value (cpu.ops._swiglu_oai)."""
    k = cuda.grid(1)
    d = g.shape[1]
    if k < g.shape[0] * d:
        r = k // d
        i = k % d
        x = min(g[r, i], limit)
        y = min(max(u[r, i], -limit), limit)
        out[r, i] = x / (ONE + math.exp(alpha * -x)) * (y + ONE)


@cuda.jit
def geglu_kernel(g, u, table, out):
    """out = table[fp16(g)] * u, 0 for g <= -10 and g * u for g >= 10 (cpu.ops._geglu_table)."""
    k = cuda.grid(1)
    d = g.shape[1]
    if k < g.shape[0] * d:
        r = k // d
        i = k % d
        x = g[r, i]
        if x <= _MINUS_TEN:
            out[r, i] = ZERO
        elif x >= _TEN:
            out[r, i] = x * u[r, i]
        else:
            out[r, i] = table[f32_to_half_bits(x)] * u[r, i]


def _gated(name, kernel, gate, up, out, stream, *tables):
    _check_f32(name, gate=gate, up=up, out=out)
    if len(gate.shape) != 2 or up.shape != gate.shape or out.shape != gate.shape:
        raise ValueError(f"{name}: gate {tuple(gate.shape)}, up {tuple(up.shape)}, "
                         f"out {tuple(out.shape)}")
    n = gate.shape[0] * gate.shape[1]
    if n:
        kernel[_blocks(n, ELEMENT_THREADS), ELEMENT_THREADS, stream](gate, up, *tables, out)
    return out


def swiglu(gate, up, out, stream=0):
    """silu(gate) * up into out; float32 (n, d). Returns out."""
    return _gated("swiglu", swiglu_kernel, gate, up, out, stream)


def swiglu_oai(gate, up, alpha, limit, out, stream=0):
    """gpt-oss's clamped SwiGLU of gate and up into out; float32 (n, d). Returns out."""
    return _gated("swiglu_oai", swiglu_oai_kernel, gate, up, out, stream, np.float32(alpha),
                  np.float32(limit))


GELU_TABLE = GELU_F16_TABLE  # host copy of ggml's fp16 GELU table; the backend uploads it once


def geglu(gate, up, out, table, stream=0):
    """gelu_tanh(gate) * up into out as ggml's CPU computes it; `table`: GELU_TABLE on the device
    (float32, 65536). Returns out."""
    if tuple(table.shape) != (1 << 16,):
        raise ValueError(f"geglu: the GELU table has {tuple(table.shape)} values, not 65536")
    return _gated("geglu", geglu_kernel, gate, up, out, stream, table)
