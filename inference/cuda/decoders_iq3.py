"""CUDA decoders of IQ3_XXS and IQ3_S (layouts in inference/quants/iq3.py): chunk c is half c % 2
of sub-block c // 2, four grid points of 4 magnitudes, signed and scaled as ggml's
dequantize_row_iq3_xxs / _s (and ggml-cuda's dequantize_block_iq3_xxs / _s) do; bit for bit
the CPU's dequantization (the sign applied to the integer grid value, as there).
"""
from __future__ import annotations

import numpy as np

from ..quants.iq3 import IQ3_S, IQ3_XXS, IQ3S_VALUES, IQ3XXS_VALUES, KSIGNS
from .blocks import CHUNK, decoder
from .device import device_function, half_at, u16_at, u32_at

HALF = np.float32(0.5)


@decoder(IQ3_XXS)
@device_function
def iq3_xxs(w, row, offset, chunk, vals):
    """d, qs[64] (grid indices), then per sub-block a u32: four 7-bit ksigns indices and the
    scale s in bits 28..31; y = d * (0.5 + s) * 0.5 * grid * sign."""
    ib = chunk // 2
    aux = u32_at(w, row, offset + 66 + 4 * ib)
    db = half_at(w, row, offset) * (HALF + np.float32(aux >> 28)) * HALF
    base = offset + 2 + 8 * ib + 4 * (chunk % 2)
    for t in range(CHUNK):
        signs = KSIGNS[(aux >> (7 * (2 * (chunk % 2) + t // 8))) & 127]
        q = IQ3XXS_VALUES[w[row, base + t // 4], t % 4]
        vals[t] = db * np.float32(-q if (signs >> (t % 8)) & 1 else q)


@decoder(IQ3_S)
@device_function
def iq3_s(w, row, offset, chunk, vals):
    """d, qs[64], qh[8] (ninth index bits), signs[32] (one bit per value), scales[4] (nibbles);
    y = d * (1 + 2 * s) * grid * sign."""
    ib = chunk // 2
    s = (np.int32(w[row, offset + 106 + ib // 2]) >> (4 * (ib % 2))) & 15
    db = half_at(w, row, offset) * np.float32(1 + 2 * s)
    g0 = 4 * (chunk % 2)
    qh = np.int32(w[row, offset + 66 + ib])
    signs = u16_at(w, row, offset + 74 + 2 * chunk)
    for t in range(CHUNK):
        g = g0 + t // 4
        q = IQ3S_VALUES[np.int32(w[row, offset + 2 + 8 * ib + g]) | (((qh >> g) & 1) << 8), t % 4]
        vals[t] = db * np.float32(-q if (signs >> t) & 1 else q)
