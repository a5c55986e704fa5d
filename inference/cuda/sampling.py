"""Greedy sampling on the device: the token id of each row of logits, so that a greedy decode
step sends 4 bytes per sequence to the host instead of n_vocab * 4.

llama.cpp 11434 samples on the backend the same way: its greedy sampler's backend_apply
(src/llama-sampler.cpp, llama_sampler_greedy_backend_apply) puts a ggml_argmax over the logits in
the graph (ggml-cuda/argmax.cu argmax_f32), and only the sampled token is read back. The answer
here is the host's, llamatui.inference.sampling.Sampler._sample_greedy over raw logits:

- the largest logit, the lowest token id among equal ones (numpy's argmax; llama.cpp's greedy
  sampler also keeps the first of equal maxima);
- a row holding a NaN or an infinity gives NO_TOKEN: the scheduler refuses such logits before it
  samples (NonFiniteLogitsError, after its `all_finite` check), whatever the sampler.
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from .device import NEG_INF, ONE, SIMULATED, WARP, ZERO, block_max, shfl_xor_f32, shfl_xor_i32

# threads per block: one block per row (the simulator runs each thread as a Python thread)
GREEDY_THREADS = 64 if SIMULATED else 1024
NO_TOKEN = -1  # the row held a NaN or an infinity
_INF = np.float32(np.inf)


@cuda.jit
def greedy_kernel(logits, out):
    """out[r] = the lowest index of row r's largest logit, NO_TOKEN when the row holds a NaN or
    an infinity: one block per row, each thread scans a stride (ggml-cuda's argmax_f32), then
    (value, index) pairs meet in warp shuffles and shared memory, lower index first on ties,
    and the rows' non-finite flags in a block maximum."""
    best_v = cuda.shared.array(WARP, np.float32)
    best_i = cuda.shared.array(WARP, np.int32)
    flags = cuda.shared.array(WARP, np.float32)
    r = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    lane = tid % WARP
    n = logits.shape[1]
    v = NEG_INF
    idx = np.int32(n)
    bad = ZERO
    for j in range(tid, n, cuda.blockDim.x):
        x = logits[r, j]
        if x != x or x == _INF or x == NEG_INF:
            bad = ONE
        elif x > v:  # (a thread's own indices rise: its first maximum stays)
            v = x
            idx = np.int32(j)
    for stage in range(2):  # within each warp, then across the warps' winners
        for lane_mask in (16, 8, 4, 2, 1):
            ov = shfl_xor_f32(v, lane_mask)
            oi = shfl_xor_i32(idx, lane_mask)
            if ov > v or (ov == v and oi < idx):
                v = ov
                idx = oi
        if stage == 0:
            if lane == 0:
                best_v[tid // WARP] = v
                best_i[tid // WARP] = idx
            cuda.syncthreads()
            if lane < (cuda.blockDim.x + WARP - 1) // WARP:
                v = best_v[lane]
                idx = best_i[lane]
            else:
                v = NEG_INF
                idx = np.int32(n)
    bad = block_max(bad, flags)
    if tid == 0:
        out[r] = np.int32(NO_TOKEN) if bad > ZERO else idx


def greedy_tokens(logits, out, stream=0):
    """out[r] = the greedy token of row r of logits (n, n_vocab) float32, or NO_TOKEN for a row
    with a NaN or an infinity; out int32 (n,). Returns out."""
    if logits.dtype != np.float32 or len(logits.shape) != 2 or not logits.shape[1]:
        raise ValueError(f"greedy_tokens: logits must be float32 (n, n_vocab), got "
                         f"{logits.dtype} {tuple(logits.shape)}")
    if tuple(out.shape) != (logits.shape[0],) or out.dtype != np.int32:
        raise ValueError(f"greedy_tokens: {tuple(logits.shape)} logits into out {out.dtype} "
                         f"{tuple(out.shape)}")
    if logits.shape[0]:
        greedy_kernel[logits.shape[0], GREEDY_THREADS, stream](logits, out)
    return out
