"""llamatui.inference.cpu.matmul against gguf-py's reference dequantization.

Quantized bytes come from the starter models (the real tensors, read through our mmap reader) for
the types they contain, and from llama.cpp's own quantizer (`golden/quant_vectors.npz`: 34 rows of
4096 values, real Gemma weights and edge cases) for every type. `matmul` must equal
x @ dequantize(W).T up to float32 rounding, on the decode path (n <= DECODE_MAX_TOKENS), the batch
decode path (n <= BATCH_DECODE_MAX_TOKENS) and the tiled prefill path; `embedding_rows` must equal
the dequantized rows exactly. Where the CPU has AVX512-BF16, prompts multiply in bfloat16: within
bf16's rounding of both operands.
"""
import gguf
import numpy as np
import pytest

import llamatui.inference.cpu.matmul as mm
from golden_vectors import rows_of
from llamatui.inference.catalog import GGML_TYPES
from llamatui.inference.gguf import GGUFFile
from llamatui.inference.cpu.simd import HAS_AVX512_BF16

TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
         "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS",
         "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0",
         "MXFP4")
N_TOKENS = (1, 2, 7, 64)  # 1: decode kernel; 2, 7: batch decode kernel; 64: tiles + numba GEMM
RTOL = 1e-4  # of sum_k |x_k * w_k|: float32 accumulation error only

# float32 products here; the bfloat16 prompt path has its own test below, the 8-bit decode
# kernels test_matmul_int8.py
pytestmark = pytest.mark.usefixtures("float32_products")

# (model fixture, tensor, rows to use) for the types the starter models contain
MODEL_TENSORS = [
    ("smollm2_path", "blk.0.ffn_gate.weight", None),  # Q4_1 1536 x 576
    ("smollm2_path", "blk.3.ffn_down.weight", None),  # Q4_1 576 x 1536
    ("smollm2_path", "token_embd.weight", 300),  # Q8_0 49152 x 576
    ("gemma3_path", "blk.0.attn_q.weight", None),  # Q5_0 1024 x 640
    ("gemma3_path", "blk.0.attn_v.weight", None),  # Q8_0 256 x 640
    ("gemma3_path", "blk.0.attn_output.weight", None),  # Q4_K 640 x 1024
    ("gemma3_path", "blk.2.ffn_down.weight", None),  # Q4_K 640 x 2048
    ("gemma3_path", "blk.0.ffn_down.weight", None),  # Q6_K 640 x 2048
]


def reference(type_name: str, raw: np.ndarray) -> np.ndarray:
    """gguf-py's dequantization (float32, ggml's formulas), as float64."""
    qtype = gguf.GGMLQuantizationType[type_name]
    return gguf.quants.dequantize(np.asarray(raw), qtype).astype(np.float64)


def check_product(type_name, raw, W, n_tokens, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_tokens, W.shape[1])).astype(np.float32)
    check_prefixes(type_name, raw, W, x, [n_tokens])


def check_prefixes(type_name, raw, W, x, counts):
    """matmul of the first n tokens of x, for each n in counts, against one float64 product."""
    x64 = x.astype(np.float64)
    want = x64 @ W.T
    scale = np.abs(x64) @ np.abs(W).T + 1e-30
    for n in counts:
        got = mm.matmul(type_name, raw, x[:n])
        assert got.dtype == np.float32 and got.shape == (n, W.shape[0])
        err = np.abs(got - want[:n]) / scale[:n]
        assert err.max() <= RTOL, f"{type_name} n={n}: relative error {err.max():.2e}"


@pytest.fixture(scope="module")
def vectors(quant_vectors):
    return quant_vectors


def golden_weight(vectors, type_name):
    if type_name == "F32":
        return np.ascontiguousarray(vectors["x"]).view(np.uint8), vectors["x"].astype(np.float64)
    raw = rows_of(vectors, type_name)
    return raw, reference(type_name, raw)


def test_supported_types():
    assert set(mm.supported_matmul_types()) == set(TYPES)


@pytest.mark.parametrize("type_name", TYPES)
def test_matmul_golden_vectors(vectors, type_name):
    raw, W = golden_weight(vectors, type_name)
    assert raw.shape == (34, GGML_TYPES[type_name].row_bytes(4096))
    for n in N_TOKENS:
        check_product(type_name, raw, W, n, seed=n)


@pytest.mark.parametrize("type_name", [t for t in TYPES if t not in ("F32", "F16", "BF16")])
def test_matmul_golden_imatrix_vectors(vectors, type_name):
    raw = vectors[type_name + "_imatrix"]
    check_product(type_name, raw, reference(type_name, raw), 3)


@pytest.mark.parametrize("fixture,name,n_rows", MODEL_TENSORS)
def test_matmul_model_tensors(request, fixture, name, n_rows):
    with GGUFFile.open(request.getfixturevalue(fixture)) as f:
        t = f.tensors[name]
        raw = t.rows if n_rows is None else t.rows[:n_rows]
        assert not raw.flags.writeable  # a view of the read-only mapping, used in place
        W = reference(t.type, raw)
        for n in N_TOKENS:
            check_product(t.type, raw, W, n, seed=n)


@pytest.mark.parametrize("type_name", TYPES)
def test_embedding_rows_exact(vectors, type_name):
    raw, W = golden_weight(vectors, type_name)
    ids = np.array([0, 33, 5, 5, 17, 1])
    got = mm.embedding_rows(type_name, raw, ids)
    assert got.dtype == np.float32 and got.shape == (6, 4096)
    want = W[ids].astype(np.float32)
    assert np.array_equal(got, want)
    assert np.array_equal(np.signbit(got), np.signbit(want))


def test_embedding_rows_model_table(gemma3_path):
    # Gemma 3's 262144 x 640 Q8_0 table: only the asked rows are dequantized
    with GGUFFile.open(gemma3_path) as f:
        t = f.tensors["token_embd.weight"]
        ids = [2, 262143, 106, 0, 131072]
        got = mm.embedding_rows(t.type, t.rows, ids)
        want = reference(t.type, t.rows[ids]).astype(np.float32)
        assert np.array_equal(got, want)
        assert mm.embedding_rows(t.type, t.rows, np.array([], np.int64)).shape == (0, 640)
        with pytest.raises(IndexError):
            mm.embedding_rows(t.type, t.rows, [262144])
        with pytest.raises(IndexError):
            mm.embedding_rows(t.type, t.rows, [-1])


@pytest.mark.parametrize("type_name", [t for t in TYPES if t != "F32"])
def test_batch_decode_every_token_count(vectors, type_name):
    """Every n the batch decode kernel takes (tiles of 8 and 4 tokens, padded ones), on 34 rows
    (leftover rows past the last 4) and on 3 (leftover rows alone)."""
    raw, W = golden_weight(vectors, type_name)
    x = np.random.default_rng(5).standard_normal((mm.BATCH_DECODE_MAX_TOKENS, 4096))
    x = x.astype(np.float32)
    check_prefixes(type_name, raw, W, x, range(1, len(x) + 1))
    check_prefixes(type_name, np.ascontiguousarray(raw[:3]), W[:3], x, (2, 8, 13))


def test_all_paths_and_many_tiles(vectors, monkeypatch):
    raw, W = golden_weight(vectors, "Q4_K")
    big = np.ascontiguousarray(np.tile(raw, (7, 1)))  # 238 rows
    Wb = np.tile(W, (7, 1))
    for limit in (mm.DECODE_MAX_TOKENS, mm.BATCH_DECODE_MAX_TOKENS):
        for n in (limit, limit + 1):
            check_product("Q4_K", big, Wb, n)
    monkeypatch.setattr(mm, "TILE_BYTES", 5 * 4096 * 4)  # 5-row tiles: many tiles and a short one
    for n in (mm.BATCH_DECODE_MAX_TOKENS + 1, 33):
        check_product("Q4_K", big, Wb, n)


@pytest.mark.parametrize("k", [40, 48])
def test_float_rows_not_multiple_of_32(k):
    rng = np.random.default_rng(1)
    W = rng.standard_normal((5, k)).astype(np.float32)
    x = rng.standard_normal((3, k)).astype(np.float32)
    for type_name, raw, Wt in (
            ("F32", W.view(np.uint8), W),
            ("F16", W.astype(np.float16).view(np.uint8), W.astype(np.float16).astype(np.float32)),
            ("BF16", (W.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8),
             ((W.view(np.uint32) >> 16) << 16).view(np.float32))):
        for n in (1, 3):
            np.testing.assert_allclose(mm.matmul(type_name, raw, x[:n]), x[:n] @ Wt.T, rtol=1e-5, atol=1e-5)
        assert np.array_equal(mm.embedding_rows(type_name, raw, [4, 0]), Wt[[4, 0]])


def test_input_forms(vectors):
    raw, W = golden_weight(vectors, "Q8_0")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 4096))
    want = x @ W.T
    # float64, non-contiguous, read-only, 1-D inputs are accepted
    got = mm.matmul("Q8_0", raw, x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    xf = np.asfortranarray(x.astype(np.float32))
    np.testing.assert_allclose(mm.matmul("Q8_0", raw, xf), want, rtol=1e-4, atol=1e-3)
    xr = x.astype(np.float32)
    xr.flags.writeable = False
    np.testing.assert_allclose(mm.matmul("Q8_0", raw, xr), want, rtol=1e-4, atol=1e-3)
    one = mm.matmul("Q8_0", raw, x[1].astype(np.float32))
    assert one.shape == (34,)
    np.testing.assert_allclose(one, want[1], rtol=1e-4, atol=1e-3)
    assert mm.matmul("Q8_0", raw, np.zeros((0, 4096), np.float32)).shape == (0, 34)


def test_errors(vectors):
    raw, _ = golden_weight(vectors, "Q4_0")
    x = np.zeros((1, 4096), np.float32)
    with pytest.raises(NotImplementedError):
        mm.matmul("NVFP4", raw, x)
    with pytest.raises(ValueError):
        mm.matmul("Q4_0", raw, np.zeros((1, 4064), np.float32))  # wrong in_features
    with pytest.raises(ValueError):
        mm.matmul("Q4_0", np.ascontiguousarray(raw[:, :-1]), x)  # not whole blocks
    with pytest.raises(ValueError):
        mm.matmul("Q4_0", raw[:, ::2], np.zeros((1, 2048), np.float32))  # not contiguous
    with pytest.raises(TypeError):
        mm.matmul("Q4_0", raw.view(np.int8), x)


@pytest.mark.skipif(not HAS_AVX512_BF16, reason="this CPU has no AVX512-BF16")
@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K", "Q8_0", "F16"])
def test_bf16_prompt_path_within_bf16_rounding(type_name, vectors, monkeypatch):
    """A prompt's matmul in bfloat16: each product carries at most bf16's rounding of both
    operands (2 * 2^-9 relative), sums stay float32; a token's decode stays float32."""
    monkeypatch.setattr(mm, "USE_BF16", True)
    raw, w = golden_weight(vectors, type_name)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, w.shape[1])).astype(np.float32)
    got = mm.matmul(type_name, raw, x)
    bound = np.abs(x).astype(np.float64) @ np.abs(w).T
    err = np.abs(got - x.astype(np.float64) @ w.T)
    assert (err <= 2 * 2.0 ** -9 * bound + RTOL * bound).all()
    assert err.max() > RTOL * bound.max() / 100  # the bf16 path was taken
    one = mm.matmul(type_name, raw, x[:1])
    assert (np.abs(one - x[:1].astype(np.float64) @ w.T) <= RTOL * bound[:1]).all()
