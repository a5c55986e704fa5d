"""Device-side helpers shared by the CUDA kernels: warp reductions, bit casts, fp16 conversions.

Every kernel in `llamatui.inference.cuda` is a numba `@cuda.jit` function that runs on a GPU and,
unchanged, under numba's CUDA simulator (`NUMBA_ENABLE_CUDASIM=1`, how CI checks them). The
simulator runs each thread of a block as a Python thread and lacks three things a GPU has: warp
shuffles, libdevice and bit casts. Those are the only places where the two builds differ, and
they all live here:

- `shfl_xor_f32` / `shfl_xor_i32`: `__shfl_xor_sync` on the GPU; in the simulator an exchange
  through shared memory between two block barriers. The emulation needs every thread of the block
  to call it (the GPU only needs the warp), so kernels call the reductions unconditionally.
  `thread_rank`, `block_threads` and `barrier` let the block reductions be written once.
  Warp reductions (`lanes_sum`, `lanes_max`) are the simulator's slowest part, so there they
  are one exchange instead of five: each lane reads its group's values and combines them in the
  butterfly's order, which gives what the shuffles give.
- `mul_rn`: a float32 product that is never fused into a multiply-add. NVVM contracts `a * b + c`
  into an FMA even without fastmath; ggml's CPU dequantization rounds the product first, and
  dequantization here must match it bit for bit.
- `f32_bits` / `bits_f32`: IEEE bit casts (libdevice's `__float_as_int` / `__int_as_float`).

Kernels write float constants as `np.float32` globals: a bare `1.0` is float64 to numba and would
turn float32 arithmetic into float64 on the GPU.
"""
import numpy as np
from numba import cuda
from numba.core import config

SIMULATED = bool(config.ENABLE_CUDASIM)
WARP = 32
FULL_MASK = 0xFFFFFFFF
# the simulator's shuffle scratch: one slot per thread of a block (CUDA's limit is 1024)
_MAX_BLOCK_THREADS = 1024

NEG_INF = np.float32(-np.inf)
ZERO = np.float32(0.0)
ONE = np.float32(1.0)
_TWO_POW_M24 = np.float32(2.0 ** -24)


def device_function(fn):
    """`cuda.jit(device=True)`; under the simulator, a device function that uses no `cuda.*`
    intrinsic stays a plain Python function: the simulator's wrapper swaps the module's globals
    on every call, which costs a hundred times the arithmetic of a small helper."""
    return fn if SIMULATED else cuda.jit(device=True)(fn)

if SIMULATED:
    # The simulator wraps a `cuda.jit(device=True)` function so that each call swaps the
    # module's `cuda` global for the launch's fake module and back: from several threads at
    # once, one thread's restore can pull the fake module from under another. So no device
    # function here uses the `cuda` global under the simulator: the block-level intrinsics go
    # through the launch's context object directly.
    import sys
    import threading

    from numba.core import types as numba_types
    from numba.cuda.simulator.kernel import _get_kernel_context
    from numba.cuda.simulator.kernelapi import FakeCUDAShared
    from numba.np import numpy_support

    _shared_lock = threading.Lock()

    def _shared_array(self, shape, dtype):
        """The simulator's `cuda.shared.array`, made safe and fast: it finds a block's array by
        the line that allocates it, but two threads reaching that line first could each make
        their own (and the block's threads then disagree on what is in shared memory: NaNs),
        and it walked the whole stack, with source lines, on every call."""
        if shape == 0:
            return _simulator_shared_array(self, shape, dtype)
        frame = sys._getframe(1)
        caller = (frame.f_code.co_filename, frame.f_lineno)
        found = self._allocations.get(caller)
        if found is None:
            with _shared_lock:
                found = self._allocations.get(caller)
                if found is None:
                    if isinstance(dtype, numba_types.Type):
                        dtype = numpy_support.as_dtype(dtype)
                    found = self._allocations[caller] = np.empty(shape, dtype)
        return found

    _simulator_shared_array = FakeCUDAShared.array
    FakeCUDAShared.array = _shared_array

    def thread_rank():
        """The thread's index within its block (x fastest)."""
        ctx = _get_kernel_context()
        t, b = ctx.threadIdx, ctx.blockDim
        return t.x + b.x * (t.y + b.y * t.z)

    def block_threads():
        b = _get_kernel_context().blockDim
        return b.x * b.y * b.z

    def barrier():
        _get_kernel_context().syncthreads()

    def _exchange(slots, value, lane_mask):
        """`value` of the thread `rank ^ lane_mask`, through the shared `slots` between
        barriers."""
        rank = thread_rank()
        barrier()
        slots[rank] = value
        barrier()
        return slots[rank ^ lane_mask]

    # (the simulator tells shared arrays apart by the line that allocates them: one line each)
    def shfl_xor_f32(value, lane_mask):
        """`value` of the lane `lane ^ lane_mask` (emulates `__shfl_xor_sync`)."""
        slots = _get_kernel_context().shared.array(_MAX_BLOCK_THREADS, np.float32)
        return _exchange(slots, value, lane_mask)

    def shfl_xor_i32(value, lane_mask):
        slots = _get_kernel_context().shared.array(_MAX_BLOCK_THREADS, np.int32)
        return _exchange(slots, value, lane_mask)

    def mul_rn(a, b):
        return a * b  # the simulator computes in numpy: nothing is ever fused

    def f32_bits(x):
        return np.int64(np.float32(x).view(np.uint32))

    def bits_f32(bits):
        return np.uint32(bits & 0xFFFFFFFF).view(np.float32)
else:
    from numba.cuda import libdevice

    from .compat import load_array_overloads
    load_array_overloads()  # before the first kernel compiles (numpy 2.5 and numba-cuda 0.30)

    @cuda.jit(device=True)
    def thread_rank():
        return cuda.threadIdx.x + cuda.blockDim.x * (
            cuda.threadIdx.y + cuda.blockDim.y * cuda.threadIdx.z)

    @cuda.jit(device=True)
    def block_threads():
        return cuda.blockDim.x * cuda.blockDim.y * cuda.blockDim.z

    @cuda.jit(device=True)
    def barrier():
        cuda.syncthreads()

    @cuda.jit(device=True)
    def shfl_xor_f32(value, lane_mask):
        """`value` of the lane `lane ^ lane_mask` (`__shfl_xor_sync` over the full warp)."""
        return cuda.shfl_xor_sync(FULL_MASK, value, lane_mask)

    @cuda.jit(device=True)
    def shfl_xor_i32(value, lane_mask):
        return cuda.shfl_xor_sync(FULL_MASK, value, lane_mask)

    @cuda.jit(device=True)
    def mul_rn(a, b):
        return libdevice.fmul_rn(a, b)  # __fmul_rn: never contracted into an FMA

    @cuda.jit(device=True)
    def f32_bits(x):
        return np.int64(libdevice.float_as_int(x)) & 0xFFFFFFFF

    @cuda.jit(device=True)
    def bits_f32(bits):
        return libdevice.int_as_float(np.int32(bits & 0xFFFFFFFF))


if SIMULATED:
    def _butterfly(value, width, combine):
        """What `width` lanes hold after an xor-shuffle butterfly with `combine`, in one exchange
        through shared memory: lane i combines with lane i ^ m for m = width/2, ..., 1."""
        rank = thread_rank()
        slots = _get_kernel_context().shared.array(_MAX_BLOCK_THREADS, np.float32)
        barrier()
        slots[rank] = value
        barrier()
        base = rank - rank % width
        values = [slots[base + i] for i in range(width)]
        mask = width // 2
        while mask:
            values = [combine(values[i], values[i ^ mask]) for i in range(width)]
            mask //= 2
        return values[rank - base]

    def lanes_sum(value, width):
        """The float32 sum over each group of `width` lanes (a power of two up to 32), in every
        lane of the group (ggml-cuda common.cuh warp_reduce_sum<width>)."""
        return _butterfly(np.float32(value), width, lambda a, b: a + b)

    def lanes_max(value, width):
        """The maximum over each group of `width` lanes, in every lane of the group."""
        return _butterfly(np.float32(value), width, max)
else:
    @cuda.jit(device=True)
    def lanes_sum(value, width):
        """The float32 sum over each group of `width` lanes (a power of two up to 32), in every
        lane of the group (ggml-cuda common.cuh warp_reduce_sum<width>)."""
        lane_mask = width // 2
        while lane_mask > 0:
            value += shfl_xor_f32(value, lane_mask)
            lane_mask //= 2
        return value

    @cuda.jit(device=True)
    def lanes_max(value, width):
        """The maximum over each group of `width` lanes, in every lane of the group."""
        lane_mask = width // 2
        while lane_mask > 0:
            value = max(value, shfl_xor_f32(value, lane_mask))
            lane_mask //= 2
        return value


@device_function
def warp_sum(value):
    """The float32 sum over the warp, in every lane (ggml-cuda common.cuh warp_reduce_sum)."""
    return lanes_sum(value, WARP)


@device_function
def warp_max(value):
    """The maximum over the warp, in every lane (ggml's warp_reduce_max)."""
    return lanes_max(value, WARP)


@device_function
def block_sum(value, scratch):
    """The float32 sum over the whole block (at most 32 warps), in every thread. `scratch`: a
    shared float32 array of at least 32 slots. Every thread of the block must call it."""
    rank = thread_rank()
    value = warp_sum(value)
    if rank % WARP == 0:
        scratch[rank // WARP] = value
    barrier()
    n_warps = (block_threads() + WARP - 1) // WARP
    partial = scratch[rank % WARP] if rank % WARP < n_warps else ZERO
    total = warp_sum(partial)
    barrier()  # scratch may be reused right after
    return total


@device_function
def block_max(value, scratch):
    """The maximum over the whole block, in every thread (as `block_sum`)."""
    rank = thread_rank()
    value = warp_max(value)
    if rank % WARP == 0:
        scratch[rank // WARP] = value
    barrier()
    n_warps = (block_threads() + WARP - 1) // WARP
    partial = scratch[rank % WARP] if rank % WARP < n_warps else NEG_INF
    total = warp_max(partial)
    barrier()
    return total


@device_function
def u16_at(w, row, offset):
    """The little-endian uint16 at byte `offset` of row `row` of the byte matrix `w`."""
    return np.int64(w[row, offset]) | (np.int64(w[row, offset + 1]) << 8)


@device_function
def u32_at(w, row, offset):
    """The little-endian uint32 at byte `offset` of row `row` (as a non-negative int64)."""
    return (np.int64(w[row, offset]) | (np.int64(w[row, offset + 1]) << 8)
            | (np.int64(w[row, offset + 2]) << 16) | (np.int64(w[row, offset + 3]) << 24))


@device_function
def i8_at(w, row, offset):
    """The byte at `offset` of row `row` read as an int8."""
    return (np.int32(w[row, offset]) ^ 0x80) - 0x80


@device_function
def half_to_f32(h):
    """The float32 value of IEEE half bits `h`: exact, subnormals, infinities and NaN payloads
    included (as inference/fp16.py fp16_to_fp32; ggml's GGML_FP16_TO_FP32)."""
    sign = (h >> 15) & 1
    exponent = (h >> 10) & 0x1F
    mantissa = h & 0x3FF
    if exponent == 0:
        v = np.float32(mantissa) * _TWO_POW_M24
        return -v if sign else v
    if exponent == 31:
        return bits_f32((sign << 31) | 0x7F800000 | (mantissa << 13))
    return bits_f32((sign << 31) | ((exponent + 112) << 23) | (mantissa << 13))


@device_function
def half_at(w, row, offset):
    """The fp16 at byte `offset` of row `row`, as float32."""
    return half_to_f32(u16_at(w, row, offset))


@device_function
def f32_to_half_bits(x):
    """float32 -> IEEE half bits, round to nearest even, overflow to inf, NaN to 0x7E00: the
    result of ggml's GGML_FP32_TO_FP16 (and of F16C), computed with integers."""
    bits = f32_bits(x)
    sign = (bits >> 16) & 0x8000
    magnitude = bits & 0x7FFFFFFF
    if magnitude > 0x7F800000:
        return sign | 0x7E00
    if magnitude >= 0x477FF000:  # 65520 and above round to infinity
        return sign | 0x7C00
    if magnitude >= 0x38800000:  # a normal half: rebias the exponent, round 23 -> 10 bits
        rebiased = magnitude - 0x38000000
        return sign | ((rebiased + 0xFFF + ((rebiased >> 13) & 1)) >> 13)
    if magnitude < 0x33000000:  # below 2^-25: rounds to zero
        return sign
    # a subnormal half: the significand in units of 2^-24, rounded to nearest even
    shift = 126 - (magnitude >> 23)
    significand = (magnitude & 0x7FFFFF) | 0x800000
    q = significand >> shift
    rest = significand & ((1 << shift) - 1)
    halfway = 1 << (shift - 1)
    if rest > halfway or (rest == halfway and (q & 1)):
        q += 1
    return sign | q
