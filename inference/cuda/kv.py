"""Writing K and V rows into the device KV cache, in the cache's storage type.

`write_rows(type, x, cells, data)` stores row i of x (float32, (n, row)) at cell cells[i] of the
cache rows `data`, converted as the CPU cache converts on write (cpu.backend.HostKVStore.write):

- ``f32``: the values (data float32 (n_cells, row));
- ``f16``: fp16 bits rounded to nearest even (data uint16), ggml's GGML_FP32_TO_FP16;
- ``q8_0``: Q8_0 blocks (data uint8 (n_cells, row / QK8_0 * Q8_0_BLOCK_BYTES), the geometry of
  quants.legacy.Q8_0) as ggml's quantize_row_q8_0_ref:
  d = amax / 127 stored as fp16, q = roundf(x * (1/d)) with the float32 d
  (ggml-cuda/cpy.cu's cpy_blck_f32_q8_0 computes the same).

One thread per value (f32, f16) or per QK8_0-value block (q8_0); the cell indices are a device
array, so a decode step captured in a CUDA graph writes wherever that array says on replay.
Bit for bit the CPU's rows.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda

from ..quants.legacy import Q8_0
from .device import ZERO, f32_to_half_bits

# Q8_0's values and bytes per block (its class's catalog geometry; compile-time constants of the
# kernels below)
QK8_0, Q8_0_BLOCK_BYTES = Q8_0.block_size, Q8_0.type_size
THREADS = 128
_Q8_MAX = np.float32(127.0)
_ONE = np.float32(1.0)


@cuda.jit
def _write_f32(x, cells, data):
    k = cuda.grid(1)
    row = x.shape[1]
    if k < x.shape[0] * row:
        data[cells[k // row], k % row] = x[k // row, k % row]


@cuda.jit
def _write_f16(x, cells, data):
    k = cuda.grid(1)
    row = x.shape[1]
    if k < x.shape[0] * row:
        data[cells[k // row], k % row] = f32_to_half_bits(x[k // row, k % row])


@cuda.jit
def _write_q8_0(x, cells, data):
    """Block b of row i: amax, d = amax/127, q = roundf(x * (1/d)), the rounding done in float64
    as the CPU does it (in float32, 0.49999997 + 0.5 would round up to 1)."""
    k = cuda.grid(1)
    blocks = x.shape[1] // QK8_0
    if k >= x.shape[0] * blocks:
        return
    i = k // blocks
    b = k % blocks
    c = cells[i]
    amax = ZERO
    for j in range(QK8_0):
        amax = max(amax, abs(x[i, b * QK8_0 + j]))
    d = amax / _Q8_MAX
    inv = _ONE / d if d != ZERO else ZERO
    bits = f32_to_half_bits(d)
    o = b * Q8_0_BLOCK_BYTES
    data[c, o] = np.uint8(bits & 0xFF)
    data[c, o + 1] = np.uint8(bits >> 8)
    for j in range(QK8_0):
        v = np.float64(x[i, b * QK8_0 + j] * inv)
        q = np.int32(math.trunc(v + math.copysign(0.5, v)))
        data[c, o + 2 + j] = np.uint8(q & 0xFF)


_KERNELS = {"f32": (_write_f32, np.float32, 1), "f16": (_write_f16, np.uint16, 1),
            "q8_0": (_write_q8_0, np.uint8, QK8_0)}


def storage(cache_type: str, row: int) -> tuple[np.dtype, int]:
    """The dtype and width of one cell's row of `row` values in a cache of `cache_type`."""
    if cache_type not in _KERNELS:
        raise ValueError(f"KV cache type {cache_type!r} is not one of {', '.join(_KERNELS)}")
    if cache_type == "q8_0":
        if row % QK8_0:
            raise ValueError(f"q8_0 cache: a row of {row} values is not a whole number of "
                             f"{QK8_0}-value blocks")
        return np.dtype(np.uint8), row // QK8_0 * Q8_0_BLOCK_BYTES
    return np.dtype(_KERNELS[cache_type][1]), row


def write_rows(cache_type: str, x, cells, data, stream=0):
    """data[cells[i]] = row i of x (float32 (n, row)) in the cache's type. cells: int64 (n,) on
    the device, each in [0, n_cells) (not checked: they stay on the device; the KV cache hands
    out only its own cells). Returns data."""
    kernel, dtype, per_thread = _KERNELS[cache_type] if cache_type in _KERNELS else (None,) * 3
    if kernel is None:
        raise ValueError(f"KV cache type {cache_type!r} is not one of {', '.join(_KERNELS)}")
    n, row = x.shape
    want_dtype, width = storage(cache_type, row)
    if x.dtype != np.float32 or data.dtype != want_dtype or len(data.shape) != 2 \
            or data.shape[1] != width or tuple(cells.shape) != (n,):
        raise ValueError(f"write_rows {cache_type}: x {x.dtype} {tuple(x.shape)}, "
                         f"{tuple(cells.shape)} cells, into {data.dtype} {tuple(data.shape)} "
                         f"(expected {want_dtype} rows of {width})")
    total = n * row // per_thread
    if total:
        kernel[(total + THREADS - 1) // THREADS, THREADS, stream](x, cells, data)
    return data
