"""IQ4_NL and IQ4_XS: 4-bit indices into ggml's 16 non-linear levels (`kvalues_iq4nl`): their
classes, dequantization kernels here, row quantizers in `iquants_quantize`.

IQ4_NL: blocks of 32 laid out like Q4_0 (d fp16, qs[16]); y = d * level[nibble].
IQ4_XS: super-blocks of 256: d fp16, scales_h u16, scales_l[4], qs[128]; sub-block ib (32 elements)
has the 6-bit scale (nibble ib%2 of scales_l[ib//2]) | (bits 2*ib of scales_h) << 4, minus 32, and
its element 16*k + m is nibble k of qs[16*ib + m]; y = (d * scale) * level[nibble].
"""
import numpy as np
from numba import njit, prange

from . import iquants_quantize as rows
from .base import F16_TO_F32, IQ4_LEVELS, QuantType
from .legacy import half_at


@njit(cache=True, parallel=True)
def iq4_nl(blocks, table, levels, out):
    half = out.shape[1] // 2
    for i in prange(blocks.shape[0]):
        d = half_at(blocks, i, 0, table)
        for j in range(half):
            b = np.int32(blocks[i, 2 + j])
            out[i, j] = d * levels[b & 0xF]
            out[i, j + half] = d * levels[b >> 4]


@njit(cache=True, parallel=True)
def iq4_xs(blocks, table, levels, out):
    half = out.shape[1] // 16  # half a sub-block: 16
    for i in prange(blocks.shape[0]):
        d = half_at(blocks, i, 0, table)
        scales_h = np.int32(blocks[i, 2]) | (np.int32(blocks[i, 3]) << 8)
        for ib in range(8):
            low = (np.int32(blocks[i, 4 + ib // 2]) >> (4 * (ib % 2))) & 0xF
            high = (scales_h >> (2 * ib)) & 3
            dl = d * np.float32((low | (high << 4)) - 32)
            for m in range(half):
                b = np.int32(blocks[i, 8 + 16 * ib + m])
                out[i, 32 * ib + m] = dl * levels[b & 0xF]
                out[i, 32 * ib + half + m] = dl * levels[b >> 4]


class IQ4_NL(QuantType):
    row_kernel = staticmethod(rows.iq4_nl_rows)

    @staticmethod
    def run(blocks, out):
        iq4_nl(blocks, F16_TO_F32, IQ4_LEVELS, out)


class IQ4_XS(QuantType):
    row_kernel = staticmethod(rows.iq4_xs_rows)

    @staticmethod
    def run(blocks, out):
        iq4_xs(blocks, F16_TO_F32, IQ4_LEVELS, out)
