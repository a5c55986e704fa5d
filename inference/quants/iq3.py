"""IQ3_XXS and IQ3_S: ggml's 3-bit i-quants. Groups of 4 values are one point of a grid of
magnitudes (`grids.IQ3XXS_GRID`, 256 points; `grids.IQ3S_GRID`, 512) times 4 signs; super-blocks
of 256 values with one fp16 d and a 4-bit scale per 32 values. Their classes, dequantization
kernels here (dequantize_row_iq3_xxs / _s, bit for bit), row quantizers in `iq3_quantize`.

Layouts (ggml-common.h, little-endian), for sub-block ib (32 values) and group g (4 values):
  IQ3_XXS  d, qs[64], scales_and_signs[32] (98 bytes). qs[8*ib + g]: grid index; the u32 at
           64 + 4*ib of qs: 7-bit sign indices (bits 7*l, one per 8 values, through
           ksigns_iq2xs) and the scale s (bits 28..31): y = d * (0.5 + s) * 0.5 * grid * sign.
  IQ3_S    d, qs[64], qh[8], signs[32], scales[4] (110 bytes). Grid index qs[8*ib + g] | bit g
           of qh[ib] << 8; value j's sign is bit j % 8 of signs[j // 8]; the scale s is nibble
           ib % 2 of scales[ib // 2]: y = d * (1 + 2 * s) * grid * sign.

A sign is applied to the grid value as an integer (-grid), which gives ggml's (db * grid) * -1
bit for bit: rounding is symmetric, and a NaN db comes out unchanged either way.
"""
import numpy as np
from numba import njit, prange

from . import iq3_quantize as rows
from .base import F16_TO_F32, QuantType
from .grids import IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS
from .legacy import half_at


def _grid_values(grid):
    """(n, 4) int32: the 4 magnitudes of each grid point (byte j of the uint32 is value j)."""
    values = grid.astype("<u4").view(np.uint8).reshape(-1, 4).astype(np.int32)
    values.flags.writeable = False
    return values


IQ3XXS_VALUES = _grid_values(IQ3XXS_GRID)
IQ3S_VALUES = _grid_values(IQ3S_GRID)
KSIGNS = KSIGNS_IQ2XS.astype(np.int32)
KSIGNS.flags.writeable = False
_HALF = np.float32(0.5)


@njit(cache=True, inline="always")
def _u32(blocks, i, o):
    return np.int64(blocks[i, o]) | (np.int64(blocks[i, o + 1]) << 8) \
        | (np.int64(blocks[i, o + 2]) << 16) | (np.int64(blocks[i, o + 3]) << 24)


@njit(cache=True, inline="always")
def put_group(out, i, o, db, values, signs):
    """out[i, o + j] = db * (values[j] signed by bit j of `signs`), j < 4."""
    for j in range(4):
        q = values[j]
        out[i, o + j] = db * np.float32(-q if (signs >> j) & 1 else q)


@njit(cache=True, parallel=True)
def iq3_xxs(blocks, table, grid, ksigns, out):
    for i in prange(blocks.shape[0]):
        d = half_at(blocks, i, 0, table)
        for ib in range(8):
            aux = _u32(blocks, i, 66 + 4 * ib)
            db = d * (_HALF + np.float32(aux >> 28)) * _HALF
            for l in range(4):
                signs = ksigns[(aux >> (7 * l)) & 127]
                o = 2 + 8 * ib + 2 * l
                put_group(out, i, 32 * ib + 8 * l, db, grid[blocks[i, o]], signs)
                put_group(out, i, 32 * ib + 8 * l + 4, db, grid[blocks[i, o + 1]], signs >> 4)


@njit(cache=True, parallel=True)
def iq3_s(blocks, table, grid, out):
    for i in prange(blocks.shape[0]):
        d = half_at(blocks, i, 0, table)
        for ib in range(8):
            s = (np.int32(blocks[i, 106 + ib // 2]) >> (4 * (ib % 2))) & 15
            db = d * np.float32(1 + 2 * s)
            qh = np.int32(blocks[i, 66 + ib])
            for l in range(4):
                signs = np.int32(blocks[i, 74 + 4 * ib + l])
                o = 2 + 8 * ib + 2 * l
                g0 = np.int32(blocks[i, o]) | ((qh << (8 - 2 * l)) & 256)
                g1 = np.int32(blocks[i, o + 1]) | ((qh << (7 - 2 * l)) & 256)
                put_group(out, i, 32 * ib + 8 * l, db, grid[g0], signs)
                put_group(out, i, 32 * ib + 8 * l + 4, db, grid[g1], signs >> 4)


class IQ3_XXS(QuantType):
    row_kernel = staticmethod(rows.iq3_xxs_rows)

    @staticmethod
    def run(blocks, out):
        iq3_xxs(blocks, F16_TO_F32, IQ3XXS_VALUES, KSIGNS, out)


class IQ3_S(QuantType):
    row_kernel = staticmethod(rows.iq3_s_rows)

    @staticmethod
    def run(blocks, out):
        iq3_s(blocks, F16_TO_F32, IQ3S_VALUES, out)
