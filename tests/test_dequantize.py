"""Dequantization (llamatui.inference.quants) against gguf-py's reference, bit for bit.

Results are compared as uint32 bit patterns, so a NaN payload or the sign of a zero counts.
"""
import importlib
import inspect
import pkgutil

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from llamatui.inference.catalog import GGML_TYPES
from llamatui.inference.gguf import GGUFFile
from llamatui.inference import quants
from llamatui.inference.quants import (
    QUANT_TYPES, SUPPORTED_TYPES, QuantType, UnsupportedTypeError, dequantize, dequantize_rows,
    get_quant_type)

ALL_SUPPORTED = ("F32", "F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K",
                 "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL",
                 "IQ3_S", "IQ2_S", "IQ4_XS", "IQ1_M", "BF16", "TQ1_0", "TQ2_0", "MXFP4")  # ggml's order
# the low-bit types, whose rows llama.cpp 11434 wrote (golden/quant_vectors_low_bit.npz; those
# marked * only with an importance matrix, as ggml_quantize_requires_imatrix says)
LOW_BIT_TYPES = ("IQ2_XXS*", "IQ2_XS*", "IQ3_XXS", "IQ1_S*", "IQ3_S", "IQ2_S", "IQ1_M", "TQ1_0",
                 "TQ2_0", "MXFP4")
# golden/quant_vectors.npz: llama.cpp's bytes for each type, and for quantized types again with an
# importance matrix (key suffix _imatrix).
VECTOR_KEYS = ("F16", "BF16") + tuple(
    t + suffix for t in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                         "Q6_K", "IQ4_NL", "IQ4_XS") for suffix in ("", "_imatrix")) + tuple(
    t.rstrip("*") + suffix for t in LOW_BIT_TYPES
    for suffix in (("_imatrix",) if t.endswith("*") else ("", "_imatrix")))
GGUF_TYPES = tuple(t for t in ALL_SUPPORTED if t != "Q8_K")  # gguf-py has no Q8_K dequantizer


def assert_same_bits(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
    assert ours.dtype == np.float32 and ref.dtype == np.float32, what
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape} != {ref.shape}"
    a, b = ours.view(np.uint32), ref.view(np.uint32)
    if not np.array_equal(a, b):
        bad = np.flatnonzero(a.reshape(-1) != b.reshape(-1))
        i = bad[0]
        pytest.fail(f"{what}: {bad.size} of {a.size} values differ; first at flat index {i}: "
                    f"{a.reshape(-1)[i]:#010x} != {b.reshape(-1)[i]:#010x}")


def gguf_reference(type_name: str, rows: np.ndarray) -> np.ndarray:
    """gguf-py's dequantization of uint8 rows (..., row_bytes), as float32 (..., row_length)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return gguf_quants.dequantize(rows, GGMLQuantizationType[type_name])


def test_registry_covers_the_supported_types_with_ggml_geometry():
    assert SUPPORTED_TYPES == ALL_SUPPORTED
    for name in SUPPORTED_TYPES:
        qt = get_quant_type(name)
        assert qt.name == name
        assert (qt.block_size, qt.type_size) == (GGML_TYPES[name].block_size,
                                                 GGML_TYPES[name].type_size)


def test_every_type_class_of_the_package_registers_itself_in_ggml_order():
    """A type's file is all it takes: the package imports every module, and each class named
    after a ggml type lands in QUANT_TYPES."""
    classes = {}
    for info in pkgutil.iter_modules(quants.__path__):
        module = importlib.import_module(f"{quants.__name__}.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, QuantType) and cls is not QuantType \
                    and not cls.__name__.startswith("_"):
                classes[cls.__name__] = cls
    assert classes == QUANT_TYPES
    ids = [GGML_TYPES[name].id for name in QUANT_TYPES]
    assert ids == sorted(ids)


def test_a_kernel_step_is_whole_blocks():
    assert get_quant_type("Q4_0").span(64) == (64, 36)
    assert get_quant_type("Q4_K").span(32) == (256, 144)
    assert get_quant_type("F16").span(16) == (16, 32)
    with pytest.raises(ValueError, match="384 values are not whole blocks"):
        get_quant_type("Q4_K").span(384)


def test_quant_vectors_hold_the_expected_types(quant_vectors):
    assert set(quant_vectors) == set(VECTOR_KEYS) | {"x", "imatrix"}


@pytest.mark.parametrize("key", VECTOR_KEYS)
def test_llama_cpp_quantized_rows_match_gguf(quant_vectors, key):
    type_name = key.removesuffix("_imatrix")
    rows = quant_vectors[key]
    n_rows, row_length = quant_vectors["x"].shape
    ours = dequantize(type_name, rows, n_rows * row_length).reshape(n_rows, row_length)
    assert_same_bits(ours, gguf_reference(type_name, rows), key)
    # And the row-wise entry point agrees with the whole-buffer one.
    assert_same_bits(dequantize_rows(type_name, rows, row_length), ours, key + " by rows")


@pytest.mark.parametrize("type_name", GGUF_TYPES)
def test_random_bytes_match_gguf(type_name):
    """Arbitrary bytes reach every bit pattern of the layouts and every kind of fp16 scale:
    subnormal, infinite, NaN with payloads (signalling ones too)."""
    qt = get_quant_type(type_name)
    rng = np.random.default_rng(sum(map(ord, type_name)))
    blocks = rng.integers(0, 256, size=(4096 // qt.type_size + 600, qt.type_size), dtype=np.uint8)
    ours = qt.dequantize_blocks(blocks)
    assert ours.shape == (blocks.shape[0], qt.block_size)
    assert_same_bits(ours, gguf_reference(type_name, blocks).reshape(ours.shape), type_name)


def test_q8_k_is_its_float32_scale_times_int8_quants():
    # block_q8_K: float d; int8 qs[256]; int16 bsums[16] (sums for dot products, unused here).
    rng = np.random.default_rng(8)
    n = 64
    d = rng.standard_normal(n).astype(np.float32) * np.float32(1e-2)
    d[:6] = [0.0, -0.0, np.inf, -np.inf, 1e-40, np.nan]  # special scales, a subnormal among them
    d[6] = np.uint32(0x7FA00001).view(np.float32)  # a signalling NaN keeps its payload
    qs = rng.integers(-128, 128, size=(n, 256), dtype=np.int8)
    qs[0, :2] = [-128, 127]
    bsums = qs.reshape(n, 16, 16).sum(axis=-1, dtype=np.int16)
    blocks = np.concatenate([d.view(np.uint8).reshape(n, 4), qs.view(np.uint8),
                             bsums.view(np.uint8).reshape(n, 32)], axis=1)
    assert blocks.shape == (n, GGML_TYPES["Q8_K"].type_size)
    with np.errstate(invalid="ignore"):
        expected = d[:, None] * qs.astype(np.float32)
    assert_same_bits(dequantize("Q8_K", blocks, n * 256).reshape(n, 256), expected, "Q8_K")


def test_f16_widening_is_exact_for_every_half():
    halves = np.arange(1 << 16, dtype=np.uint16)
    ours = dequantize("F16", halves, halves.size)
    assert_same_bits(ours, halves.view(np.float16).astype(np.float32), "F16")
    assert_same_bits(dequantize("BF16", halves, halves.size),
                     (halves.astype(np.uint32) << 16).view(np.float32), "BF16")


@pytest.mark.parametrize("model", ["smollm2_path", "gemma3_path"])
def test_every_model_tensor_matches_gguf(model, request):
    path = request.getfixturevalue(model)
    # Big tensors are compared in slices of rows, which keeps gguf-py's temporaries small.
    chunk_rows = 1 << 14
    seen = set()
    with GGUFFile.open(path) as f:
        assert f.tensors
        for name, t in f.tensors.items():
            ours = t.dequantize()
            assert ours.shape == t.shape and ours.dtype == np.float32, name
            rows, flat = t.rows, ours.reshape(-1, t.shape[-1])
            for r in range(0, rows.shape[0], chunk_rows):
                ref = gguf_reference(t.type, rows[r:r + chunk_rows]).reshape(-1, t.shape[-1])
                assert_same_bits(flat[r:r + chunk_rows], ref, f"{path.name}: {name} rows {r}..")
            seen.add(t.type)
            if name == "token_embd.weight":  # what an embedding lookup does: a few rows by id
                ids = np.array([0, 1, rows.shape[0] // 2, rows.shape[0] - 1])
                assert_same_bits(dequantize_rows(t.type, rows[ids], t.shape[-1]), flat[ids],
                                 f"{name} rows by id")
    assert seen >= {"F32", "Q8_0"} and seen & {"Q4_1", "Q4_K"}


def test_out_buffer_is_filled_and_returned():
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, size=(8, 144), dtype=np.uint8)
    expected = dequantize("Q4_K", raw, 8 * 256)
    out = np.full(8 * 256, np.nan, dtype=np.float32)
    assert dequantize("Q4_K", raw, 8 * 256, out=out) is out
    assert_same_bits(out, expected, "Q4_K into out")
    rows_out = np.empty((2, 4 * 256), dtype=np.float32)
    assert dequantize_rows("Q4_K", raw.reshape(2, -1), 4 * 256, out=rows_out) is rows_out
    assert_same_bits(rows_out.reshape(-1), expected, "Q4_K rows into out")
    f32 = rng.standard_normal(32).astype(np.float32)
    f32_out = np.empty(32, dtype=np.float32)
    assert_same_bits(dequantize("F32", f32.view(np.uint8), 32, out=f32_out), f32, "F32 into out")
    with pytest.raises(ValueError, match="out"):
        dequantize("Q4_K", raw, 8 * 256, out=np.empty(8 * 256 - 1, dtype=np.float32))
    with pytest.raises(ValueError, match="out"):
        dequantize("Q4_K", raw, 8 * 256, out=np.empty(8 * 256, dtype=np.float64))


@pytest.mark.parametrize("type_name", sorted(set(GGML_TYPES) - set(ALL_SUPPORTED)))
def test_unsupported_types_raise_naming_the_type(type_name):
    t = GGML_TYPES[type_name]
    with pytest.raises(UnsupportedTypeError, match=type_name) as e:
        dequantize(type_name, np.zeros(t.type_size, dtype=np.uint8), t.block_size)
    assert isinstance(e.value, ValueError) and "Q4_K" in str(e.value)  # lists what is supported
    with pytest.raises(UnsupportedTypeError, match=type_name):
        get_quant_type(type_name)


def test_unknown_type_names_raise():
    with pytest.raises(UnsupportedTypeError, match="Q4_Z.*not a known ggml type"):
        dequantize("Q4_Z", np.zeros(18, dtype=np.uint8), 32)
    with pytest.raises(UnsupportedTypeError):
        get_quant_type("q4_0")  # names are llama.cpp's, case included


def test_bad_buffer_sizes_raise_value_error():
    raw = np.zeros(2 * 18, dtype=np.uint8)  # two Q4_0 blocks
    with pytest.raises(ValueError, match="not a whole number of 32-element blocks"):
        dequantize("Q4_0", raw, 63)
    with pytest.raises(ValueError, match="take 18 bytes.*has 36"):
        dequantize("Q4_0", raw, 32)
    with pytest.raises(ValueError, match="take 54 bytes.*has 36"):
        dequantize("Q4_0", raw, 96)
    with pytest.raises(ValueError, match="takes 18 bytes"):
        dequantize_rows("Q4_0", raw.reshape(1, 36), 32)
    with pytest.raises(ValueError, match=r"shape \(n_blocks, 18\)"):
        get_quant_type("Q4_0").dequantize_blocks(raw.reshape(3, 12))
    assert dequantize("Q4_0", raw, 64).shape == (64,)
