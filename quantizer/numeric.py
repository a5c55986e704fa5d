"""Scalar building blocks shared by the row quantizers, with ggml's exact rounding.

Everything here works in float32 the way ggml's C does (libggml-base is built without FMA, so each
multiply and add rounds on its own). Numba without ``fastmath`` keeps that: no fused multiply-adds,
no reordering. Python float literals would make numba compute in float64, so every constant is an
``np.float32``. Kernels use ``error_model="numpy"``: a float division by zero gives inf or NaN as
in C instead of raising.
"""
import numpy as np
from numba import njit, types
from numba.extending import intrinsic

F0 = np.float32(0.0)
F1 = np.float32(1.0)
ROUND_MAGIC = np.float32(12582912.0)  # 1.5 * 2**23: adding it rounds a float32 to an integer
GROUP_MAX_EPS = np.float32(1e-15)  # ggml: a group whose largest |x| is below this is all zero
_SCALE_TO_INF = np.float32(2.0 ** 112)
_SCALE_TO_ZERO = np.float32(2.0 ** -110)
_TWO_POW_M24 = np.float32(2.0 ** -24)


@intrinsic
def f32_bits(typingctx, value):
    """The IEEE bits of a float32, as uint32 (C's memcpy from float to int)."""
    if value != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(signature.return_type))

    return types.uint32(types.float32), codegen


@intrinsic
def _bits_f32(typingctx, value):
    if value != types.uint32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(signature.return_type))

    return types.float32(types.uint32), codegen


@njit(cache=True, error_model="numpy")
def bits_f32(bits):
    """The float32 whose IEEE bits are ``bits`` (low 32 bits of an integer)."""
    return _bits_f32(np.uint32(bits & 0xFFFFFFFF))


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
def fp32_to_fp16(f):
    """ggml_compute_fp32_to_fp16: round to nearest even, overflow to inf, NaN to 0x7E00."""
    base = np.float32(np.float32(abs(f) * _SCALE_TO_INF) * _SCALE_TO_ZERO)
    w = np.int64(f32_bits(f))
    shl1_w = (w + w) & 0xFFFFFFFF
    sign = w & 0x80000000
    bias = shl1_w & 0xFF000000
    if bias < 0x71000000:
        bias = 0x71000000
    base = np.float32(bits_f32((bias >> 1) + 0x07800000) + base)
    bits = np.int64(f32_bits(base))
    exp_bits = (bits >> 13) & 0x00007C00
    mantissa_bits = bits & 0x00000FFF
    nonsign = exp_bits + mantissa_bits
    if shl1_w > 0xFF000000:
        nonsign = 0x7E00
    return ((sign >> 16) | nonsign) & 0xFFFF


@njit(cache=True, error_model="numpy")
def fp16_to_fp32(h):
    """The float32 value of IEEE half bits ``h`` (exact)."""
    sign = (h >> 15) & 1
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0:
        v = np.float32(np.float32(m) * _TWO_POW_M24)
        return -v if sign else v
    if e == 31:
        return bits_f32((sign << 31) | 0x7F800000 | (m << 13))
    return bits_f32((sign << 31) | ((e + 112) << 23) | (m << 13))


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
