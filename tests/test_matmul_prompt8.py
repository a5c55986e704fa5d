"""The 8-bit prompt kernels (llamatui.inference.cpu.matmul_prompt8): each group of 16 rows of a
format without a packed layout unpacked into 8-bit values and a scale per 32 values, multiplied
into activations quantized as ggml's quantize_row_q8_K. A prompt's product (more tokens than the
batch decode kernel takes) must equal the float64 product of the dequantized weights (gguf-py)
and the dequantized activations up to float32 rounding, and stay within the activations' 8-bit
rounding of the exact product, for any number of tokens (tiles of 8, padded).
"""
import numpy as np
import pytest

import llamatui.inference.cpu.matmul as mm
from llamatui.inference.cpu import matmul_prompt8, simd
from golden_vectors import rows_of
from test_matmul import RTOL, reference
from test_matmul_int8 import ROUNDING, rounded

PROMPT8_TYPES = tuple(matmul_prompt8.KERNELS)

pytestmark = pytest.mark.skipif(not simd.HAS_INT8_DOT,
                                reason="no AVX512-VNNI / AVX-VNNI: prompts use the float kernels")


@pytest.fixture(autouse=True)
def int8_products(monkeypatch):
    monkeypatch.setattr(mm, "USE_INT8", True)


@pytest.fixture
def taken(monkeypatch):
    """the formats whose prompt kernel ran, as matmul called it"""
    calls = []
    real = mm._prompt8

    def spy(kernel, *args):
        calls.append(kernel)
        return real(kernel, *args)
    monkeypatch.setattr(mm, "_prompt8", spy)
    return calls


def golden_rows(quant_vectors, type_name, n_rows):
    """n_rows rows of llama.cpp's quantized golden vectors (34 rows, repeated) and their
    dequantized values"""
    raw = rows_of(quant_vectors, type_name)
    raw = np.ascontiguousarray(np.resize(raw, (n_rows, raw.shape[1])))
    return raw, reference(type_name, raw)


def test_registered():
    assert "IQ2_XXS" in PROMPT8_TYPES
    assert not set(PROMPT8_TYPES) & set(mm.matmul_packed.KERNELS)  # packed formats have theirs


@pytest.mark.parametrize("type_name", PROMPT8_TYPES)
@pytest.mark.parametrize("n_tokens", [mm.BATCH_DECODE_MAX_TOKENS + 1, 24, 61])
def test_prompt_product(quant_vectors, type_name, n_tokens, taken):
    raw, W = golden_rows(quant_vectors, type_name, 48)
    x = np.random.default_rng(n_tokens).standard_normal((n_tokens, W.shape[1])).astype(np.float32)
    got = mm.matmul(type_name, raw, x)
    assert taken == [matmul_prompt8.KERNELS[type_name]]
    assert got.shape == (n_tokens, 48)
    scale = np.abs(x.astype(np.float64)) @ np.abs(W).T + 1e-30
    err = np.abs(got - rounded(x, 256) @ W.T) / scale
    assert err.max() <= RTOL, f"{type_name}: {err.max():.2e} off the product with 8-bit activations"
    err = np.abs(got - x.astype(np.float64) @ W.T) / scale
    assert err.max() <= ROUNDING, f"{type_name}: {err.max():.2e} off the exact product"


@pytest.mark.parametrize("type_name", PROMPT8_TYPES)
def test_each_token_alone_in_its_tile(quant_vectors, type_name):
    """a token's result does not depend on the tokens beside it (whole rows of activations are
    quantized on their own; padding rows are zeros)"""
    raw, _ = golden_rows(quant_vectors, type_name, 32)
    x = np.random.default_rng(1).standard_normal((40, _in_features(type_name, raw)))
    x = x.astype(np.float32)
    whole = mm.matmul(type_name, raw, x)
    part = mm.matmul(type_name, raw, x[7:7 + mm.BATCH_DECODE_MAX_TOKENS + 3])
    np.testing.assert_array_equal(part, whole[7:7 + mm.BATCH_DECODE_MAX_TOKENS + 3])


def _in_features(type_name, raw):
    qt = mm.get_quant_type(type_name)
    return raw.shape[1] // qt.type_size * qt.block_size


def test_rows_not_a_multiple_of_16_take_the_float_path(quant_vectors, taken):
    raw, W = golden_rows(quant_vectors, "IQ2_XXS", 34)
    x = np.random.default_rng(2).standard_normal((20, W.shape[1])).astype(np.float32)
    got = mm.matmul("IQ2_XXS", raw, x)
    assert taken == []
    err = np.abs(got - x.astype(np.float64) @ W.T) / (np.abs(x) @ np.abs(W).T + 1e-30)
    assert err.max() <= 2 * 2.0 ** -9 + RTOL  # float32 or bfloat16 tiles


@pytest.mark.parametrize("isa", ["avx512bw", "avx2", None])
def test_byte_shuffle_on_each_isa(isa, monkeypatch):
    """IQ4_XS's level lookup (simd.vshuffle_bytes): pshufb on 512 bits, on two 256-bit halves,
    or byte by byte, all equal to the table lookup"""
    from numba import njit
    if isa and not simd.host_has(isa):
        pytest.skip(f"this CPU has no {isa}")
    monkeypatch.setattr(simd, "_BYTE_SHUFFLE", isa)

    @njit
    def shuffle(table, idx, out):  # compiled here, after the patch: this ISA's code
        simd.vstorei(out, 0, simd.vshuffle_bytes(simd.vloadi(table, 0), simd.vloadi(idx, 0)))

    rng = np.random.default_rng(4)
    table = rng.integers(0, 256, 64, dtype=np.uint8)
    idx = rng.integers(0, 16, 64, dtype=np.uint8)
    out = np.empty(16, np.int32)
    shuffle(table.view(np.int32), idx.view(np.int32), out)
    want = table[np.arange(64) // 16 * 16 + idx]
    assert np.array_equal(out.view(np.uint8), want)
