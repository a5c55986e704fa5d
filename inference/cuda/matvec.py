"""Decode matrix-vector products on the device: dequantize and dot in one pass over the weights.

`matvec(type, w, x, out)`: out[t, r] = x[t] . W[r] for up to MAX_TOKENS tokens, straight from the
GGUF bytes of W on the device, as ggml's mul_mat_vec_q (ggml-cuda/mmvq.cu) does for decoding.
One warp per output row: lane l decodes 16-value chunks l, l + 32, ... of the row (neighbouring
lanes read neighbouring bytes, so a warp's loads cover a contiguous stretch of the row), dots
each chunk with every token's activations, and the lanes' partial sums meet in a warp shuffle
reduction. Each weight row is read once for all tokens. (Under the simulator a row gets 4 lanes
instead of 32: the same kernel, with 8 times fewer Python threads to run.)

Activations stay float32 (ggml quantizes them to q8_1 for dp4a), so results equal a float64
product with the dequantized weights up to float32 rounding, like the CPU's decode kernels.
More tokens (a prompt) go through `dequantize_rows` to fp16 tiles and cuBLAS instead.
"""
from __future__ import annotations

import numpy as np
from numba import cuda, types

from .dequant import CHUNK, check_weight, device_type
from .device import SIMULATED, WARP, ZERO, lanes_sum

MAX_TOKENS = 8  # the most tokens one launch multiplies (mmvq.cu's MMVQ_MAX_BATCH_SIZE)
LANES = 4 if SIMULATED else WARP  # threads per output row
ROWS_PER_BLOCK = 8 if SIMULATED else 4  # output rows per thread block


def _make_matvec_kernel(dt):
    decoder, block_bytes, cpb = dt.decoder, dt.block_bytes, dt.chunks_per_block

    @cuda.jit
    def matvec_kernel(w, x, out):
        """out[t, r] = x[t] . W[r]: lane group r % ROWS_PER_BLOCK of block r // ROWS_PER_BLOCK."""
        lane = cuda.threadIdx.x % LANES
        r = cuda.blockIdx.x * ROWS_PER_BLOCK + cuda.threadIdx.x // LANES
        n_tok = x.shape[0]
        in_range = r < out.shape[1]
        acc = cuda.local.array(MAX_TOKENS, types.float32)
        for t in range(MAX_TOKENS):  # constant trip counts: the accumulators stay in registers
            acc[t] = ZERO
        vals = cuda.local.array(CHUNK, types.float32)
        if in_range:
            for c in range(lane, x.shape[1] // CHUNK, LANES):
                decoder(w, r, (c // cpb) * block_bytes, c % cpb, vals)
                for t in range(MAX_TOKENS):
                    if t < n_tok:
                        s = ZERO
                        for j in range(CHUNK):
                            s += vals[j] * x[t, CHUNK * c + j]
                        acc[t] += s
        for t in range(MAX_TOKENS):  # every lane reduces: the shuffles need the whole warp
            if t < n_tok:
                total = lanes_sum(acc[t], LANES)
                if lane == 0 and in_range:
                    out[t, r] = total

    return matvec_kernel


_matvec_kernels: dict[str, object] = {}


def matvec_kernel(type_name: str):
    """The fused dequantize-dot kernel of a weight type (built on first use)."""
    kernel = _matvec_kernels.get(type_name)
    if kernel is None:
        kernel = _matvec_kernels[type_name] = _make_matvec_kernel(device_type(type_name))
    return kernel


def matvec(type_name: str, w, x, out, stream=0):
    """out = x @ W.T for a weight in its GGUF encoding.

    w: uint8 (n_out, row_bytes); x: float32 (n_tok, n_in), n_tok <= MAX_TOKENS; out: float32
    (n_tok, n_out), written. Device arrays (anything with __cuda_array_interface__), or numpy
    arrays under the simulator. Returns out.
    """
    dt = device_type(type_name)
    n_tok, n_in = x.shape
    check_weight(dt, w, n_in)
    if x.dtype != np.float32 or out.dtype != np.float32:
        raise ValueError(f"matvec: x and out must be float32, got {x.dtype} and {out.dtype}")
    if not 0 < n_tok <= MAX_TOKENS:
        raise ValueError(f"matvec: {n_tok} tokens; one launch takes 1 to {MAX_TOKENS} "
                         f"(prompts go through dequantize_rows and a GEMM)")
    if tuple(out.shape) != (n_tok, w.shape[0]):
        raise ValueError(f"matvec: out of shape {tuple(out.shape)} for {n_tok} tokens and "
                         f"{w.shape[0]} rows")
    grid = (w.shape[0] + ROWS_PER_BLOCK - 1) // ROWS_PER_BLOCK
    matvec_kernel(type_name)[grid, ROWS_PER_BLOCK * LANES, stream](w, x, out)
    return out
