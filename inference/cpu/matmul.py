"""Matrix products against ggml-quantized weights, computed on the GGUF bytes in place.

    matmul(type_name, weight, x)             -> x @ W.T        float32 (n_tokens, out_features)
    matmul_id(type_name, experts, x, ids)    -> x @ W[ids].T   float32 (n_tokens, n_used, out)
    embedding_rows(type_name, weight, ids)   -> W[ids]         float32 (len(ids), in_features)
    supported_matmul_types()                 -> the ggml type names both accept

`weight` is the raw tensor: uint8 (out_features, row_bytes), one row of quantized blocks per
output feature, usually a zero-copy view into the mmap'd GGUF file. The model is never
dequantized as a whole: the only float copies of weights are bounded scratch tiles.

Which types: those whose kernels registered against their class in inference/quants as "cpu"
(matmul_floats, matmul_legacy, matmul_kquants, matmul_iquants; see matmul_kernels); ENGINE_TYPES,
what the engine computes, is derived from them.

Packed: a matrix of a format `matmul_packed` registered (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K; a
multiple of 16 rows) that the caller packed once (`packed_weight`; the CPU backend
does at its first product) runs `matmul_packed`'s kernels for any number of tokens where the
CPU has AVX512-VNNI or AVX-VNNI: 16 rows interleaved so that one vpdpbusd multiplies 4 values of
16 rows, activations quantized to 8 bits as ggml does, and each token's result the same alone
or in any batch.

Prompts of the formats `matmul_prompt8` registered (IQ2_XXS, IQ4_XS, Q5_K: no packed layout; a
multiple of 16 rows, of 256 values) run its 8-bit kernels where the CPU has them: each group of 16 rows unpacked
once per product into the packed Q8_0 layout, in the core's cache, for all the prompt's tokens.

Otherwise three paths (kernels made of `matmul_kernels`' skeletons, written with the 16-lane
vectors of `simd`):

- decode, n_tokens <= DECODE_MAX_TOKENS (one token: the chat path): one fused numba kernel per
  type, parallel over output rows (`prange`, numba's thread count), streaming each weight row
  once per token. For the formats `matmul_int8` registered (rows a multiple of 64 values) the
  activations are quantized to 8 bits first and the blocks' bytes multiplied into them with
  integer dot products, as ggml's vec_dot_*_q8_0 / _q8_K (see `matmul_int8` for why, what it
  costs in precision and when `int8_decode` allows it); the other formats unpack a block into
  float32 registers and multiply it in with FMAs, scales applied once per (sub-)block and min
  terms folded into precomputed sums of x (float32 rounding only). Matrices under
  PARALLEL_MIN_BYTES run on the calling thread alone: waking the other threads costs more than
  it saves.
- batch decode, n_tokens <= BATCH_DECODE_MAX_TOKENS (a scheduler step: one token of each of
  several sequences): one kernel per type that dequantizes each 16-value chunk of a weight row
  once for a tile of 8 tokens (4 for the last 4) and multiplies it into each token's
  activations, float32 throughout like the decode kernel. Tokens are padded to a multiple of 4.
  At 8 tokens the FMAs themselves are the bound, where 8 single-token products would stream the
  weights 8 times; from 2 tokens on it beats the decode kernel, up to 16 the tile path below.
- prefill, more tokens: TILE_BYTES tiles of weight rows are dequantized exactly (ggml's formulas
  bit for bit, numba, parallel over rows) into a reused per-thread float32 scratch buffer and
  multiplied by a register-blocked numba GEMM (`gemm_f32`, parallel over row blocks). Per core it
  is on par with single-threaded OpenBLAS, it shares numba's threads with the decode kernels,
  and numpy's multi-threaded OpenBLAS collapses when the cores are shared. Where the CPU has
  AVX512-BF16 the tile and the activations are rounded to bfloat16 and `gemm_bf16` multiplies
  them (vdpbf16ps: twice the multiply-adds per instruction; see USE_BF16). Dequantizing is a
  small part of the work.

F32 weights are used in place by the GEMM, whatever the number of tokens.

`matmul_id` is ggml_mul_mat_id, a mixture of experts' product: a 3-D tensor holds every expert's
matrix and each token is multiplied by the few its router chose. It reads only the chosen
experts: the pairs of experts only one token chose (all of them when decoding one sequence) go
through one launch of the fused decode kernel over those experts' rows, and an expert chosen by
more tokens takes them gathered through `matmul` (batch decode or prompt path), one product per
expert (as ggml's CPU mul_mat_id groups a batch's rows by expert).
"""
from __future__ import annotations

import contextlib
import os
import threading

import numpy as np
from numba import njit

from . import matmul_int8, matmul_packed, matmul_prompt8
from . import matmul_floats, matmul_iquants, matmul_kquants, matmul_legacy  # noqa: F401 (register)
from . import matmul_iq1, matmul_iq2, matmul_iq3, matmul_mxfp4, matmul_ternary  # noqa: F401
from ..memory import DEQUANT_TILE_BYTES
from ..quants import get_quant_type, kernels_of
from .matmul_kernels import MIN_STEP, gemm_bf16, gemm_f32, to_bf16
from .simd import HAS_AVX512_BF16, HAS_INT8_DOT

__all__ = ["matmul", "matmul_id", "embedding_rows", "supported_matmul_types", "int8_decode",
           "packed_weight", "packed_product", "ENGINE_TYPES",
           "DECODE_MAX_TOKENS", "BATCH_DECODE_MAX_TOKENS", "TILE_BYTES", "PARALLEL_MIN_BYTES",
           "PARALLEL_MIN_FLOPS", "PARALLEL_MIN_VALUES"]

# Largest n_tokens computed with the fused decode kernel, then with the batch decode kernel
# (above: dequantized tiles + GEMM).
DECODE_MAX_TOKENS = 1
BATCH_DECODE_MAX_TOKENS = 16
# Size of one dequantized float32 weight tile on the prefill path (one buffer per calling thread).
TILE_BYTES = DEQUANT_TILE_BYTES
# Decode kernels on smaller weights, and GEMMs of fewer flops, run on the calling thread only.
PARALLEL_MIN_BYTES = 96 << 10
PARALLEL_MIN_FLOPS = 2_000_000
PARALLEL_MIN_VALUES = 64 << 10  # dequantized rows (embedding lookups, prefill tiles)

# type name -> its kernels (matmul_kernels.TypeKernels), as registered against its class
KERNELS = kernels_of("cpu")
_SUPPORTED = tuple(KERNELS)
# The ggml types the engine computes (the model manager asks `llamatui.inference.engine_types`).
ENGINE_TYPES = frozenset(KERNELS)
_scratch = threading.local()
# Prompts multiply in bfloat16 where the CPU has AVX512-BF16 (twice float32's multiply-adds per
# instruction, float32 sums): activations and dequantized weights are rounded to bf16's 8-bit
# mantissa, the same order of error as ggml's 8-bit quantized activations. LLAMATUI_BF16=0 keeps
# prompts in float32.
USE_BF16 = HAS_AVX512_BF16 and os.environ.get("LLAMATUI_BF16", "1") != "0"
# Decode products quantize the activations to 8 bits and multiply them with integer dot products
# (matmul_int8: vpdpbusd), as ggml does, for the formats that have such a kernel, where the CPU
# has AVX512-VNNI or AVX-VNNI; LLAMATUI_INT8=0 keeps them float32.
USE_INT8 = HAS_INT8_DOT and os.environ.get("LLAMATUI_INT8", "1") != "0"


_precision = threading.local()


@contextlib.contextmanager
def int8_decode(enabled: bool):
    """Whether this thread's one-token products may use the row-at-a-time 8-bit kernels of
    `matmul_int8` (default: yes, where USE_INT8). Packed matrices always use theirs, which give
    a token the same result in any batch. Why a switch (8-bit rounding of activations is
    discontinuous, so the scheduler allows it with one slot only): see `matmul_int8`."""
    before = getattr(_precision, "int8", True)
    _precision.int8 = bool(enabled)
    try:
        yield
    finally:
        _precision.int8 = before


def _int8_kernels(type_name: str, k: int) -> matmul_int8.Int8Kernels | None:
    """The 8-bit decode kernels for rows of k values of `type_name`, if they apply."""
    if USE_INT8 and getattr(_precision, "int8", True) and k % matmul_int8.UNIT == 0:
        return matmul_int8.KERNELS.get(type_name)
    return None


def supported_matmul_types() -> tuple[str, ...]:
    """ggml type names `matmul` and `embedding_rows` accept."""
    return _SUPPORTED


def _weight(type_name: str, weight: np.ndarray) -> tuple[np.ndarray, int]:
    """Validate `weight`; return it as a read-only plain ndarray (so an mmap view and an ordinary
    array are the same numba type: one compiled specialization) and its in_features."""
    if type_name not in KERNELS:
        raise NotImplementedError(f"matmul: ggml type {type_name!r} is not supported "
                                  f"(supported: {', '.join(_SUPPORTED)})")
    if not isinstance(weight, np.ndarray) or weight.dtype != np.uint8 or weight.ndim != 2:
        raise TypeError(f"{type_name} weight must be a 2-D uint8 array (out_features, row_bytes), "
                        f"got {getattr(weight, 'dtype', type(weight))} {getattr(weight, 'shape', '')}")
    if not weight.flags.c_contiguous:
        raise ValueError(f"{type_name} weight must be C-contiguous (a view of the file's rows)")
    qt = get_quant_type(type_name)
    block_size, type_size = qt.block_size, qt.type_size
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
    elif out.shape[1] % MIN_STEP == 0:
        KERNELS[type_name].rows(w, rows, out, out.size < PARALLEL_MIN_VALUES)
    elif type_name == "F16":  # rows of a length the kernels' steps do not divide
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


def packed_weight(type_name: str, weight: np.ndarray,
                  release=None) -> matmul_packed.PackedWeight | None:
    """`weight`'s rows interleaved for the packed 8-bit kernels (`matmul_packed`), where the CPU
    has them (USE_INT8) and they take its format and shape; else None. `matmul(..., packed=)`
    then uses them for any number of tokens. release(rows): called on each chunk of `weight`
    once packed (see matmul_packed.pack)."""
    if not packed_weight_possible(type_name, weight):
        return None
    return matmul_packed.pack(type_name, weight, release)


def packed_fused(type_name: str, weights,
                 release=None) -> tuple[matmul_packed.PackedWeight, list] | None:
    """Matrices of one format and input size packed into one (`matmul_packed.pack_fused`: a
    product of the whole gives each one's result), and each as its part; None where
    `packed_weight` would give None for any of them."""
    if not all(packed_weight_possible(type_name, w) for w in weights):
        return None
    return matmul_packed.pack_fused(type_name, weights, release)


def packed_weight_possible(type_name: str, weight: np.ndarray) -> bool:
    """Whether `packed_weight` packs this matrix."""
    w, k = _weight(type_name, weight)
    return USE_INT8 and matmul_packed.packs(type_name, w.shape[0], k)


def packed_product(packed: matmul_packed.PackedWeight,
                   x: np.ndarray) -> list[np.ndarray] | None:
    """x (n, n_in) float32, C-contiguous, times a packed matrix (`packed_weight`), or several
    fused by `matmul_packed.fuse`: float32 (n, rows), one for each; None while the packed
    kernels are off (USE_INT8 false: then `matmul` takes each matrix's rows)."""
    if not USE_INT8:
        return None
    return matmul_packed.matmul(packed, x, packed_serial(packed.nbytes, x.shape[0]))


@njit(cache=True, nogil=True)
def packed_serial(nbytes, n_tokens):
    """Whether a packed product of a matrix of `nbytes` for n_tokens stays on the calling
    thread: a token costs about a fourth of the first (the block is loaded once per 8 tokens)"""
    return nbytes * (n_tokens + 3) // 4 < PARALLEL_MIN_BYTES


def matmul(type_name: str, weight: np.ndarray, x: np.ndarray,
           packed: matmul_packed.PackedWeight | None = None) -> np.ndarray:
    """x @ W.T for a ggml-quantized weight: float32 (n_tokens, out_features).

    weight: uint8 (out_features, row_bytes), the raw rows of `type_name` blocks, C-contiguous.
    x: (n_tokens, in_features), converted to C-contiguous float32 if it is not; a 1-D x is one
    token and gives a 1-D result.
    packed: `packed_weight(type_name, weight)`, kept by the caller: then every product (prompt,
    batch or one token) runs the packed 8-bit kernels while USE_INT8 holds; each token's result
    is then the same alone or in any batch.
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
    outs = None if packed is None else packed_product(packed, x)
    if outs is not None:
        (out,) = outs
        return out[0] if squeeze else out
    batch = DECODE_MAX_TOKENS < n <= BATCH_DECODE_MAX_TOKENS and k % MIN_STEP == 0 \
        and type_name != "F32"
    out = np.empty((-(-n // 4) * 4 if batch else n, n_out), np.float32)  # whole tiles of 4
    if n == 0 or n_out == 0:
        pass
    elif k % 16:  # float types only: rows the 16-lane kernels cannot take; plain numpy
        _tiles(type_name, w, x, out, lambda tile, r0, r1: np.matmul(x, tile.T, out=out[:, r0:r1]))
    elif type_name == "F32":
        _gemm(x, w.view(np.float32), out, 0)
    elif n <= DECODE_MAX_TOKENS and k % MIN_STEP == 0:
        (_int8_kernels(type_name, k) or KERNELS[type_name]).matvec(w, x, out,
                                                                   w.nbytes < PARALLEL_MIN_BYTES)
    elif batch:
        _batch_decode(type_name, w, x, out)
    elif _prompt8_kernel(type_name, n_out, k) is not None:
        _prompt8(_prompt8_kernel(type_name, n_out, k), w, x, out)
    elif USE_BF16 and k % MIN_STEP == 0:
        x16 = _bf16(x)
        _tiles(type_name, w, x, out, lambda tile, r0, r1: _gemm_bf16(x16, tile, out, r0))
    else:
        _tiles(type_name, w, x, out, lambda tile, r0, r1: _gemm(x, tile, out, r0))
    return out[0] if squeeze else out[:n]


def _prompt8_kernel(type_name: str, n_out: int, k: int):
    """The 8-bit prompt kernel (`matmul_prompt8`) for this format and shape, if it applies."""
    if USE_INT8 and n_out % matmul_prompt8.GROUP == 0 and k % matmul_prompt8.QK_K == 0:
        return matmul_prompt8.KERNELS.get(type_name)
    return None


def _prompt8(kernel, w: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """out = x @ W.T by an 8-bit prompt kernel, x's tokens padded with zero rows to a whole
    tile of 8"""
    n, k = x.shape
    padded = -(-n // 8) * 8
    if padded != n:
        x = np.concatenate([x, np.zeros((padded - n, k), np.float32)])
    flat = out.reshape(-1) if padded == n else np.empty(padded * w.shape[0], np.float32)
    kernel(w, x, flat, 2 * padded * w.shape[0] * k < PARALLEL_MIN_FLOPS)
    if padded != n:
        out[:] = flat.reshape(padded, -1)[:n]


def _batch_decode(type_name: str, w: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """out = x @ W.T by the batch decode kernel, x's tokens padded with zero rows to out's
    multiple of 4; on the calling thread alone for a product as small as a decode kernel's under
    PARALLEL_MIN_BYTES (a token costs this kernel about a fourth of the decode kernel's time)."""
    if out.shape[0] != x.shape[0]:
        x = np.concatenate([x, np.zeros((out.shape[0] - x.shape[0], x.shape[1]), np.float32)])
    KERNELS[type_name].matmat(w, x, out, w.nbytes * out.shape[0] < 4 * PARALLEL_MIN_BYTES)


def matmul_id(type_name: str, experts: np.ndarray, x: np.ndarray, ids) -> np.ndarray:
    """x times the matrices of the experts `ids` chose (ggml_mul_mat_id): float32
    (n_tokens, n_used, out_features).

    experts: uint8 (n_expert, out_features, row_bytes), each expert's rows of `type_name` blocks
    one after the other (a 3-D GGUF tensor such as ffn_up_exps), C-contiguous.
    ids: integers (n_tokens, n_used), the experts of each token.
    x: float32 (n_tokens, in_features), one input for all of a token's experts, or
    (n_tokens, n_used, in_features), one per expert (the down projection's).
    """
    if not isinstance(experts, np.ndarray) or experts.ndim != 3:
        raise TypeError(f"{type_name} experts must be a 3-D uint8 array (n_expert, out_features, "
                        f"row_bytes), got shape {getattr(experts, 'shape', type(experts))}")
    n_expert, n_out, row_bytes = experts.shape
    w, k = _weight(type_name, experts.reshape(n_expert * n_out, row_bytes))
    ids = np.asarray(ids)
    if ids.ndim != 2 or ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"matmul_id: expert ids must be integers (n_tokens, n_used), got "
                        f"{ids.dtype} {ids.shape}")
    n, n_used = ids.shape
    flat = np.array(ids.reshape(-1), dtype=np.int64)  # private, writable: one specialization
    if flat.size and (flat.min() < 0 or flat.max() >= n_expert):
        raise IndexError(f"matmul_id: expert id out of range [0, {n_expert})")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.shape not in ((n, k), (n, n_used, k)):
        raise ValueError(f"matmul_id: x of shape {x.shape} for {n} tokens of {n_used} experts "
                         f"with {k} in_features")
    x_rows = np.arange(n, dtype=np.int64).repeat(n_used) if x.ndim == 2 else \
        np.arange(n * n_used, dtype=np.int64)
    x = x.reshape(-1, k)
    out = np.empty((flat.size, n_out), np.float32)
    counts = np.bincount(flat, minlength=n_expert)
    # pairs whose expert few tokens chose: the fused decode kernel (when the format has one)
    few = DECODE_MAX_TOKENS if KERNELS[type_name].matvec_id and k % MIN_STEP == 0 else 0
    pairs = np.flatnonzero(counts[flat] <= few)
    if pairs.size:
        fused = out if pairs.size == flat.size else np.empty((pairs.size, n_out), np.float32)
        kernels = _int8_kernels(type_name, k) or KERNELS[type_name]
        kernels.matvec_id(w, x, flat[pairs], x_rows[pairs], fused,
                          pairs.size * n_out * row_bytes < PARALLEL_MIN_BYTES)
        if fused is not out:
            out[pairs] = fused
    if pairs.size < flat.size:  # the rest: one product per expert, its tokens gathered
        order = np.argsort(flat, kind="stable")
        starts = np.concatenate(([0], np.cumsum(counts)))
        for e in np.flatnonzero(counts > few):
            p = order[starts[e]:starts[e + 1]]
            out[p] = matmul(type_name, experts[e], x[x_rows[p]])
    return out.reshape(n, n_used, n_out)


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
