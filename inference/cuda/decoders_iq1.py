"""CUDA decoders of IQ1_S and IQ1_M (layouts in inference/quants/iq1.py): chunk c is half c % 2
of sub-block c // 2, two grid points of 8 values -1, 0, 1 plus a delta of +-1/8, scaled as
ggml's dequantize_row_iq1_s / _m (ggml-cuda's dequantize_block_iq1_s / _m) do; bit for bit the
CPU's dequantization.
"""
from __future__ import annotations

import numpy as np

from ..quants.grids import IQ1S_DELTA, IQ1S_GRID
from ..quants.iq1 import IQ1_M, IQ1_S
from .blocks import CHUNK, decoder
from .device import device_function, half_at, half_to_f32, u16_at

# (2048, 8) int8: the grid's values (16 KiB: float32 would fill all of constant memory)
IQ1S_POINTS = IQ1S_GRID.astype("<u8").view(np.int8).reshape(-1, 8).copy()
DELTA = IQ1S_DELTA  # ggml's IQ1S_DELTA, for IQ1_M too (as its dequantize_row_iq1_m)


@decoder(IQ1_S)
@device_function
def iq1_s(w, row, offset, chunk, vals):
    """d, qs[32] (low index bits), qh[8] u16 (3 high index bits per group, the scale s in bits
    12..14, the delta's sign in bit 15); y = d * (2 * s + 1) * (grid + delta)."""
    ib = chunk // 2
    qh = u16_at(w, row, offset + 34 + 2 * ib)
    dl = half_at(w, row, offset) * np.float32(2 * ((qh >> 12) & 7) + 1)
    delta = -DELTA if qh & 0x8000 else DELTA
    for t in range(CHUNK):
        group = 2 * (chunk % 2) + t // 8
        g = np.int32(w[row, offset + 2 + 4 * ib + group]) | np.int32(((qh >> (3 * group)) & 7) << 8)
        vals[t] = dl * (np.float32(IQ1S_POINTS[g, t % 8]) + delta)


@decoder(IQ1_M)
@device_function
def iq1_m(w, row, offset, chunk, vals):
    """qs[32], qh[16] (per group 3 high index bits and the delta's sign), scales[8] (four u16:
    3-bit scales, their top nibbles the fp16 d); y = d * (2 * s + 1) * (grid + delta)."""
    ib = chunk // 2
    bits = (u16_at(w, row, offset + 48) >> 12) | ((u16_at(w, row, offset + 50) >> 8) & 0x00F0) \
        | ((u16_at(w, row, offset + 52) >> 4) & 0x0F00) | (u16_at(w, row, offset + 54) & 0xF000)
    sc = u16_at(w, row, offset + 48 + 2 * (ib // 2)) >> (6 * (ib % 2) + 3 * (chunk % 2))
    dl = half_to_f32(bits) * np.float32(2 * (sc & 7) + 1)
    qh = np.int32(w[row, offset + 32 + chunk])
    for t in range(CHUNK):
        h = qh >> (4 * (t // 8))
        g = np.int32(w[row, offset + 4 * ib + 2 * (chunk % 2) + t // 8]) | ((h & 7) << 8)
        vals[t] = dl * (np.float32(IQ1S_POINTS[g, t % 8]) + (-DELTA if h & 8 else DELTA))
