"""F16 and BF16 rows, rounded exactly like ggml (vectorized numpy; no search involved)."""
import numpy as np


def fp32_to_fp16_bits(x: np.ndarray) -> np.ndarray:
    """ggml_compute_fp32_to_fp16 on an array: round to nearest even, overflow to inf, NaN to a
    quiet NaN (0x7E00 with the sign)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    with np.errstate(over="ignore"):
        base = (np.abs(x) * np.float32(2.0 ** 112)) * np.float32(2.0 ** -110)
    w = x.view(np.uint32)
    shl1_w = w + w  # uint32 arithmetic wraps like C's
    sign = w & np.uint32(0x80000000)
    bias = np.maximum(shl1_w & np.uint32(0xFF000000), np.uint32(0x71000000))
    base = ((bias >> np.uint32(1)) + np.uint32(0x07800000)).view(np.float32) + base
    bits = base.view(np.uint32)
    nonsign = ((bits >> np.uint32(13)) & np.uint32(0x7C00)) + (bits & np.uint32(0x0FFF))
    nonsign = np.where(shl1_w > np.uint32(0xFF000000), np.uint32(0x7E00), nonsign)
    return ((sign >> np.uint32(16)) | nonsign).astype(np.uint16)


def fp32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """ggml_compute_fp32_to_bf16 on an array: round to nearest even; NaN kept and made quiet."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    is_nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    quiet_nan = (u >> np.uint32(16)) | np.uint32(64)
    return np.where(is_nan, quiet_nan, rounded).astype(np.uint16)
