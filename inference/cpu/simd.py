"""A tiny SIMD vocabulary for numba: 16-lane float32 / int32 vectors as first-class values.

Why: LLVM's loop vectorizer does badly on block-quantized rows. The inner loops are short (16 or 32
elements) with constant trip counts, so LLVM unrolls them first and then vectorizes the *block*
loop with gathers; and numba widens every small-integer operation to int64, which turns nibble
unpacking into 8-lane code. With explicit `<16 x float>` / `<16 x i32>` values the kernels read
like ggml's AVX code: one 16-byte load, mask/shift, convert, fused multiply-add.

Everything here is generic LLVM IR (no x86 intrinsics): on an AVX-512 machine a vector is one
zmm register, on AVX2 LLVM splits it into two ymm, elsewhere into what the target has.

Loads take an array and a *flat element index* and do no bounds or wrap-around checks: callers
validate shapes before entering a kernel. Arrays must be C-contiguous.

Exactness: `vmul`, `vadd`, `vsub` are plain IEEE operations (no fast-math flags, so LLVM never fuses
them into an FMA); dequantization written with them reproduces ggml's float32 results bit for bit.
`vfma` is `llvm.fmuladd` (fused where the target has FMA), used only for dot-product accumulation.
"""
from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic, models, register_model

from ..host import host_has

LANES = 16
_f32 = ir.FloatType()
_i64 = ir.IntType(64)
_i32 = ir.IntType(32)
_i16 = ir.IntType(16)
_i8 = ir.IntType(8)
_VF = ir.VectorType(_f32, LANES)
_VI = ir.VectorType(_i32, LANES)
_VB = ir.VectorType(_i8, LANES)


class F32x16(types.Type):
    def __init__(self):
        super().__init__(name="F32x16")


class I32x16(types.Type):
    def __init__(self):
        super().__init__(name="I32x16")


f32x16 = F32x16()
i32x16 = I32x16()


@register_model(F32x16)
class _F32x16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VF)


@register_model(I32x16)
class _I32x16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VI)


def _elem_ptr(context, builder, aty, arr, idx):
    a = context.make_array(aty)(context, builder, arr)
    return builder.gep(a.data, [idx], inbounds=True)


def _load(context, builder, aty, arr, idx, ty, align):
    p = _elem_ptr(context, builder, aty, arr, idx)
    return builder.load(builder.bitcast(p, ty.as_pointer()), align=align, typ=ty)


def _splat(builder, val, vty):
    undef = ir.Constant(vty, ir.Undefined)
    v = builder.insert_element(undef, val, ir.Constant(_i32, 0))
    return builder.shuffle_vector(v, undef, ir.Constant(_VI, [0] * LANES))


def _is_u8_array(arr):
    return isinstance(arr, types.Array) and arr.dtype == types.uint8


# ------------------------------------------------------------------ scalar loads from byte arrays

def _scalar_loader(ty, convert, restype):
    @intrinsic
    def load(typingctx, arr, idx):
        if not _is_u8_array(arr):
            return None

        def cg(context, builder, sig, args):
            return convert(builder, _load(context, builder, sig.args[0], args[0], args[1], ty, 1))
        return restype(arr, types.intp), cg
    return load


ld_u8 = _scalar_loader(_i8, lambda b, v: b.zext(v, _i64), types.int64)
ld_i8 = _scalar_loader(_i8, lambda b, v: b.sext(v, _i64), types.int64)
ld_u16 = _scalar_loader(_i16, lambda b, v: b.zext(v, _i64), types.int64)
ld_u32 = _scalar_loader(_i32, lambda b, v: b.zext(v, _i64), types.int64)
ld_f16 = _scalar_loader(_i16, lambda b, v: b.fpext(b.bitcast(v, ir.HalfType()), _f32), types.float32)
ld_u8.__doc__ = "byte at arr.flat[idx] as int64 (unsigned)"
ld_i8.__doc__ = "byte at arr.flat[idx] as int64 (signed)"
ld_u16.__doc__ = "little-endian uint16 at byte idx, unaligned, as int64"
ld_u32.__doc__ = "little-endian uint32 at byte idx, unaligned, as int64"
ld_f16.__doc__ = "little-endian IEEE half at byte idx, as float32"


@intrinsic
def ld(typingctx, arr, idx):
    """arr.flat[idx] without bounds or wrap-around checks"""
    if not isinstance(arr, types.Array):
        return None

    def cg(context, builder, sig, args):
        return builder.load(_elem_ptr(context, builder, sig.args[0], args[0], args[1]))
    return arr.dtype(arr, types.intp), cg


# ------------------------------------------------------------------ float vectors

@intrinsic
def vzero(typingctx):
    def cg(context, builder, sig, args):
        return ir.Constant(_VF, [0.0] * LANES)
    return f32x16(), cg


@intrinsic
def vbcast(typingctx, s):
    """all lanes = s (float32)"""
    def cg(context, builder, sig, args):
        return _splat(builder, args[0], _VF)
    return f32x16(types.float32), cg


def _vector_loader(dtype, ty, align, restype, doc):
    """An intrinsic (arr, idx) -> the vector `ty` at arr.flat[idx] of a `dtype` array."""
    @intrinsic
    def load(typingctx, arr, idx):
        if not (isinstance(arr, types.Array) and arr.dtype == dtype):
            return None

        def cg(context, builder, sig, args):
            return _load(context, builder, sig.args[0], args[0], args[1], ty, align)
        return restype(arr, types.intp), cg
    load.__doc__ = doc
    return load


vload = _vector_loader(types.float32, _VF, 4, f32x16, "arr.flat[idx : idx + 16] of a float32 array")


@intrinsic
def vstore(typingctx, arr, idx, v):
    """arr.flat[idx : idx + 16] = v for a float32 array"""
    if not (isinstance(arr, types.Array) and arr.dtype == types.float32):
        return None

    def cg(context, builder, sig, args):
        p = _elem_ptr(context, builder, sig.args[0], args[0], args[1])
        builder.store(args[2], builder.bitcast(p, _VF.as_pointer()), align=4)
        return context.get_dummy_value()
    return types.void(arr, types.intp, f32x16), cg


def _fbinary(op, doc):
    @intrinsic
    def f(typingctx, a, b):
        def cg(context, builder, sig, args):
            return getattr(builder, op)(args[0], args[1])
        return f32x16(f32x16, f32x16), cg
    f.__doc__ = doc
    return f


vadd = _fbinary("fadd", "a + b (IEEE, never fused)")
vsub = _fbinary("fsub", "a - b (IEEE, never fused)")
vmul = _fbinary("fmul", "a * b (IEEE, never fused)")


@intrinsic
def vmax(typingctx, a, b):
    """The larger of a and b per lane (b where either is NaN: vmaxps)"""
    def cg(context, builder, sig, args):
        return builder.select(builder.fcmp_ordered(">", args[0], args[1]), args[0], args[1])
    return f32x16(f32x16, f32x16), cg


@intrinsic
def vhmax(typingctx, v):
    """The largest lane of v (NaN lanes ignored unless all are NaN)"""
    def cg(context, builder, sig, args):
        fnty = ir.FunctionType(_f32, [_VF])
        fn = cgutils.get_or_insert_function(builder.module, fnty,
                                            "llvm.vector.reduce.fmax.v16f32")
        return builder.call(fn, args)
    return types.float32(f32x16), cg


@intrinsic
def vfma(typingctx, a, b, c):
    """a * b + c, fused where the target has FMA"""
    def cg(context, builder, sig, args):
        fnty = ir.FunctionType(_VF, [_VF, _VF, _VF])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.fmuladd.v16f32")
        return builder.call(fn, args)
    return f32x16(f32x16, f32x16, f32x16), cg


@intrinsic
def vflag_above(typingctx, v, s):
    """Bit i set where lane i of v is above s (float32), NaN or +inf: an int64 mask (vcmpps)."""
    def cg(context, builder, sig, args):
        above = builder.fcmp_ordered(">", args[0], _splat(builder, args[1], _VF))
        odd = builder.fcmp_unordered(">=", args[0], ir.Constant(_VF, [float("inf")] * LANES))
        bits = builder.bitcast(builder.or_(above, odd), ir.IntType(LANES))
        return builder.zext(bits, ir.IntType(64))
    return types.int64(f32x16, types.float32), cg


@intrinsic
def vsum(typingctx, v):
    """horizontal sum of the 16 lanes (pairwise tree) as float32"""
    def cg(context, builder, sig, args):
        v = args[0]
        n = LANES
        while n > 1:
            h = n // 2
            mask_t = ir.VectorType(_i32, h)
            lo = builder.shuffle_vector(v, v, ir.Constant(mask_t, list(range(h))))
            hi = builder.shuffle_vector(v, v, ir.Constant(mask_t, list(range(h, n))))
            v = builder.fadd(lo, hi)
            n = h
        return builder.extract_element(v, ir.Constant(_i32, 0))
    return types.float32(f32x16), cg


@intrinsic
def vf16(typingctx, arr, idx):
    """16 little-endian halfs starting at byte idx of a uint8 array, as float32 (exact)"""
    if not _is_u8_array(arr):
        return None

    def cg(context, builder, sig, args):
        vh = ir.VectorType(ir.HalfType(), LANES)
        return builder.fpext(_load(context, builder, sig.args[0], args[0], args[1], vh, 1), _VF)
    return f32x16(arr, types.intp), cg


@intrinsic
def vbf16(typingctx, arr, idx):
    """16 little-endian bfloat16 starting at byte idx of a uint8 array, as float32 (exact)"""
    if not _is_u8_array(arr):
        return None

    def cg(context, builder, sig, args):
        vh = ir.VectorType(_i16, LANES)
        h = _load(context, builder, sig.args[0], args[0], args[1], vh, 1)
        bits = builder.shl(builder.zext(h, _VI), _splat(builder, ir.Constant(_i32, 16), _VI))
        return builder.bitcast(bits, _VF)
    return f32x16(arr, types.intp), cg


vf32b = _vector_loader(types.uint8, _VF, 1, f32x16,
                       "16 little-endian float32 starting at byte idx of a uint8 array")


@intrinsic
def vlut(typingctx, table, a):
    """table[a[i]] per lane, for a float32 table (a gather; indices must be in range)"""
    if not (isinstance(table, types.Array) and table.dtype == types.float32):
        return None

    def cg(context, builder, sig, args):
        t = context.make_array(sig.args[0])(context, builder, args[0])
        v64 = ir.VectorType(_i64, LANES)
        base = _splat(builder, builder.ptrtoint(t.data, _i64), v64)
        off = builder.mul(builder.zext(args[1], v64), _splat(builder, ir.Constant(_i64, 4), v64))
        ptrs = builder.inttoptr(builder.add(base, off), ir.VectorType(_f32.as_pointer(), LANES))
        mask_t = ir.VectorType(ir.IntType(1), LANES)
        fnty = ir.FunctionType(_VF, [ptrs.type, _i32, mask_t, _VF])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.masked.gather.v16f32.v16p0")
        return builder.call(fn, [ptrs, ir.Constant(_i32, 4), ir.Constant(mask_t, [1] * LANES),
                                 ir.Constant(_VF, ir.Undefined)])
    return f32x16(table, i32x16), cg


def _prefetch_hint(locality: int):
    """an intrinsic asking for the cache line of byte idx of a uint8 array (llvm.prefetch, a read
    into the data cache with this locality, 0..3: never faults, so idx may lie past the end)"""
    def hint(typingctx, arr, idx):
        if not _is_u8_array(arr):
            return None

        def cg(context, builder, sig, args):
            a = context.make_array(sig.args[0])(context, builder, args[0])
            p = builder.inttoptr(builder.add(builder.ptrtoint(a.data, _i64), args[1]),
                                 _i8.as_pointer())
            fnty = ir.FunctionType(ir.VoidType(), [p.type, _i32, _i32, _i32])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
            builder.call(fn, [p, ir.Constant(_i32, 0), ir.Constant(_i32, locality),
                              ir.Constant(_i32, 1)])
            return context.get_dummy_value()
        return types.void(arr, types.intp), cg
    return hint


# into every cache level (prefetcht0): data used again soon, such as a sequence's KV rows
prefetch = intrinsic(_prefetch_hint(3))
# non-temporal (prefetchnta on x86): data read once per step, such as a matrix's weights, which
# would otherwise evict from L2 and L3 what is used again (the KV cache, the activations)
prefetch_stream = intrinsic(_prefetch_hint(0))


# ------------------------------------------------------------------ int32 vectors

@intrinsic
def vu8(typingctx, arr, idx):
    """16 bytes at arr.flat[idx] of a uint8 array, zero-extended to int32 lanes"""
    if not _is_u8_array(arr):
        return None

    def cg(context, builder, sig, args):
        return builder.zext(_load(context, builder, sig.args[0], args[0], args[1], _VB, 1), _VI)
    return i32x16(arr, types.intp), cg


@intrinsic
def vi8(typingctx, arr, idx):
    """16 bytes at arr.flat[idx] of a uint8 array read as int8, sign-extended to int32 lanes"""
    if not _is_u8_array(arr):
        return None

    def cg(context, builder, sig, args):
        return builder.sext(_load(context, builder, sig.args[0], args[0], args[1], _VB, 1), _VI)
    return i32x16(arr, types.intp), cg


def _ibinary(op, doc):
    @intrinsic
    def f(typingctx, a, b):
        def cg(context, builder, sig, args):
            return getattr(builder, op)(args[0], args[1])
        return i32x16(i32x16, i32x16), cg
    f.__doc__ = doc
    return f


viand = _ibinary("and_", "a & b")
vior = _ibinary("or_", "a | b")
visub = _ibinary("sub", "a - b")
vishrv = _ibinary("lshr", "a >> b per lane (logical)")


def _ishift(op, doc):
    @intrinsic
    def f(typingctx, a, n):
        def cg(context, builder, sig, args):
            return getattr(builder, op)(args[0], _splat(builder, builder.trunc(args[1], _i32), _VI))
        return i32x16(i32x16, types.intp), cg
    f.__doc__ = doc
    return f


vishr = _ishift("lshr", "a >> n (logical, n scalar)")
vishl = _ishift("shl", "a << n (n scalar)")


@intrinsic
def vibcast(typingctx, s):
    """all lanes = s (truncated to int32)"""
    def cg(context, builder, sig, args):
        return _splat(builder, builder.trunc(args[0], _i32), _VI)
    return i32x16(types.intp), cg


@intrinsic
def viota(typingctx):
    """lanes 0, 1, ..., 15"""
    def cg(context, builder, sig, args):
        return ir.Constant(_VI, list(range(LANES)))
    return i32x16(), cg


@intrinsic
def vcvt(typingctx, a):
    """int32 lanes to float32 (exact for |a| < 2**24)"""
    def cg(context, builder, sig, args):
        return builder.sitofp(args[0], _VF)
    return f32x16(i32x16), cg


# ------------------------------------------------------------------ 4 x 4 output tiles

def _merge(builder, u, v, width):
    """u, v hold 16 / width groups of `width` partial sums each; returns one vector with
    32 / width groups of width / 2 (pairs of lanes added), u's groups first."""
    h = width // 2
    lo, hi = [], []
    for base in (0, LANES):
        for g in range(0, LANES, width):
            lo += [base + g + i for i in range(h)]
            hi += [base + g + h + i for i in range(h)]
    a = builder.shuffle_vector(u, v, ir.Constant(_VI, lo))
    b = builder.shuffle_vector(u, v, ir.Constant(_VI, hi))
    return builder.fadd(a, b)


@intrinsic
def vreduce16(typingctx, *vectors):
    """vreduce16(a0, ..., a15): lane i of the result = horizontal sum of a_i (a transpose-and-add
    tree, 45 instructions). Sixteen f32x16 operands, given one by one; numba passes them as one
    tuple, which LLVM takes apart again at no cost."""
    if len(vectors) != LANES or any(v != f32x16 for v in vectors):
        return None

    def cg(context, builder, sig, args):
        level = [builder.extract_value(args[0], i) for i in range(LANES)]
        width = LANES
        while len(level) > 1:
            level = [_merge(builder, level[i], level[i + 1], width) for i in range(0, len(level), 2)]
            width //= 2
        return level[0]
    return f32x16(types.StarArgUniTuple(f32x16, LANES)), cg


def _store_groups(context, builder, aty, arr, idx, stride, v, accumulate, width, n_groups):
    """arr.flat[idx + j * stride + i] (+)= v[width * j + i] for i < width, j < n_groups"""
    a = context.make_array(aty)(context, builder, arr)
    vg = ir.VectorType(_f32, width)
    acc = builder.icmp_unsigned("!=", accumulate, ir.Constant(accumulate.type, 0))
    for j in range(n_groups):
        lanes = ir.Constant(ir.VectorType(_i32, width), [width * j + i for i in range(width)])
        part = builder.shuffle_vector(v, v, lanes)
        off = builder.add(idx, builder.mul(stride, ir.Constant(_i64, j)))
        p = builder.bitcast(builder.gep(a.data, [off], inbounds=True), vg.as_pointer())
        old = builder.load(p, align=4, typ=vg)
        builder.store(builder.select(acc, builder.fadd(old, part), part), p, align=4)
    return context.get_dummy_value()


@intrinsic
def vstore4x4(typingctx, arr, idx, stride, v, accumulate):
    """arr.flat[idx + j * stride + i] (+)= v[4j + i] for i, j < 4 (float32 array); adds to the
    values there when `accumulate`"""
    if not (isinstance(arr, types.Array) and arr.dtype == types.float32):
        return None

    def cg(context, builder, sig, args):
        return _store_groups(context, builder, sig.args[0], args[0], args[1], args[2], args[3],
                             args[4], 4, 4)
    return types.void(arr, types.intp, types.intp, f32x16, types.boolean), cg


@intrinsic
def vstore2x8(typingctx, arr, idx, stride, v, accumulate):
    """arr.flat[idx + j * stride + i] (+)= v[2j + i] for i < 2, j < 8 (float32 array): a tile of
    2 columns by 8 rows; adds to the values there when `accumulate`"""
    if not (isinstance(arr, types.Array) and arr.dtype == types.float32):
        return None

    def cg(context, builder, sig, args):
        return _store_groups(context, builder, sig.args[0], args[0], args[1], args[2], args[3],
                             args[4], 2, 8)
    return types.void(arr, types.intp, types.intp, f32x16, types.boolean), cg


@intrinsic
def vstore4(typingctx, arr, idx, v, accumulate):
    """arr.flat[idx + i] (+)= v[i] for i < 4 (float32 array); adds when `accumulate`"""
    if not (isinstance(arr, types.Array) and arr.dtype == types.float32):
        return None

    def cg(context, builder, sig, args):
        return _store_groups(context, builder, sig.args[0], args[0], args[1],
                             ir.Constant(_i64, 0), args[2], args[3], 4, 1)
    return types.void(arr, types.intp, f32x16, types.boolean), cg


# ------------------------------------------------------------------ numba's thread count

# numba's own `get_num_threads` / `set_num_threads` overloads use ctypes globals, which stop a
# function from being cached; these call the same thread-local C setters of the threading layer by
# the symbol names numba registers for them (as its parfor code does), so they cache.

@intrinsic
def threads_get(typingctx):
    """numba's thread count for the calling thread (what a prange would use)"""
    def cg(context, builder, sig, args):
        # declared exactly as numba's parfor lowering declares it (it returns a C int)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_i64, []), "get_num_threads")
        return builder.sext(builder.trunc(builder.call(fn, []), _i32), _i64)
    return types.intp(), cg


@intrinsic
def threads_set(typingctx, n):
    """set numba's thread count for the calling thread (1 <= n <= numba.config.NUMBA_NUM_THREADS)"""
    def cg(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [_i32]),
                                            "set_num_threads")
        builder.call(fn, [builder.trunc(args[0], _i32)])
        return context.get_dummy_value()
    return types.void(types.intp), cg


# ------------------------------------------------------------------ bfloat16 dot products
# AVX512-BF16's vdpbf16ps: 32 bf16 products summed pairwise into 16 float32 lanes per instruction,
# twice the multiply-adds of a float32 FMA. Only where the CPU has it (HAS_AVX512_BF16): LLVM has
# no fallback for the intrinsic.

class _BFloatType(ir.Type):
    """LLVM's `bfloat` (llvmlite's IR builder has no class for it; its text is all LLVM needs)."""

    def _to_string(self):
        return "bfloat"

    def __eq__(self, other):
        return isinstance(other, _BFloatType)

    def __hash__(self):
        return hash("bfloat")


_VBF = ir.VectorType(_BFloatType(), 2 * LANES)


class BF16x32(types.Type):
    def __init__(self):
        super().__init__(name="BF16x32")


bf16x32 = BF16x32()


@register_model(BF16x32)
class _BF16x32Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VBF)



HAS_AVX512_BF16 = host_has("avx512bf16")


vload_bf16 = _vector_loader(types.uint16, _VBF, 2, bf16x32,
                            "arr.flat[idx : idx + 32] of a uint16 array holding bfloat16 bits")


@intrinsic
def vdot_bf16(typingctx, a, b, acc):
    """acc[i] + a[2i] * b[2i] + a[2i + 1] * b[2i + 1] (vdpbf16ps)"""
    def cg(context, builder, sig, args):
        fnty = ir.FunctionType(_VF, [_VF, _VBF, _VBF])
        fn = cgutils.get_or_insert_function(builder.module, fnty,
                                            "llvm.x86.avx512bf16.dpbf16ps.512")
        return builder.call(fn, [args[2], args[0], args[1]])
    return f32x16(bf16x32, bf16x32, f32x16), cg


@intrinsic
def vstore_bf16(typingctx, arr, idx, v):
    """arr.flat[idx : idx + 16] = v rounded to bfloat16 (nearest even), uint16 array"""
    if not (isinstance(arr, types.Array) and arr.dtype == types.uint16):
        return None

    def cg(context, builder, sig, args):
        vh = ir.VectorType(_BFloatType(), LANES)
        p = _elem_ptr(context, builder, sig.args[0], args[0], args[1])
        builder.store(builder.fptrunc(args[2], vh), builder.bitcast(p, vh.as_pointer()), align=2)
        return context.get_dummy_value()
    return types.void(arr, types.intp, f32x16), cg


# ------------------------------------------------------------------ 8-bit integer dot products
# An I32x16 also carries 64 bytes (4 to a lane): the 8-bit decode kernels (`matmul_int8`) unpack
# weights into bytes with the int32 operations above (masks like 0x0F0F0F0F act on every byte)
# and multiply them into 8-bit activations with `vdpbusd`, 64 products per instruction: vpdpbusd,
# as ggml's x86 dot products, from AVX512-VNNI (one zmm) or AVX-VNNI (two ymm halves). Without
# either, LLVM's generic lowering (vpmaddwd on 16-bit products) is slower than the float32
# kernels, so matmul uses the 8-bit kernels only where HAS_INT8_DOT.

VNNI = "avx512vnni" if host_has("avx512vnni") else "avxvnni" if host_has("avxvnni") else None
HAS_INT8_DOT = VNNI is not None
_VB64 = ir.VectorType(_i8, 4 * LANES)
_VB32 = ir.VectorType(_i8, 2 * LANES)


def _concat(builder, a, b):
    n = a.type.count
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_i32, 2 * n), list(range(2 * n))))


vbytes = _vector_loader(types.uint8, _VI, 1, i32x16,
                        "the 64 bytes at arr.flat[idx] of a uint8 array, 4 to a lane")


@intrinsic
def vbytes2(typingctx, arr, i0, i1):
    """the 32 bytes at arr.flat[i0], then the 32 at arr.flat[i1] (uint8 array)"""
    if not _is_u8_array(arr):
        return None

    def cg(context, builder, sig, args):
        a, b = (_load(context, builder, sig.args[0], args[0], i, _VB32, 1) for i in args[1:])
        return builder.bitcast(_concat(builder, a, b), _VI)
    return i32x16(arr, types.intp, types.intp), cg


@intrinsic
def vnibbles2(typingctx, arr, i0, i1):
    """the nibbles of the 16 bytes at arr.flat[i0] and of the 16 at arr.flat[i1] as 64 bytes
    0..15: low nibbles of i0's, high nibbles of i0's, low of i1's, high of i1's (a legacy 4-bit
    block keeps values 0..15 in the low nibbles, 16..31 in the high ones)"""
    if not _is_u8_array(arr):
        return None

    def cg(context, builder, sig, args):
        a, b = (_load(context, builder, sig.args[0], args[0], i, ir.VectorType(_i8, 16), 1)
                for i in args[1:])
        ab = _concat(builder, a, b)
        lo = builder.and_(ab, ir.Constant(_VB32, [15] * 32))
        hi = builder.lshr(ab, ir.Constant(_VB32, [4] * 32))
        order = list(range(16)) + list(range(32, 48)) + list(range(16, 32)) + list(range(48, 64))
        return builder.bitcast(builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(_i32, 64), order)), _VI)
    return i32x16(arr, types.intp, types.intp), cg


@intrinsic
def vbits2(typingctx, arr, i0, i1):
    """the 32 bits of the little-endian word at arr.flat[i0], then of the one at i1, as 64 bytes
    of 16 (bit set) or 0: a Q5 block's fifth bits, ready to be or-ed onto its nibbles"""
    if not _is_u8_array(arr):
        return None

    def cg(context, builder, sig, args):
        bits = ir.VectorType(ir.IntType(1), 32)
        halves = []
        for i in args[1:]:
            word = _load(context, builder, sig.args[0], args[0], i, _i32, 1)
            halves.append(builder.select(builder.bitcast(word, bits), ir.Constant(_VB32, [16] * 32),
                                         ir.Constant(_VB32, [0] * 32)))
        return builder.bitcast(_concat(builder, *halves), _VI)
    return i32x16(arr, types.intp, types.intp), cg


@intrinsic
def vdpbusd(typingctx, acc, u, s):
    """acc + the sums of 4 products u.byte[4i + j] * s.byte[4i + j] in lane i, u's bytes unsigned
    and s's signed (vpdpbusd, exact: no saturation)"""
    def cg(context, builder, sig, args):
        acc, u, s = args
        if VNNI == "avx512vnni":
            fnty = ir.FunctionType(_VI, [_VI, _VB64, _VB64])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.avx512.vpdpbusd.512")
            return builder.call(fn, [acc, builder.bitcast(u, _VB64), builder.bitcast(s, _VB64)])
        if VNNI == "avxvnni":  # the same intrinsic on 256 bits is AVX-VNNI's {vex} vpdpbusd
            v8, b32 = ir.VectorType(_i32, 8), ir.VectorType(_i8, 32)
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8, [v8, b32, b32]),
                                                "llvm.x86.avx512.vpdpbusd.256")
            halves = []
            for h in range(2):
                lanes = ir.Constant(ir.VectorType(_i32, 8), list(range(8 * h, 8 * h + 8)))
                part = [builder.shuffle_vector(v, v, lanes) for v in (acc, u, s)]
                halves.append(builder.call(fn, [part[0], builder.bitcast(part[1], b32),
                                                builder.bitcast(part[2], b32)]))
            return _concat(builder, *halves)
        wide = ir.VectorType(_i32, 4 * LANES)
        p = builder.mul(builder.zext(builder.bitcast(u, _VB64), wide),
                        builder.sext(builder.bitcast(s, _VB64), wide))
        for j in range(4):
            acc = builder.add(acc, builder.shuffle_vector(
                p, p, ir.Constant(_VI, [4 * i + j for i in range(LANES)])))
        return acc
    return i32x16(i32x16, i32x16, i32x16), cg


@intrinsic
def vi8x4(typingctx, arr, idx):
    """the 4 bytes at arr.flat[idx] read as int8, lane i = byte i // 4 (sign-extended)"""
    if not _is_u8_array(arr):
        return None

    def cg(context, builder, sig, args):
        v = builder.sext(_load(context, builder, sig.args[0], args[0], args[1],
                               ir.VectorType(_i8, 4), 1), ir.VectorType(_i32, 4))
        return builder.shuffle_vector(v, v, ir.Constant(_VI, [i // 4 for i in range(LANES)]))
    return i32x16(arr, types.intp), cg


@intrinsic
def vbyte_pairs(typingctx, word):
    """lane i = byte i // 2 of a 64-bit word (unsigned)"""
    def cg(context, builder, sig, args):
        v = builder.zext(builder.bitcast(args[0], ir.VectorType(_i8, 8)), ir.VectorType(_i32, 8))
        return builder.shuffle_vector(v, v, ir.Constant(_VI, [i // 2 for i in range(LANES)]))
    return i32x16(types.int64), cg


def _pair8(builder, a, b, vty):
    two = ir.VectorType(vty.element, 2)
    v = builder.insert_element(ir.Constant(two, ir.Undefined), a, ir.Constant(_i32, 0))
    v = builder.insert_element(v, b, ir.Constant(_i32, 1))
    return builder.shuffle_vector(v, v, ir.Constant(_VI, [i // 8 for i in range(LANES)]))


@intrinsic
def vpair8(typingctx, a, b):
    """lanes 0-7 = a, lanes 8-15 = b (float32)"""
    def cg(context, builder, sig, args):
        return _pair8(builder, args[0], args[1], _VF)
    return f32x16(types.float32, types.float32), cg


@intrinsic
def vipair8(typingctx, a, b):
    """lanes 0-7 = a, lanes 8-15 = b (truncated to int32)"""
    def cg(context, builder, sig, args):
        return _pair8(builder, builder.trunc(args[0], _i32), builder.trunc(args[1], _i32), _VI)
    return i32x16(types.intp, types.intp), cg


@intrinsic
def vizero(typingctx):
    def cg(context, builder, sig, args):
        return ir.Constant(_VI, [0] * LANES)
    return i32x16(), cg


vloadi = _vector_loader(types.int32, _VI, 4, i32x16, "arr.flat[idx : idx + 16] of an int32 array")
viadd = _ibinary("add", "a + b")
vimul = _ibinary("mul", "a * b (low 32 bits)")
vixor = _ibinary("xor", "a ^ b")


# ------------------------------------------------------------------ unpacking i-quants for 8-bit tiles
# (`matmul_prompt8`): 16 weight rows at a time, one per lane, gathered from their file layout

def _gather_i32(builder, ptrs):
    mask_t = ir.VectorType(ir.IntType(1), LANES)
    fnty = ir.FunctionType(_VI, [ptrs.type, _i32, mask_t, _VI])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.masked.gather.v16i32.v16p0")
    return builder.call(fn, [ptrs, ir.Constant(_i32, 1), ir.Constant(mask_t, [1] * LANES),
                             ir.Constant(_VI, ir.Undefined)])


def _lane_addresses(builder, base, offsets):
    """base (i64 address) + offsets (16 x i64) as 16 i32 pointers"""
    v64 = ir.VectorType(_i64, LANES)
    return builder.inttoptr(builder.add(_splat(builder, base, v64), offsets),
                            ir.VectorType(_i32.as_pointer(), LANES))


@intrinsic
def vgather_rows(typingctx, arr, idx, stride):
    """lane i = the little-endian uint32 at byte idx + i * stride of a uint8 array (unaligned):
    the same field of 16 rows"""
    if not _is_u8_array(arr):
        return None

    def cg(context, builder, sig, args):
        a = context.make_array(sig.args[0])(context, builder, args[0])
        v64 = ir.VectorType(_i64, LANES)
        base = builder.add(builder.ptrtoint(a.data, _i64), args[1])
        offsets = builder.mul(ir.Constant(v64, list(range(LANES))), _splat(builder, args[2], v64))
        return _gather_i32(builder, _lane_addresses(builder, base, offsets))
    return i32x16(arr, types.intp, types.intp), cg


@intrinsic
def vlut_u32(typingctx, table, a):
    """table[a[i]] per lane for a uint32 table (a gather; indices must be in range)"""
    if not (isinstance(table, types.Array) and table.dtype == types.uint32):
        return None

    def cg(context, builder, sig, args):
        t = context.make_array(sig.args[0])(context, builder, args[0])
        v64 = ir.VectorType(_i64, LANES)
        offsets = builder.mul(builder.zext(args[1], v64), _splat(builder, ir.Constant(_i64, 4), v64))
        return _gather_i32(builder, _lane_addresses(builder, builder.ptrtoint(t.data, _i64), offsets))
    return i32x16(table, i32x16), cg


@intrinsic
def vbyte_masks(typingctx, a):
    """each byte of a: 0xFF where it is not zero, else 0"""
    def cg(context, builder, sig, args):
        b = builder.bitcast(args[0], _VB64)
        nonzero = builder.icmp_unsigned("!=", b, ir.Constant(_VB64, [0] * (4 * LANES)))
        return builder.bitcast(builder.sext(nonzero, _VB64), _VI)
    return i32x16(i32x16), cg


@intrinsic
def vhalf_lo(typingctx, a):
    """the IEEE half in the low 16 bits of each lane, as float32 (exact)"""
    def cg(context, builder, sig, args):
        h = builder.bitcast(builder.trunc(args[0], ir.VectorType(_i16, LANES)),
                            ir.VectorType(ir.HalfType(), LANES))
        return builder.fpext(h, _VF)
    return f32x16(i32x16), cg


_BYTE_SHUFFLE = "avx512bw" if host_has("avx512bw") else "avx2" if host_has("avx2") else None


@intrinsic
def vshuffle_bytes(typingctx, table, a):
    """byte i of the result = byte a[i] (0..15) of table's 16-byte lane (128 bits) holding byte i
    (pshufb: a 16-entry byte table in a register, repeated in each 128-bit lane)"""
    def cg(context, builder, sig, args):
        t, idx = (builder.bitcast(v, _VB64) for v in args)
        if _BYTE_SHUFFLE == "avx512bw":
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VB64, [_VB64, _VB64]),
                                                "llvm.x86.avx512.pshuf.b.512")
            return builder.bitcast(builder.call(fn, [t, idx]), _VI)
        if _BYTE_SHUFFLE == "avx2":
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VB32, [_VB32, _VB32]),
                                                "llvm.x86.avx2.pshuf.b")
            halves = []
            for h in range(2):
                lanes = ir.Constant(ir.VectorType(_i32, 32), list(range(32 * h, 32 * h + 32)))
                halves.append(builder.call(fn, [builder.shuffle_vector(v, v, lanes) for v in (t, idx)]))
            return builder.bitcast(_concat(builder, *halves), _VI)
        out = ir.Constant(_VB64, ir.Undefined)  # elsewhere: byte by byte
        for i in range(4 * LANES):
            lane = ir.Constant(_i32, i)
            j = builder.and_(builder.extract_element(idx, lane), ir.Constant(_i8, 15))
            at = builder.add(builder.zext(j, _i32), ir.Constant(_i32, i // 16 * 16))
            out = builder.insert_element(out, builder.extract_element(t, at), lane)
        return builder.bitcast(out, _VI)
    return i32x16(i32x16, i32x16), cg


@intrinsic
def vstorei(typingctx, arr, idx, v):
    """arr.flat[idx : idx + 16] = v for a uint32 or int32 array"""
    if not (isinstance(arr, types.Array) and arr.dtype in (types.uint32, types.int32)):
        return None

    def cg(context, builder, sig, args):
        p = _elem_ptr(context, builder, sig.args[0], args[0], args[1])
        builder.store(args[2], builder.bitcast(p, _VI.as_pointer()), align=4)
        return context.get_dummy_value()
    return types.void(arr, types.intp, i32x16), cg


# ------------------------------------------------------------------ 16-entry table in a register
# A 16-value table (MXFP4's levels) held in one vector and looked up with a permute: one vpermps
# where vlut's gather from memory costs a load per lane.

_PERMUTE = "avx512f" if host_has("avx512f") else "avx2" if host_has("avx2") else None


@intrinsic
def vperm16(typingctx, table, a):
    """table[a[i] & 15] per lane, `table` an f32x16 (a permute, which reads only the index's low
    4 bits: a nibble needs no mask)"""
    def cg(context, builder, sig, args):
        t, idx = args
        if _PERMUTE == "avx512f":
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF, _VI]),
                                                "llvm.x86.avx512.permvar.sf.512")
            return builder.call(fn, [t, idx])
        if _PERMUTE == "avx2":  # two 8-entry vpermps per half, chosen by bit 3 of the index
            v8, i8 = ir.VectorType(_f32, 8), ir.VectorType(_i32, 8)
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8, [v8, i8]),
                                                "llvm.x86.avx2.permps")
            lo, hi = (builder.shuffle_vector(t, t, ir.Constant(i8, list(range(b, b + 8))))
                      for b in (0, 8))
            halves = []
            for h in range(2):
                lanes = ir.Constant(i8, list(range(8 * h, 8 * h + 8)))
                ih = builder.shuffle_vector(idx, idx, lanes)
                upper = builder.icmp_unsigned("!=", builder.and_(ih, ir.Constant(i8, [8] * 8)),
                                              ir.Constant(i8, [0] * 8))
                halves.append(builder.select(upper, builder.call(fn, [hi, ih]),
                                             builder.call(fn, [lo, ih])))
            return _concat(builder, *halves)
        idx = builder.and_(idx, ir.Constant(_VI, [15] * LANES))  # elsewhere: lane by lane
        out = ir.Constant(_VF, ir.Undefined)
        for i in range(LANES):
            lane = ir.Constant(_i32, i)
            out = builder.insert_element(out, builder.extract_element(
                t, builder.extract_element(idx, lane)), lane)
        return out
    return f32x16(f32x16, i32x16), cg


@intrinsic
def vsigned_rows(typingctx, values, i0, i1, signs, j0, j1):
    """lanes 0-7 = row i0 of `values` (float32, 8 columns), lanes 8-15 = row i1, their sign bits
    xor-ed with rows j0 and j1 of `signs` (uint32, 8 columns of 0 or 0x80000000): two grid
    points of an i-quant with their signs, in four 32-byte loads (both tables C-contiguous)"""
    if not (isinstance(values, types.Array) and values.dtype == types.float32
            and isinstance(signs, types.Array) and signs.dtype == types.uint32):
        return None

    def cg(context, builder, sig, args):
        def rows(k, ty):
            eight = ir.Constant(_i64, 8)
            a, b = (_load(context, builder, sig.args[k], args[k], builder.mul(i, eight),
                          ir.VectorType(ty, 8), 4) for i in args[k + 1:k + 3])
            return builder.shuffle_vector(a, b, ir.Constant(_VI, list(range(LANES))))
        bits = builder.xor(builder.bitcast(rows(0, _f32), _VI), rows(3, _i32))
        return builder.bitcast(bits, _VF)
    return f32x16(values, types.intp, types.intp, signs, types.intp, types.intp), cg


@intrinsic
def vsigned16(typingctx, lo, hi, mlo, mhi):
    """lane i = byte i of the 128 bits lo | hi << 64 read as int8, negated where byte i of
    mlo | mhi << 64 is 0xFF ((b ^ m) - m on the bytes, then sign-extended to int32): 16 grid
    values of an i-quant, gathered as two 64-bit words, with their sign masks"""
    def cg(context, builder, sig, args):
        def pack(a, b):
            v = ir.Constant(ir.VectorType(_i64, 2), ir.Undefined)
            v = builder.insert_element(v, a, ir.Constant(_i32, 0))
            return builder.bitcast(builder.insert_element(v, b, ir.Constant(_i32, 1)), _VB)
        b, m = pack(args[0], args[1]), pack(args[2], args[3])
        return builder.sext(builder.sub(builder.xor(b, m), m), _VI)
    return i32x16(types.int64, types.int64, types.int64, types.int64), cg
