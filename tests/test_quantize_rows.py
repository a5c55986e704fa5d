"""Row quantizers against ggml's own bytes (shared/golden/quant_vectors.npz).

The golden file holds 34 rows of 4096 floats (24 rows of real Gemma 3 weights, 10 edge cases:
zeros, constants, one-signed, tiny, huge, heavy tails, outliers), an importance matrix, and the
bytes ggml_quantize_chunk wrote for each type without (`T`) and with (`T_imatrix`) that matrix.
"""
import numpy as np
import pytest

from llamatui.inference.catalog import GGML_TYPES
from llamatui.inference.quants import QUANTIZERS, base, quantize

TYPES = ["F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
         "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S",
         "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "IQ1_M", "BF16", "TQ1_0", "TQ2_0",
         "MXFP4"]  # ggml's order


@pytest.fixture(scope="module")
def vectors(quant_vectors):
    return quant_vectors


def describe_mismatch(type_name: str, got: np.ndarray, want: np.ndarray) -> str:
    """Which rows differ, and for the first few the differing blocks and bytes."""
    gtype = GGML_TYPES[type_name]
    bad_rows = np.nonzero((got != want).any(axis=1))[0]
    lines = [f"{type_name}: {len(bad_rows)} of {len(got)} rows differ: {bad_rows.tolist()}"]
    for r in bad_rows[:4]:
        offsets = np.nonzero(got[r] != want[r])[0]
        blocks = sorted(set((offsets // gtype.type_size).tolist()))
        lines.append(f"  row {r}: {len(offsets)} bytes in blocks {blocks[:10]}{'...' if len(blocks) > 10 else ''}")
        for off in offsets[:5]:
            lines.append(f"    byte {off} (block {off // gtype.type_size}, +{off % gtype.type_size}): "
                         f"got {got[r, off]:#04x}, ggml {want[r, off]:#04x}")
    return "\n".join(lines)


def test_every_type_is_registered():
    assert list(QUANTIZERS) == TYPES


@pytest.mark.parametrize("with_imatrix", [False, True], ids=["plain", "imatrix"])
@pytest.mark.parametrize("type_name", TYPES)
def test_matches_ggml_bytes(vectors, type_name, with_imatrix):
    x = vectors["x"]
    imatrix = vectors["imatrix"] if with_imatrix else None
    key = f"{type_name}_imatrix" if with_imatrix else type_name
    if key not in vectors and type_name not in vectors:  # ggml requires an imatrix for it
        with pytest.raises(ValueError, match=f"{type_name} needs an importance matrix"):
            quantize(type_name, x, imatrix)
        return
    want = vectors[key] if key in vectors else vectors[type_name]  # F16/BF16 ignore the imatrix
    got = quantize(type_name, x, imatrix)
    assert got.dtype == np.uint8
    assert got.shape == want.shape == (x.shape[0], GGML_TYPES[type_name].row_bytes(x.shape[1]))
    assert np.array_equal(got, want), describe_mismatch(type_name, got, want)


@pytest.mark.parametrize("type_name", ["Q4_K", "IQ4_XS"])
def test_many_small_batches_give_the_same_bytes(vectors, type_name, monkeypatch):
    # Rows are spread over threads in batches; how they are cut must not change a byte.
    monkeypatch.setattr(base, "MIN_VALUES_PER_BATCH", 4096)
    got = quantize(type_name, vectors["x"], vectors["imatrix"])
    assert np.array_equal(got, vectors[f"{type_name}_imatrix"])


def test_accepts_float64_and_non_contiguous_rows(vectors):
    x = vectors["x"][:6]
    strided = np.asfortranarray(x.astype(np.float64))
    assert np.array_equal(quantize("Q6_K", strided), vectors["Q6_K"][:6])
    assert quantize("Q4_0", np.zeros((0, 64), np.float32)).shape == (0, 36)


@pytest.mark.parametrize("type_name, n_cols, block", [("Q4_0", 48, 32), ("Q4_K", 4000, 256), ("IQ4_XS", 32, 256)])
def test_row_length_must_be_whole_blocks(type_name, n_cols, block):
    with pytest.raises(ValueError, match=rf"{type_name} quantizes blocks of {block} values: "
                                         rf"a row of {n_cols} is not a multiple of {block}"):
        quantize(type_name, np.ones((2, n_cols), np.float32))


@pytest.mark.parametrize("type_name", ["Q8_K", "F32", "q4_k", "nope"])
def test_unsupported_type(type_name):
    with pytest.raises(ValueError, match=rf"cannot quantize to '{type_name}': supported types are F16, Q4_0, "):
        quantize(type_name, np.ones((1, 256), np.float32))


def test_bad_shapes():
    with pytest.raises(ValueError, match=r"rows must be a 2-D array \(n_rows, n_cols\), got shape \(256,\)"):
        quantize("Q8_0", np.ones(256, np.float32))
    with pytest.raises(ValueError, match=r"imatrix must have shape \(256,\) to match the rows, got \(128,\)"):
        quantize("Q4_K", np.ones((1, 256), np.float32), np.ones(128, np.float32))
