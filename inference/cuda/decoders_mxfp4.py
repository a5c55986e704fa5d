"""MXFP4's CUDA decoder (`@decoder(MXFP4)`, see blocks.py): ggml-cuda/convert.cu's
dequantize_block_mxfp4, bit for bit the CPU's dequantization (inference/quants/mxfp4.py).

Block of 32: e (E8M0), qs[16]; chunk 0 = the low nibbles, 1 = the high ones;
y = kvalues_mxfp4[nibble] * e8m0_to_fp32_half(e), a product of two exact factors (no sum follows,
so no mul_rn is needed).
"""
from __future__ import annotations

import numpy as np

from ..quants.mxfp4 import MXFP4, MXFP4_LEVELS
from .blocks import CHUNK, decoder
from .device import bits_f32, device_function


@device_function
def e8m0_half(e):
    """ggml_e8m0_to_fp32_half: 2**(e - 128) from its float32 bits (subnormal for e < 2)."""
    return bits_f32(0x00200000 << e) if e < 2 else bits_f32((e - 1) << 23)


@decoder(MXFP4)
@device_function
def mxfp4(w, row, offset, chunk, vals):
    d = e8m0_half(np.int64(w[row, offset]))
    shift = 4 * chunk
    for t in range(CHUNK):
        vals[t] = MXFP4_LEVELS[(np.int32(w[row, offset + 1 + t]) >> shift) & 0xF] * d
