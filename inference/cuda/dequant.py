"""Per-type decoders of ggml blocks on the device, and the dequantize / get-rows kernel.

Every weight type is read 16 values at a time: `decoder(w, row, offset, chunk, vals)` fills the
local float32 array `vals` with values 16*chunk .. 16*chunk+15 of the block that starts at byte
`offset` of row `row` of the byte matrix `w` (one row of blocks per output). Sixteen values share
one scale in every type (K-quant sub-blocks are 16 or 32 wide; a 32-value legacy block is two
chunks: its low and its high nibbles), so a chunk needs its scales once. The float types F32,
F16 and BF16 are read as 16-value "blocks" of 64 / 32 / 32 bytes.

The float32 arithmetic is ggml's dequantize_row_* (and inference/quants) in the same order, with
`mul_rn` where a product feeds a sum, so results are bit for bit the CPU's
`llamatui.inference.quants.dequantize`. The layouts are those of ggml-common.h; inference/quants
describes them. ggml's CUDA counterparts are the dequantize_* device functions of
ggml-cuda/dequantize.cuh and the dequantize_block_* kernels of ggml-cuda/convert.cu.

Each decoder registers against its type's class (`@decoder(Q4_0)`, see inference/quants) as
its "cuda" kernels; DEVICE_TYPES is derived from those registrations. Adding a type: its decoder,
under `@decoder(<its class>)`.

`dequantize_rows` (rows picked by id, to float32 or float16) serves both the embedding lookup
(ggml-cuda/getrows.cu) and the fp16 weight tiles that cuBLAS multiplies for prompts.
"""
from __future__ import annotations

import numpy as np
from numba import cuda, types

from ..quants import kernels_of
from ..quants.base import IQ4_LEVELS
from ..quants.floats import BF16, F16, F32
from ..quants.iquants import IQ4_NL, IQ4_XS
from ..quants.kquants import Q2_K, Q3_K, Q4_K, Q5_K, Q6_K
from ..quants.legacy import Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
from .blocks import CHUNK, DeviceType, decoder
from .device import bits_f32, device_function, half_at, i8_at, mul_rn, u16_at, u32_at

# ----------------------------------------------------------------------------- float types


@decoder(F32)
@device_function
def f32(w, row, offset, chunk, vals):
    for t in range(CHUNK):
        vals[t] = bits_f32(u32_at(w, row, offset + 4 * t))


@decoder(F16)
@device_function
def f16(w, row, offset, chunk, vals):
    for t in range(CHUNK):
        vals[t] = half_at(w, row, offset + 2 * t)


@decoder(BF16)
@device_function
def bf16(w, row, offset, chunk, vals):
    # bfloat16 is the top half of a float32 (convert.cu's bf16 -> float)
    for t in range(CHUNK):
        vals[t] = bits_f32(u16_at(w, row, offset + 2 * t) << 16)


# ----------------------------------------------------------------------------- legacy 32-blocks


@decoder(Q4_0)
@device_function
def q4_0(w, row, offset, chunk, vals):
    """dequantize_q4_0: d fp16, qs[16]; y = d * (nibble - 8); chunk 0 = low nibbles."""
    d = half_at(w, row, offset)
    shift = 4 * chunk
    for t in range(CHUNK):
        q = (np.int32(w[row, offset + 2 + t]) >> shift) & 0xF
        vals[t] = d * np.float32(q - 8)


@device_function
def scaled_plus_min(d, q, m):
    """d * q + m, the product rounded first; a NaN product is kept as numpy keeps it (see
    inference/quants/legacy.py)."""
    p = mul_rn(d, np.float32(q))
    return p if p != p else p + m


@decoder(Q4_1)
@device_function
def q4_1(w, row, offset, chunk, vals):
    """dequantize_q4_1: d fp16, m fp16, qs[16]; y = d * nibble + m."""
    d = half_at(w, row, offset)
    m = half_at(w, row, offset + 2)
    shift = 4 * chunk
    for t in range(CHUNK):
        vals[t] = scaled_plus_min(d, (np.int32(w[row, offset + 4 + t]) >> shift) & 0xF, m)


@decoder(Q5_0)
@device_function
def q5_0(w, row, offset, chunk, vals):
    """dequantize_q5_0: d fp16, qh u32 (bit j = fifth bit of value j), qs[16];
    y = d * (q - 16)."""
    d = half_at(w, row, offset)
    qh = u32_at(w, row, offset + 2)
    shift = 4 * chunk
    for t in range(CHUNK):
        q = ((np.int32(w[row, offset + 6 + t]) >> shift) & 0xF) \
            | np.int32(((qh >> (CHUNK * chunk + t)) & 1) << 4)
        vals[t] = d * np.float32(q - 16)


@decoder(Q5_1)
@device_function
def q5_1(w, row, offset, chunk, vals):
    """dequantize_q5_1: d fp16, m fp16, qh u32, qs[16]; y = d * q + m."""
    d = half_at(w, row, offset)
    m = half_at(w, row, offset + 2)
    qh = u32_at(w, row, offset + 4)
    shift = 4 * chunk
    for t in range(CHUNK):
        q = ((np.int32(w[row, offset + 8 + t]) >> shift) & 0xF) \
            | np.int32(((qh >> (CHUNK * chunk + t)) & 1) << 4)
        vals[t] = scaled_plus_min(d, q, m)


@decoder(Q8_0)
@device_function
def q8_0(w, row, offset, chunk, vals):
    """dequantize_q8_0: d fp16, qs[32] int8; y = q * d."""
    d = half_at(w, row, offset)
    base = offset + 2 + CHUNK * chunk
    for t in range(CHUNK):
        vals[t] = np.float32(i8_at(w, row, base + t)) * d


@decoder(IQ4_NL)
@device_function
def iq4_nl(w, row, offset, chunk, vals):
    """dequantize_iq4_nl: laid out as Q4_0; y = d * kvalues_iq4nl[nibble]."""
    d = half_at(w, row, offset)
    shift = 4 * chunk
    for t in range(CHUNK):
        vals[t] = d * IQ4_LEVELS[(np.int32(w[row, offset + 2 + t]) >> shift) & 0xF]


# ----------------------------------------------------------------------------- K-quants


@decoder(Q2_K)
@device_function
def q2_k(w, row, offset, s, vals):
    """dequantize_block_q2_K, sub-block s: scales[16] (low nibble scale, high nibble min),
    qs[64] (2 bits), d, dmin; y = d * scale * q - dmin * min."""
    d = half_at(w, row, offset + 80)
    dmin = half_at(w, row, offset + 82)
    sc = np.int32(w[row, offset + s])
    dl = d * np.float32(sc & 0xF)
    ml = dmin * np.float32(sc >> 4)
    base = offset + 16 + 32 * (s // 8) + 16 * (s % 2)
    shift = 2 * ((s % 8) // 2)
    for t in range(CHUNK):
        q = (np.int32(w[row, base + t]) >> shift) & 3
        vals[t] = mul_rn(dl, np.float32(q)) - ml


@device_function
def q3_k_scale(w, row, offset, k):
    """Sub-block k's 6-bit scale, minus 32: low 4 bits from bytes 96..103, high 2 from 104..107."""
    if k < 8:
        low = np.int32(w[row, offset + 96 + k]) & 0xF
    else:
        low = np.int32(w[row, offset + 96 + k - 8]) >> 4
    high = (np.int32(w[row, offset + 104 + k % 4]) >> (2 * (k // 4))) & 3
    return (low | (high << 4)) - 32


@decoder(Q3_K)
@device_function
def q3_k(w, row, offset, s, vals):
    """dequantize_block_q3_K, sub-block s: hmask[32], qs[64], scales[12], d;
    y = d * scale * (q - 4 unless the hmask bit is set)."""
    d = half_at(w, row, offset + 108)
    dl = d * np.float32(q3_k_scale(w, row, offset, s))
    base = offset + 32 + 32 * (s // 8) + 16 * (s % 2)
    shift = 2 * ((s % 8) // 2)
    hbase = offset + 16 * (s % 2)
    hbit = s // 2
    for t in range(CHUNK):
        low = (np.int32(w[row, base + t]) >> shift) & 3
        high = (np.int32(w[row, hbase + t]) >> hbit) & 1
        vals[t] = dl * np.float32(low - 4 + 4 * high)


@device_function
def k_scale_min(w, row, offset, sb):
    """Sub-block sb's 6-bit scale and min from the 12 bytes at `offset` (get_scale_min_k4)."""
    if sb < 4:
        sc = np.int32(w[row, offset + sb]) & 63
        mn = np.int32(w[row, offset + sb + 4]) & 63
    else:
        packed = np.int32(w[row, offset + sb + 4])
        sc = (packed & 0xF) | ((np.int32(w[row, offset + sb - 4]) >> 6) << 4)
        mn = (packed >> 4) | ((np.int32(w[row, offset + sb]) >> 6) << 4)
    return sc, mn


@decoder(Q4_K)
@device_function
def q4_k(w, row, offset, chunk, vals):
    """dequantize_block_q4_K, half `chunk % 2` of sub-block chunk // 2: d, dmin, scales[12],
    qs[128]; y = d * scale * nibble - dmin * min."""
    sb = chunk // 2
    d = half_at(w, row, offset)
    dmin = half_at(w, row, offset + 2)
    sc, mn = k_scale_min(w, row, offset + 4, sb)
    dl = d * np.float32(sc)
    ml = dmin * np.float32(mn)
    base = offset + 16 + 32 * (sb // 2) + CHUNK * (chunk % 2)
    shift = 4 * (sb % 2)
    for t in range(CHUNK):
        q = (np.int32(w[row, base + t]) >> shift) & 0xF
        vals[t] = mul_rn(dl, np.float32(q)) - ml


@decoder(Q5_K)
@device_function
def q5_k(w, row, offset, chunk, vals):
    """dequantize_block_q5_K: as Q4_K, with qh[32] holding the fifth bits (bit sb of qh[l])."""
    sb = chunk // 2
    d = half_at(w, row, offset)
    dmin = half_at(w, row, offset + 2)
    sc, mn = k_scale_min(w, row, offset + 4, sb)
    dl = d * np.float32(sc)
    ml = dmin * np.float32(mn)
    l0 = CHUNK * (chunk % 2)
    base = offset + 48 + 32 * (sb // 2) + l0
    shift = 4 * (sb % 2)
    for t in range(CHUNK):
        q = ((np.int32(w[row, base + t]) >> shift) & 0xF) \
            | (((np.int32(w[row, offset + 16 + l0 + t]) >> sb) & 1) << 4)
        vals[t] = mul_rn(dl, np.float32(q)) - ml


@decoder(Q6_K)
@device_function
def q6_k(w, row, offset, s, vals):
    """dequantize_block_q6_K, sub-block s: ql[128] (low 4 bits), qh[64] (high 2 bits),
    scales[16] int8, d; y = d * scale * (q - 32)."""
    d = half_at(w, row, offset + 208)
    dl = d * np.float32(i8_at(w, row, offset + 192 + s))
    half = s // 8
    r = 16 * (s % 8)
    lo_base = offset + 64 * half + r % 64
    lo_shift = 4 * (r // 64)
    hi_base = offset + 128 + 32 * half + r % 32
    hi_shift = 2 * (r // 32)
    for t in range(CHUNK):
        lo = (np.int32(w[row, lo_base + t]) >> lo_shift) & 0xF
        hi = (np.int32(w[row, hi_base + t]) >> hi_shift) & 3
        vals[t] = dl * np.float32((lo | (hi << 4)) - 32)


@decoder(IQ4_XS)
@device_function
def iq4_xs(w, row, offset, chunk, vals):
    """dequantize_block_iq4_xs, half `chunk % 2` of sub-block chunk // 2: d, scales_h u16,
    scales_l[4], qs[128]; y = d * (6-bit scale - 32) * kvalues_iq4nl[nibble]."""
    ib = chunk // 2
    d = half_at(w, row, offset)
    scales_h = u16_at(w, row, offset + 2)
    low = (np.int32(w[row, offset + 4 + ib // 2]) >> (4 * (ib % 2))) & 0xF
    high = np.int32((scales_h >> (2 * ib)) & 3)
    dl = d * np.float32((low | (high << 4)) - 32)
    shift = 4 * (chunk % 2)
    base = offset + 8 + 16 * ib
    for t in range(CHUNK):
        vals[t] = dl * IQ4_LEVELS[(np.int32(w[row, base + t]) >> shift) & 0xF]


# ----------------------------------------------------------------------------- the registry

# the low-bit families' decoders, one module each (they register on import)
from . import decoders_iq1, decoders_iq2, decoders_iq3, decoders_mxfp4, decoders_ternary  # noqa: E402,F401,I001

# type name -> DeviceType: every type whose decoder registered above
DEVICE_TYPES: dict[str, DeviceType] = kernels_of("cuda")


class UnsupportedDeviceTypeError(ValueError):
    """A weight type the CUDA kernels do not read."""

    def __init__(self, type_name):
        self.type_name = type_name
        super().__init__(f"CUDA kernels: weight type {type_name!r} is not supported "
                         f"(supported: {', '.join(DEVICE_TYPES)})")


def device_type(type_name: str) -> DeviceType:
    try:
        return DEVICE_TYPES[type_name]
    except (KeyError, TypeError):
        raise UnsupportedDeviceTypeError(type_name) from None


def check_weight(dt: DeviceType, w, n_values: int) -> None:
    """`w` must be a 2-D uint8 matrix of rows of `n_values` values of type `dt`."""
    if n_values <= 0 or n_values % dt.block_values:
        raise ValueError(f"{dt.name}: a row of {n_values} values is not a whole number of "
                         f"{dt.block_values}-value blocks")
    if len(w.shape) != 2 or w.dtype != np.uint8 or w.shape[1] != dt.row_bytes(n_values):
        raise ValueError(f"{dt.name}: weight must be uint8 (rows, {dt.row_bytes(n_values)}) for "
                         f"rows of {n_values} values, got {w.dtype} {tuple(w.shape)}")


# ----------------------------------------------------------------------------- kernels

DEQUANT_THREADS = 128  # threads per block; one thread decodes one chunk


def _make_dequantize_kernel(dt: DeviceType):
    decoder, block_bytes, cpb = dt.decoder, dt.block_bytes, dt.chunks_per_block

    @cuda.jit
    def dequantize_kernel(w, ids, out):
        """out[i, 16c : 16c+16] = chunk c of row ids[i] (convert.cu's dequantize_block, getrows.cu's
        k_get_rows): one thread per chunk; out is float32 or float16 (rounded to nearest)."""
        i = cuda.grid(1)
        chunks_per_row = out.shape[1] // CHUNK
        if i >= out.shape[0] * chunks_per_row:
            return
        r = i // chunks_per_row
        c = i % chunks_per_row
        vals = cuda.local.array(CHUNK, types.float32)
        decoder(w, ids[r], (c // cpb) * block_bytes, c % cpb, vals)
        for t in range(CHUNK):
            out[r, CHUNK * c + t] = vals[t]

    return dequantize_kernel


_dequantize_kernels: dict[str, object] = {}


def dequantize_kernel(type_name: str):
    """The dequantize / get-rows kernel of a weight type (built on first use)."""
    kernel = _dequantize_kernels.get(type_name)
    if kernel is None:
        kernel = _dequantize_kernels[type_name] = _make_dequantize_kernel(device_type(type_name))
    return kernel


def dequantize_rows(type_name: str, w, ids, out, stream=0):
    """out[i] = row ids[i] of the weight `w`, dequantized.

    w: uint8 (n_rows, row_bytes) device array (or numpy under the simulator); ids: int32/int64
    (n,) row ids, all in [0, n_rows) (not checked here: it would cost a copy to the host; the
    embedding lookup checks token ids on the host before they go up); out: float32 or float16
    (n, n_values), written. Returns out.
    """
    dt = device_type(type_name)
    n, n_values = out.shape
    check_weight(dt, w, n_values)
    if out.dtype not in (np.float32, np.float16):
        raise ValueError(f"dequantize_rows: out must be float32 or float16, got {out.dtype}")
    if tuple(ids.shape) != (n,):
        raise ValueError(f"dequantize_rows: {tuple(ids.shape)} ids for {n} output rows")
    total = n * (n_values // CHUNK)
    if total:
        grid = (total + DEQUANT_THREADS - 1) // DEQUANT_THREADS
        dequantize_kernel(type_name)[grid, DEQUANT_THREADS, stream](w, ids, out)
    return out
