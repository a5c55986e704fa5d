"""Kernels of the Gated DeltaNet layers (Qwen 3.5's linear attention), CPU, numba, each following
the ggml CPU op llama.cpp runs for them (ggml/src/ggml-cpu/ops.cpp):

- `ssm_conv`: ggml_compute_forward_ssm_conv_f32 over one sequence — the causal depthwise
  convolution of each channel with its `d_conv` taps, the channel's last `d_conv - 1` inputs
  (the conv state) in front of the new ones; the sum in float32, tap by tap, as ggml's loop
  (not ggml_vec_dot_f32). Returns the new conv state too (the last `d_conv - 1` inputs), as
  delta-net-base.cpp's build_conv_state copies it back into the recurrent memory.
- `gated_delta_net`: ggml_compute_forward_gated_delta_net_f32, the gated delta rule token by
  token over one sequence, its state updated in place:
      S ← exp(g)·S;  d = β·(v − Sᵀk);  S ← S + k dᵀ;  o = Sᵀq / sqrt(S_k)
  with the state kept as ggml keeps it, transposed (`state[h, j, i]` = S[i][j]: row j is the
  column of value dimension j), and value head h reading query/key head h % H_k (Qwen 3.5's
  ggml_repeat of the K heads). One kernel serves a prompt and a decode step alike: llama.cpp's
  CPU backend takes its fused op for both (cparams.fused_gdn_ar / fused_gdn_ch), which is this
  recurrence, not the chunked matrix form of build_delta_net_chunking. (A chunked kernel in
  that form — WY forward substitution per 64-token chunk, products through BLAS — agreed to
  3e-7 but ran 3x slower on 512 tokens of 32 heads x 128 here: the recurrence, vectorized,
  costs about 70 us per token and layer at that size, a few percent of the layer's
  products.) Its dot products may be summed in any order (fastmath "reassoc": SIMD lanes), as
  ggml_vec_dot_f32's are.
"""
from __future__ import annotations

import math

import numba
import numpy as np

__all__ = ["gated_delta_net", "ssm_conv"]


@numba.njit(cache=True, nogil=True, parallel=True)
def _ssm_conv(state, x, w, out, new_state):
    n, n_ch = x.shape
    d_conv = w.shape[1]
    keep = d_conv - 1
    for t in numba.prange(n):  # rows of x are contiguous: channels innermost
        for c in range(n_ch):
            s = np.float32(0.0)
            for i in range(d_conv):
                j = t + i - keep  # the input's row; before the batch: the conv state
                s += (x[j, c] if j >= 0 else state[c, keep + j]) * w[c, i]
            out[t, c] = s
    for c in range(n_ch):
        for i in range(keep):
            j = n - keep + i
            new_state[c, i] = x[j, c] if j >= 0 else state[c, keep + j]


def ssm_conv(state: np.ndarray, x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The convolution of one sequence's new inputs x, float32 (n, n_ch), behind its conv state
    (n_ch, d_conv - 1) with the taps w (n_ch, d_conv): (out (n, n_ch), new state)."""
    n, n_ch = x.shape
    out = np.empty((n, n_ch), np.float32)
    new_state = np.empty_like(state)
    _ssm_conv(np.ascontiguousarray(state, np.float32), np.ascontiguousarray(x, np.float32),
              np.ascontiguousarray(w, np.float32), out, new_state)
    return out, new_state


@numba.njit(cache=True, nogil=True, parallel=True, error_model="numpy",
           fastmath={"reassoc"})
def _gated_delta_net(q, k, v, g, beta, state, out):
    n, h_v, s_v = v.shape
    h_k = q.shape[1]
    scale = np.float32(1.0) / np.float32(math.sqrt(s_v))
    for h in numba.prange(h_v):
        hk = h % h_k
        m = state[h]
        delta = np.empty(s_v, np.float32)
        for t in range(n):
            decay = np.float32(math.exp(g[t, h]))
            b = beta[t, h]
            for j in range(s_v):
                acc = np.float32(0.0)
                for i in range(s_v):
                    m[j, i] *= decay
                    acc += m[j, i] * k[t, hk, i]
                delta[j] = (v[t, h, j] - acc) * b
            for j in range(s_v):
                dj = delta[j]
                acc = np.float32(0.0)
                for i in range(s_v):
                    m[j, i] += k[t, hk, i] * dj
                    acc += m[j, i] * q[t, hk, i]
                out[t, h, j] = acc * scale


def gated_delta_net(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray,
                    beta: np.ndarray, state: np.ndarray) -> np.ndarray:
    """One sequence's n tokens through the gated delta rule: q, k float32 (n, H_k, S), v
    (n, H_v, S), g (log decay) and beta (n, H_v); `state` float32 (H_v, S, S), contiguous, is
    updated in place. Returns the output (n, H_v, S)."""
    n, h_v, s_v = v.shape
    if q.shape[2] != s_v or h_v % q.shape[1]:
        raise ValueError(f"gated_delta_net: q {q.shape} does not fit v {v.shape}")
    if state.shape != (h_v, s_v, s_v) or not state.flags.c_contiguous:
        raise ValueError(f"gated_delta_net: state {state.shape} for v {v.shape}")
    out = np.empty((n, h_v, s_v), np.float32)
    f32 = np.float32
    _gated_delta_net(np.ascontiguousarray(q, f32), np.ascontiguousarray(k, f32),
                     np.ascontiguousarray(v, f32), np.ascontiguousarray(g, f32),
                     np.ascontiguousarray(beta, f32), state, out)
    return out
