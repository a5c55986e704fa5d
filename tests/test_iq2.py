"""What the shared tests leave out for IQ2_XXS, IQ2_XS and IQ2_S: the CPU backend's exact rows on
arbitrary bytes (NaN scales included, whose sign a sign flip instead of ggml's multiplication
by -1 would change), and the quantizers' grid tables built by several threads at once.
"""
import numpy as np
import pytest

import llamatui.inference.cpu.matmul as mm
from llamatui.inference.quants import base, get_quant_type, iq2_quantize, quantize

IQ2_TYPES = ("IQ2_XXS", "IQ2_XS", "IQ2_S")


@pytest.mark.parametrize("type_name", IQ2_TYPES)
def test_embedding_rows_are_the_dequantized_bits_on_random_bytes(type_name):
    qt = get_quant_type(type_name)
    rng = np.random.default_rng(len(type_name))
    raw = rng.integers(0, 256, (48, 4 * qt.type_size), dtype=np.uint8)
    want = qt.dequantize_blocks(raw.reshape(-1, qt.type_size)).reshape(48, -1)
    assert np.isnan(want).any()  # the random fp16 scales include NaNs
    got = mm.embedding_rows(type_name, raw, np.arange(48)[::-1])
    assert np.array_equal(got.view(np.uint32), want[::-1].view(np.uint32))


def test_grid_tables_built_by_concurrent_batches(quant_vectors, monkeypatch):
    monkeypatch.setattr(iq2_quantize, "_tables", {})  # built again, from the batches' threads
    monkeypatch.setattr(base, "MIN_VALUES_PER_BATCH", 4096)
    got = quantize("IQ2_XS", quant_vectors["x"], quant_vectors["imatrix"])
    assert np.array_equal(got, quant_vectors["IQ2_XS_imatrix"])
