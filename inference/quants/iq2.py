"""IQ2_XXS, IQ2_XS and IQ2_S: ggml's "true" 2-bit i-quants. Groups of 8 values are one point of
a grid of 256, 512 or 1024 points (magnitudes 8, 25, 43: `grids.IQ2*_GRID`) times 8 signs;
super-blocks of 256 values with one fp16 d and a 4-bit scale per 32 (XXS) or 16 (XS, S) values:
y = d * (0.5 + scale) * 0.25 * grid[j] * sign[j]. Their classes, dequantization kernels here
(dequantize_row_iq2_xxs / _xs / _s, bit for bit), row quantizers in `iq2_quantize`.

Layouts (ggml-common.h, little-endian), for sub-block ib (32 values) and group l (8 values):
  IQ2_XXS  d, qs[32] u16 (66 bytes). Bytes 8*ib .. 8*ib + 3 of qs: the groups' grid indices;
           the u32 after them: 7-bit sign indices (bits 7*l) and the scale (bits 28..31).
  IQ2_XS   d, qs[32] u16, scales[8] (74 bytes). qs[4*ib + l]: grid index (9 bits) | sign index
           << 9; scale nibble l // 2 of scales[ib].
  IQ2_S    d, qs[64], qh[8], scales[8] (82 bytes). Grid index qs[4*ib + l] | 2 bits of qh[ib]
           (bits 2*l) << 8; signs: the 8 bits of qs[32 + 4*ib + l]; scales as IQ2_XS.
A 7-bit sign index selects ksigns_iq2xs's byte (an even number of minus signs).
"""
import numpy as np
from numba import njit, prange

from . import iq2_quantize as rows
from .base import F16_TO_F32, QuantType
from .grids import IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, KSIGNS_IQ2XS
from .legacy import half_at


def _grid_values(grid):
    """(n, 8) float32: the 8 magnitudes of each grid point (byte j of the uint64 is value j)."""
    values = grid.view(np.uint8).reshape(-1, 8).astype(np.float32)
    values.flags.writeable = False
    return values


IQ2XXS_VALUES = _grid_values(IQ2XXS_GRID)
IQ2XS_VALUES = _grid_values(IQ2XS_GRID)
IQ2S_VALUES = _grid_values(IQ2S_GRID)
KSIGNS = KSIGNS_IQ2XS.astype(np.int32)
KSIGNS.flags.writeable = False
# (256, 8) float32: -1 where bit j of the sign byte is set, else 1. Read from memory so that the
# multiply stays a multiply: LLVM turns `x * (-1 if b else 1)` into a sign flip, which flips a
# NaN's sign where ggml's and numpy's multiply keeps it.
SIGN_VALUES = np.where((np.arange(256)[:, None] >> np.arange(8)) & 1, -1, 1).astype(np.float32)
SIGN_VALUES.flags.writeable = False
_HALF = np.float32(0.5)
_QUARTER = np.float32(0.25)


@njit(cache=True, inline="always")
def sub_scale(d, nibble):
    """d * (0.5 + nibble) * 0.25, ggml's order."""
    return d * (_HALF + np.float32(nibble)) * _QUARTER


@njit(cache=True, inline="always")
def put_group(out, i, o, db, values, signs):
    """out[i, o + j] = db * values[j] * signs[j] (ggml's order; signs: a row of SIGN_VALUES)."""
    for j in range(8):
        out[i, o + j] = db * values[j] * signs[j]


@njit(cache=True, parallel=True)
def iq2_xxs(blocks, table, grid, ksigns, signs, out):
    for i in prange(blocks.shape[0]):
        d = half_at(blocks, i, 0, table)
        for ib in range(8):
            o = 2 + 8 * ib
            aux = np.int64(blocks[i, o + 4]) | (np.int64(blocks[i, o + 5]) << 8) \
                | (np.int64(blocks[i, o + 6]) << 16) | (np.int64(blocks[i, o + 7]) << 24)
            db = sub_scale(d, aux >> 28)
            for l in range(4):
                put_group(out, i, 32 * ib + 8 * l, db, grid[blocks[i, o + l]],
                          signs[ksigns[(aux >> (7 * l)) & 127]])


@njit(cache=True, parallel=True)
def iq2_xs(blocks, table, grid, ksigns, signs, out):
    for i in prange(blocks.shape[0]):
        d = half_at(blocks, i, 0, table)
        for ib in range(8):
            sc = np.int32(blocks[i, 66 + ib])
            for l in range(4):
                db = sub_scale(d, (sc >> (4 * (l // 2))) & 0xF)
                o = 2 + 8 * ib + 2 * l
                q = np.int32(blocks[i, o]) | (np.int32(blocks[i, o + 1]) << 8)
                put_group(out, i, 32 * ib + 8 * l, db, grid[q & 511], signs[ksigns[q >> 9]])


@njit(cache=True, parallel=True)
def iq2_s(blocks, table, grid, signs, out):
    for i in prange(blocks.shape[0]):
        d = half_at(blocks, i, 0, table)
        for ib in range(8):
            sc = np.int32(blocks[i, 74 + ib])
            qh = np.int32(blocks[i, 66 + ib])
            for l in range(4):
                db = sub_scale(d, (sc >> (4 * (l // 2))) & 0xF)
                g = np.int32(blocks[i, 2 + 4 * ib + l]) | ((qh << (8 - 2 * l)) & 0x300)
                put_group(out, i, 32 * ib + 8 * l, db, grid[g], signs[blocks[i, 34 + 4 * ib + l]])


class IQ2_XXS(QuantType):
    row_kernel = staticmethod(rows.iq2_xxs_rows)

    @staticmethod
    def run(blocks, out):
        iq2_xxs(blocks, F16_TO_F32, IQ2XXS_VALUES, KSIGNS, SIGN_VALUES, out)


class IQ2_XS(QuantType):
    row_kernel = staticmethod(rows.iq2_xs_rows)

    @staticmethod
    def run(blocks, out):
        iq2_xs(blocks, F16_TO_F32, IQ2XS_VALUES, KSIGNS, SIGN_VALUES, out)


class IQ2_S(QuantType):
    row_kernel = staticmethod(rows.iq2_s_rows)

    @staticmethod
    def run(blocks, out):
        iq2_s(blocks, F16_TO_F32, IQ2S_VALUES, SIGN_VALUES, out)
