"""Bit-exact float conversions in numba: ggml's fp32 -> fp16 (round to nearest even, overflow
to inf, NaN to 0x7E00), fp16 -> fp32, and float32 <-> IEEE bits. Shared by the engine (GEGLU's
fp16 table lookup, the f16 KV cache) and the quantizer."""
import platform

import numpy as np
from llvmlite import ir
from numba import njit, types, vectorize
from numba.extending import intrinsic

from ..host import host_has

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


@vectorize(["uint16(float32)"], cache=True)
def f32_to_f16_bits(x):
    """float32 array -> fp16 bit patterns (uint16), as GGML_FP32_TO_FP16."""
    return np.uint16(fp32_to_fp16(x))


# x86 has a vector fp32 -> fp16 instruction with F16C (ggml's CPU uses it there); ARM64 always has
# one. Elsewhere LLVM would call a runtime helper numba does not link, so the bit tricks stay.
HAS_HW_FP16 = platform.machine().lower() in ("aarch64", "arm64") or host_has("f16c")


@intrinsic
def fp32_to_fp16_hw(typingctx, value):
    """fp32 -> fp16 bits (uint32) by the CPU's conversion (LLVM fptrunc): round to nearest even,
    overflow to inf, as fp32_to_fp16 for every non-NaN input, and vectorizable. Only where
    HAS_HW_FP16."""
    if value != types.float32:
        return None

    def codegen(context, builder, signature, args):
        half = builder.fptrunc(args[0], ir.HalfType())
        return builder.zext(builder.bitcast(half, ir.IntType(16)), ir.IntType(32))

    return types.uint32(types.float32), codegen


# ggml's GELU (tanh form) constants, and its fp16 table (ggml_table_gelu_f16): both backends'
# GEGLU look the activation up in it
GELU_COEF_A = np.float32(0.044715)
GELU_SQRT_2_OVER_PI = np.float32(0.79788456080286535587989211986876)


def _gelu_f16_table() -> np.ndarray:
    """ggml_table_gelu_f16: for every fp16 bit pattern, fp16(gelu_tanh(x)), here as float32."""
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    with np.errstate(all="ignore"):
        y = np.float32(0.5) * x * (np.float32(1.0) + np.tanh(
            GELU_SQRT_2_OVER_PI * x * (np.float32(1.0) + GELU_COEF_A * x * x)))
        return y.astype(np.float16).astype(np.float32)


GELU_F16_TABLE = _gelu_f16_table()
