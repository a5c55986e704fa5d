"""Matrix products against ggml-quantized weights, computed on the GGUF bytes in place.

    matmul(type_name, weight, x)             -> x @ W.T        float32 (n_tokens, out_features)
    embedding_rows(type_name, weight, ids)   -> W[ids]         float32 (len(ids), in_features)
    supported_matmul_types()                 -> the ggml type names both accept

`weight` is the raw tensor: uint8 (out_features, row_bytes), one row of quantized blocks per
output feature, usually a zero-copy view into the mmap'd GGUF file. The model is never
dequantized as a whole: the only float copies of weights are bounded scratch tiles.

Two paths (kernels in `matmul_kernels`, written with the 16-lane vectors of `matmul_simd`):

- decode, n_tokens <= DECODE_MAX_TOKENS: one fused numba kernel per type, parallel over output
  rows (`prange`, numba's thread count), streaming each weight row once per token: a block is
  unpacked into float32 registers and multiplied into the activations with FMAs; scales are
  applied once per (sub-)block and min terms folded into precomputed sums of x. Activations stay
  float32 (ggml quantizes them to 8 bits), so results differ from a float64 product with the
  dequantized weights by float32 rounding only. Matrices under PARALLEL_MIN_BYTES run on the
  calling thread alone: waking the other threads costs more than it saves.
- prefill, more tokens: TILE_BYTES tiles of weight rows are dequantized exactly (ggml's formulas
  bit for bit, numba, parallel over rows) into a reused per-thread float32 scratch buffer and
  multiplied by a register-blocked numba GEMM (`gemm_f32`, parallel over row blocks). Per core it
  is on par with single-threaded OpenBLAS (86-101 vs 93-97 GFLOP/s), it shares numba's threads
  with the decode kernels, and numpy's multi-threaded OpenBLAS collapses when the cores are shared
  (40 ms instead of 10 ms for a 512x576x910 product here). Where the CPU has AVX512-BF16 the
  tile and the activations are rounded to bfloat16 and `gemm_bf16` multiplies them (vdpbf16ps:
  ~350 GFLOP/s on the two cores here against gemm_f32's ~200; see USE_BF16).
  Dequantizing is ~2 % of the work at 512 tokens. From 4 tokens on this beats the decode kernel,
  which streams the weights once per token.

F32 weights are used in place on both paths (the GEMM reads them as they are).
"""
from __future__ import annotations

import os
import threading

import numpy as np

from .catalog import GGML_TYPES
from .matmul_kernels import KERNELS, gemm_bf16, gemm_f32, to_bf16
from .matmul_simd import HAS_AVX512_BF16

__all__ = ["matmul", "embedding_rows", "supported_matmul_types",
           "DECODE_MAX_TOKENS", "TILE_BYTES", "PARALLEL_MIN_BYTES", "PARALLEL_MIN_FLOPS",
           "PARALLEL_MIN_VALUES"]

# Largest n_tokens computed with the fused decode kernel (above: dequantized tiles + GEMM).
DECODE_MAX_TOKENS = 3
# Size of one dequantized float32 weight tile on the prefill path (one buffer per calling thread).
TILE_BYTES = 2 << 20
# Decode kernels on smaller weights, and GEMMs of fewer flops, run on the calling thread only.
PARALLEL_MIN_BYTES = 96 << 10
PARALLEL_MIN_FLOPS = 2_000_000
PARALLEL_MIN_VALUES = 64 << 10  # dequantized rows (embedding lookups, prefill tiles)

# F32 is used in place; every other type has its kernels (catalog.ENGINE_TYPES must say the same:
# a test checks it)
_SUPPORTED = ("F32", *KERNELS)
# type name -> (values per block, bytes per block)
_GEOMETRY = {name: (GGML_TYPES[name].block_size, GGML_TYPES[name].type_size) for name in _SUPPORTED}
_scratch = threading.local()
# Prompts multiply in bfloat16 where the CPU has AVX512-BF16 (twice float32's multiply-adds per
# instruction, float32 sums): activations and dequantized weights are rounded to bf16's 8-bit
# mantissa, the same order of error as ggml's 8-bit quantized activations. LLAMATUI_BF16=0 keeps
# prompts in float32.
USE_BF16 = HAS_AVX512_BF16 and os.environ.get("LLAMATUI_BF16", "1") != "0"


def supported_matmul_types() -> tuple[str, ...]:
    """ggml type names `matmul` and `embedding_rows` accept."""
    return _SUPPORTED


def _weight(type_name: str, weight: np.ndarray) -> tuple[np.ndarray, int]:
    """Validate `weight`; return it as a read-only plain ndarray (so an mmap view and an ordinary
    array are the same numba type: one compiled specialization) and its in_features."""
    geometry = _GEOMETRY.get(type_name)
    if geometry is None:
        raise NotImplementedError(f"matmul: ggml type {type_name!r} is not supported "
                                  f"(supported: {', '.join(_SUPPORTED)})")
    if not isinstance(weight, np.ndarray) or weight.dtype != np.uint8 or weight.ndim != 2:
        raise TypeError(f"{type_name} weight must be a 2-D uint8 array (out_features, row_bytes), "
                        f"got {getattr(weight, 'dtype', type(weight))} {getattr(weight, 'shape', '')}")
    if not weight.flags.c_contiguous:
        raise ValueError(f"{type_name} weight must be C-contiguous (a view of the file's rows)")
    block_size, type_size = geometry
    row_bytes = weight.shape[1]
    if row_bytes % type_size:
        raise ValueError(f"{type_name}: a row of {row_bytes} bytes is not a whole number of "
                         f"{type_size}-byte blocks")
    if type(weight) is not np.ndarray:
        weight = weight.view(np.ndarray)
    if weight.flags.writeable:
        weight = weight.view()
        weight.flags.writeable = False
    return weight, row_bytes // type_size * block_size


def _tile_buffer(n_floats: int, name: str = "buf", dtype=np.float32) -> np.ndarray:
    buf = getattr(_scratch, name, None)
    if buf is None or buf.size < n_floats:
        buf = np.empty(max(n_floats, TILE_BYTES // 4), dtype)
        setattr(_scratch, name, buf)
    return buf


def _dequant_rows(type_name: str, w: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    """out[i] = W[rows[i]] exactly; rows int64 in range; out float32 (len(rows), k) C-contiguous."""
    if type_name == "F32":
        np.take(w.view(np.float32), rows, axis=0, out=out)
    elif out.shape[1] % 32 == 0:
        KERNELS[type_name][2](w, rows, out, out.size < PARALLEL_MIN_VALUES)
    elif type_name == "F16":  # rows of a length the kernels' 32-value blocks do not divide
        out[:] = w[rows].view(np.float16)
    else:  # BF16
        out[:] = (w[rows].view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def _tiles(type_name: str, w: np.ndarray, x: np.ndarray, out: np.ndarray, multiply) -> None:
    """Dequantize W a bounded tile of rows at a time into the scratch buffer and call
    multiply(tile, r0, r1) to fill out[:, r0:r1]."""
    n_out, k = out.shape[1], x.shape[1]
    tile_rows = max(1, min(n_out, TILE_BYTES // (4 * k)))
    buf = _tile_buffer(tile_rows * k)
    for r0 in range(0, n_out, tile_rows):
        r1 = min(n_out, r0 + tile_rows)
        tile = buf[: (r1 - r0) * k].reshape(r1 - r0, k)
        _dequant_rows(type_name, w, np.arange(r0, r1, dtype=np.int64), tile)
        tile = tile.view()
        tile.flags.writeable = False  # the same numba type as an F32 weight used in place
        multiply(tile, r0, r1)


def _gemm(x: np.ndarray, wt: np.ndarray, out: np.ndarray, r0: int) -> None:
    gemm_f32(x, wt, out, r0, 2 * x.shape[0] * wt.shape[0] * wt.shape[1] < PARALLEL_MIN_FLOPS)


def _bf16(a: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """a (float32, C-contiguous, size % 16 == 0) rounded to bfloat16 bits (uint16)."""
    if out is None:
        out = np.empty(a.shape, np.uint16)
    to_bf16(a, out, a.size < PARALLEL_MIN_VALUES)
    return out


def _gemm_bf16(x16: np.ndarray, tile: np.ndarray, out: np.ndarray, r0: int) -> None:
    t16 = _tile_buffer(tile.size, "buf16", np.uint16)[:tile.size].reshape(tile.shape)
    _bf16(tile, t16)
    t16 = t16.view()
    t16.flags.writeable = False
    gemm_bf16(x16, t16, out, r0, 2 * x16.shape[0] * tile.size < PARALLEL_MIN_FLOPS)


def matmul(type_name: str, weight: np.ndarray, x: np.ndarray) -> np.ndarray:
    """x @ W.T for a ggml-quantized weight: float32 (n_tokens, out_features).

    weight: uint8 (out_features, row_bytes), the raw rows of `type_name` blocks, C-contiguous.
    x: (n_tokens, in_features), converted to C-contiguous float32 if it is not; a 1-D x is one
    token and gives a 1-D result.
    """
    w, k = _weight(type_name, weight)
    if type(x) is not np.ndarray or x.dtype != np.float32 or not x.flags.c_contiguous \
            or not x.flags.writeable:
        x = np.array(x, dtype=np.float32, order="C")
    squeeze = x.ndim == 1
    if squeeze:
        x = x.reshape(1, -1)
    if x.ndim != 2 or x.shape[1] != k:
        raise ValueError(f"matmul: x of shape {x.shape} for a {type_name} weight with {k} "
                         f"in_features ({w.shape[1]} bytes a row)")
    n, n_out = x.shape[0], w.shape[0]
    out = np.empty((n, n_out), np.float32)
    if n == 0 or n_out == 0:
        pass
    elif k % 16:  # float types only: rows the 16-lane kernels cannot take; plain numpy
        _tiles(type_name, w, x, out, lambda tile, r0, r1: np.matmul(x, tile.T, out=out[:, r0:r1]))
    elif type_name == "F32":
        _gemm(x, w.view(np.float32), out, 0)
    elif n <= DECODE_MAX_TOKENS and k % 32 == 0:
        KERNELS[type_name][1](w, x, out, w.nbytes < PARALLEL_MIN_BYTES)
    elif USE_BF16 and k % 32 == 0:
        x16 = _bf16(x)
        _tiles(type_name, w, x, out, lambda tile, r0, r1: _gemm_bf16(x16, tile, out, r0))
    else:
        _tiles(type_name, w, x, out, lambda tile, r0, r1: _gemm(x, tile, out, r0))
    return out[0] if squeeze else out


def embedding_rows(type_name: str, weight: np.ndarray, token_ids) -> np.ndarray:
    """Rows `token_ids` of a quantized matrix, dequantized exactly: float32 (n, in_features).

    Only the selected rows are read (a 262144-row embedding table stays in the mmap)."""
    w, k = _weight(type_name, weight)
    ids = np.asarray(token_ids)
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"token ids must be integers, got {ids.dtype}")
    ids = np.array(ids.reshape(-1), dtype=np.int64)  # private, writable: one numba specialization
    if ids.size and (ids.min() < 0 or ids.max() >= w.shape[0]):
        raise IndexError(f"token id out of range [0, {w.shape[0]})")
    out = np.empty((ids.size, k), np.float32)
    if ids.size:
        _dequant_rows(type_name, w, ids, out)
    return out
