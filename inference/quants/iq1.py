"""IQ1_S and IQ1_M: ggml's 1.5- and 1.75-bit i-quants. Groups of 8 values are one point of a
grid of values -1, 0, 1 (`grids.IQ1S_GRID`, 2048 points, 11-bit indices) shifted by a delta of
+-1/8: y = dl * (grid[j] + delta), dl = d * (2 * s + 1) for a 3-bit scale s. Their classes and
dequantization kernels here (dequantize_row_iq1_s / _m, bit for bit), row quantizers in
`iq1_quantize`.

Layouts (ggml-common.h, little-endian), for sub-block ib (32 values) and group l (8 values):
  IQ1_S  d, qs[32], qh[8] u16 (50 bytes). Grid index qs[4*ib + l] | bits 3*l.. of qh[ib] << 8;
         s = bits 12..14 of qh[ib]; bit 15 of qh[ib]: delta -1/8 (else +1/8), for all 32.
  IQ1_M  qs[32], qh[16], scales[8] (56 bytes; no d field). Grid index qs[4*ib + l] | bits
         0..2 (l even) or 4..6 (l odd) of qh[2*ib + l // 2] << 8, bit 3 (7) of that byte the
         group's delta sign; s = 3 bits at 6 * (ib % 2) + 3 * (l // 2) of the u16 scales[ib // 2];
         d is the fp16 made of the top nibbles of the four u16 scales (the first's lowest).
"""
import numpy as np
from numba import njit, prange

from . import iq1_quantize as rows
from .base import F16_TO_F32, QuantType
from .grids import IQ1S_DELTA, IQ1S_GRID
from .legacy import half_at

# (2048, 8) float32: the values -1, 0, 1 of each grid point (byte j of the uint64 is value j)
IQ1S_VALUES = IQ1S_GRID.astype("<u8").view(np.int8).reshape(-1, 8).astype(np.float32)
IQ1S_VALUES.flags.writeable = False


@njit(cache=True, inline="always")
def _u16(blocks, i, o):
    return np.int32(blocks[i, o]) | (np.int32(blocks[i, o + 1]) << 8)


@njit(cache=True, inline="always")
def put_group(out, i, o, dl, values, delta):
    """out[i, o + j] = dl * (values[j] + delta), j < 8 (ggml's order)."""
    for j in range(8):
        out[i, o + j] = dl * (values[j] + delta)


@njit(cache=True, parallel=True)
def iq1_s(blocks, table, grid, delta, out):
    for i in prange(blocks.shape[0]):
        d = half_at(blocks, i, 0, table)
        for ib in range(8):
            qh = _u16(blocks, i, 34 + 2 * ib)
            dl = d * np.float32(2 * ((qh >> 12) & 7) + 1)
            dt = -delta if qh & 0x8000 else delta
            for l in range(4):
                g = np.int32(blocks[i, 2 + 4 * ib + l]) | (((qh >> (3 * l)) & 7) << 8)
                put_group(out, i, 32 * ib + 8 * l, dl, grid[g], dt)


@njit(cache=True, parallel=True)
def iq1_m(blocks, table, grid, delta, out):
    for i in prange(blocks.shape[0]):
        scale = (_u16(blocks, i, 48) >> 12) | ((_u16(blocks, i, 50) >> 8) & 0x00F0) \
            | ((_u16(blocks, i, 52) >> 4) & 0x0F00) | (_u16(blocks, i, 54) & 0xF000)
        d = table[scale]
        for ib in range(8):
            sc = _u16(blocks, i, 48 + 2 * (ib // 2)) >> (6 * (ib % 2))
            for l in range(4):
                dl = d * np.float32(2 * ((sc >> (3 * (l // 2))) & 7) + 1)
                qh = np.int32(blocks[i, 32 + 2 * ib + l // 2]) >> (4 * (l % 2))
                g = np.int32(blocks[i, 4 * ib + l]) | ((qh & 7) << 8)
                put_group(out, i, 32 * ib + 8 * l, dl, grid[g], -delta if qh & 8 else delta)


class IQ1_S(QuantType):
    row_kernel = staticmethod(rows.iq1_s_rows)

    @staticmethod
    def run(blocks, out):
        iq1_s(blocks, F16_TO_F32, IQ1S_VALUES, IQ1S_DELTA, out)


class IQ1_M(QuantType):
    row_kernel = staticmethod(rows.iq1_m_rows)

    @staticmethod
    def run(blocks, out):
        iq1_m(blocks, F16_TO_F32, IQ1S_VALUES, IQ1S_DELTA, out)  # as dequantize_row_iq1_m
