"""TQ1_0's and TQ2_0's CUDA decoders (`@decoder(...)`, see blocks.py): ggml-cuda/convert.cu's
dequantize_block_tq1_0 / tq2_0, bit for bit the CPU's dequantization (inference/quants/ternary.py
describes the layouts). y = (t - 1) * d, t a trit 0..2.
"""
from __future__ import annotations

import numpy as np

from ..quants.ternary import POW3, TQ1_0, TQ1_D, TQ1_QS, TQ2_0, TQ2_QS
from .blocks import CHUNK, decoder
from .device import device_function, half_at


@device_function
def trit(b, p):
    """The trit that multiplier p (3**n) brings to the top of byte b: ((b * p) & 255) * 3 >> 8."""
    return (((b * p) & 0xFF) * 3) >> 8


@decoder(TQ1_0)
@device_function
def tq1_0(w, row, offset, chunk, vals):
    """Chunks 0..9: trit chunk // 2 of qs[16 * (chunk % 2) + t]; 10..14: trit chunk - 10 of
    qs[32 + t]; 15: trit t // 4 of qh[t % 4]."""
    d = half_at(w, row, offset + TQ1_D)
    for t in range(CHUNK):
        if chunk < 10:
            b, p = w[row, offset + 16 * (chunk % 2) + t], POW3[chunk // 2]
        elif chunk < 15:
            b, p = w[row, offset + 32 + t], POW3[chunk - 10]
        else:
            b, p = w[row, offset + TQ1_QS + t % 4], POW3[t // 4]
        vals[t] = np.float32(trit(np.int32(b), p) - 1) * d


@decoder(TQ2_0)
@device_function
def tq2_0(w, row, offset, chunk, vals):
    """Chunk c = 8h + 2l + k: bits 2l of qs[32h + 16k + t], minus 1."""
    d = half_at(w, row, offset + TQ2_QS)
    base = offset + 32 * (chunk // 8) + 16 * (chunk % 2)
    shift = 2 * ((chunk % 8) // 2)
    for t in range(CHUNK):
        q = (np.int32(w[row, base + t]) >> shift) & 3
        vals[t] = np.float32(q - 1) * d
