"""CUDA decoders of IQ2_XXS, IQ2_XS and IQ2_S (layouts in inference/quants/iq2.py): chunk c is
groups 2c and 2c + 1 (two grid points of 8 magnitudes), scaled and signed as ggml's
dequantize_row_iq2_xxs / _xs / _s (and ggml-cuda's dequantize_block_iq2_*) do:
y = d * (0.5 + s) * 0.25 * grid * sign, in that order, the sign a multiplication by +-1 read
from a table (as on the CPU), so the values are bit for bit the CPU's.
"""
from __future__ import annotations

import numpy as np

from ..quants.iq2 import (IQ2_S, IQ2_XS, IQ2_XXS, IQ2S_VALUES, IQ2XS_VALUES, IQ2XXS_VALUES,
                          KSIGNS, SIGN_VALUES)
from .blocks import CHUNK, decoder
from .device import device_function, half_at, u16_at, u32_at

HALF = np.float32(0.5)
QUARTER = np.float32(0.25)


@device_function
def sub_scale(w, row, offset, nibble):
    """d * (0.5 + nibble) * 0.25, ggml's order"""
    return half_at(w, row, offset) * (HALF + np.float32(nibble)) * QUARTER


@device_function
def chunk_scale(w, row, offset, scales_at, chunk):
    """sub_scale of the nibble of `chunk` in the scales[8] at byte offset + scales_at (IQ2_XS,
    IQ2_S: a scale per 16 values)"""
    nibble = (np.int32(w[row, offset + scales_at + chunk // 2]) >> (4 * (chunk % 2))) & 15
    return sub_scale(w, row, offset, nibble)


@decoder(IQ2_XXS)
@device_function
def iq2_xxs(w, row, offset, chunk, vals):
    """d, then per sub-block 4 grid indices (bytes) and a u32 of four 7-bit ksigns indices and
    the scale (bits 28..31)."""
    o = offset + 2 + 8 * (chunk // 2)
    aux = u32_at(w, row, o + 4)
    db = sub_scale(w, row, offset, aux >> 28)
    for t in range(CHUNK):
        g = 2 * (chunk % 2) + t // 8
        signs = KSIGNS[(aux >> (7 * g)) & 127]
        vals[t] = db * IQ2XXS_VALUES[w[row, o + g], t % 8] * SIGN_VALUES[signs, t % 8]


@decoder(IQ2_XS)
@device_function
def iq2_xs(w, row, offset, chunk, vals):
    """d, qs[32] u16 (9-bit grid index | 7-bit ksigns index << 9), scales[8] (a nibble per 16
    values)."""
    db = chunk_scale(w, row, offset, 66, chunk)
    for t in range(CHUNK):
        q = u16_at(w, row, offset + 2 + 4 * chunk + 2 * (t // 8))
        vals[t] = db * IQ2XS_VALUES[q & 511, t % 8] * SIGN_VALUES[KSIGNS[q >> 9], t % 8]


@decoder(IQ2_S)
@device_function
def iq2_s(w, row, offset, chunk, vals):
    """d, qs[32] (grid index low bytes), signs[32] (a byte per group), qh[8] (2 high index bits
    per group), scales[8] (a nibble per 16 values)."""
    db = chunk_scale(w, row, offset, 74, chunk)
    qh = np.int32(w[row, offset + 66 + chunk // 2]) >> (4 * (chunk % 2))
    for t in range(CHUNK):
        g = 2 * chunk + t // 8
        index = np.int32(w[row, offset + 2 + g]) | (((qh >> (2 * (t // 8))) & 3) << 8)
        vals[t] = db * IQ2S_VALUES[index, t % 8] * SIGN_VALUES[w[row, offset + 34 + g], t % 8]
