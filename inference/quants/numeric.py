"""Scalar building blocks shared by the row quantizers, with ggml's exact rounding.

Everything here works in float32 the way ggml's C does (libggml-base is built without FMA, so each
multiply and add rounds on its own). Numba without ``fastmath`` keeps that: no fused multiply-adds,
no reordering. Python float literals would make numba compute in float64, so every constant is an
``np.float32``. Kernels use ``error_model="numpy"``: a float division by zero gives inf or NaN as
in C instead of raising.
"""
import numpy as np
from numba import njit

# The fp16/bit conversions, which the engine's kernels use too.
from .fp16 import bits_f32, f32_bits, fp16_to_fp32, fp32_to_fp16  # noqa: F401

F0 = np.float32(0.0)
F1 = np.float32(1.0)
ROUND_MAGIC = np.float32(12582912.0)  # 1.5 * 2**23: adding it rounds a float32 to an integer
GROUP_MAX_EPS = np.float32(1e-15)  # ggml: a group whose largest |x| is below this is all zero
@njit(cache=True, error_model="numpy")
def nearest_int(fval):
    """ggml's nearest_int: add 1.5*2**23 in float32 (round half to even) and read the mantissa.

    Outside |fval| <= 4194303 ggml asserts (in debug builds only); the bit trick then gives the
    same out-of-range value the C code gets, which the callers clamp.
    """
    val = np.float32(fval + ROUND_MAGIC)
    i = np.int64(f32_bits(val))
    return (i & 0x007FFFFF) - 0x00400000


@njit(cache=True, error_model="numpy")
def round_away(v):
    """C's roundf for a float32: to nearest, halves away from zero."""
    t = np.float32(np.trunc(v))
    if abs(np.float32(v - t)) >= np.float32(0.5):
        if v > F0:
            t = np.float32(t + F1)
        else:
            t = np.float32(t - F1)
    return t


@njit(cache=True, error_model="numpy")
def round_fp16(f):
    """``f`` stored as ggml fp16 and read back: (bits, value)."""
    h = fp32_to_fp16(f)
    return h, fp16_to_fp32(h)


@njit(cache=True, error_model="numpy")
def put_u16(out, pos, h):
    """Store 16 bits little-endian at ``out[pos]`` (ggml's structs are little-endian)."""
    out[pos] = h & 0xFF
    out[pos + 1] = (h >> 8) & 0xFF
