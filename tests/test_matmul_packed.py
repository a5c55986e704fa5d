"""The row-interleaved 8-bit kernels (llamatui.inference.cpu.matmul_packed): 16 rows packed into the
lanes of a vector at load, multiplied into activations quantized as ggml quantizes them. A
product must equal the float64 product of the dequantized weights (gguf-py) and the dequantized
activations up to float32 rounding, stay within the activations' 8-bit rounding of the exact
product, and give each token the very same result alone or in any batch (the scheduler relies
on it: a request's text must not depend on the requests that share its steps).
"""
import numpy as np
import pytest

import llamatui.inference.cpu.matmul as mm
from llamatui.inference.cpu import matmul_packed
from llamatui.inference.backend import QWeight
from llamatui.inference.cpu.backend import CPUBackend
from llamatui.inference.gguf import GGUFFile, release_pages
from llamatui.inference.quants import get_quant_type
from test_matmul import RTOL, reference
from test_matmul_int8 import (ROUNDING, block_values, int8_decode, pytestmark,  # noqa: F401 (fixture, marks)
                              rounded)
from test_matmul_int8 import vectors as int8_vectors

PACKED_TYPES = tuple(matmul_packed.KERNELS)


@pytest.fixture(scope="module")
def vectors(int8_vectors):
    """llama.cpp's quantized rows, the first 32 (two groups of 16)"""
    return {key: np.ascontiguousarray(rows[:32]) for key, rows in int8_vectors.items()}


def check(type_name, raw, W, x):
    packed = mm.packed_weight(type_name, raw)
    assert packed is not None
    got = mm.matmul(type_name, raw, x, packed=packed)
    scale = np.abs(x.astype(np.float64)) @ np.abs(W).T + 1e-30
    err = np.abs(got - rounded(x, block_values(type_name)) @ W.T) / scale
    assert err.max() <= RTOL, f"{type_name}: {err.max():.2e} off the product with 8-bit activations"
    err = np.abs(got - x.astype(np.float64) @ W.T) / scale
    assert err.max() <= ROUNDING, f"{type_name}: {err.max():.2e} off the exact product"
    return got


@pytest.mark.parametrize("type_name", PACKED_TYPES)
@pytest.mark.parametrize("n_tokens", [1, 3, 8, 13])
def test_golden_vectors(vectors, type_name, n_tokens):
    rng = np.random.default_rng(n_tokens)
    for key in (type_name, type_name + "_imatrix"):
        raw = vectors[key]
        x = rng.standard_normal((n_tokens, vectors["x"].shape[1]))
        check(type_name, raw, reference(type_name, raw), x.astype(np.float32))


@pytest.mark.parametrize("fixture,name", [("smollm2_path", "blk.0.ffn_gate.weight"),
                                          ("smollm2_path", "blk.3.ffn_down.weight"),
                                          ("gemma3_path", "blk.0.attn_v.weight"),
                                          ("gemma3_path", "blk.0.attn_q.weight"),  # Q5_0
                                          ("gemma3_path", "blk.5.attn_output.weight"),  # Q4_K
                                          ("gemma3_path", "blk.0.ffn_down.weight")])  # Q6_K
def test_model_tensors(request, fixture, name):
    with GGUFFile.open(request.getfixturevalue(fixture)) as f:
        t = f.tensors[name]
        W = reference(t.type, t.rows)
        x = np.random.default_rng(2).standard_normal((9, W.shape[1])).astype(np.float32)
        check(t.type, t.rows, W, x)


@pytest.mark.parametrize("type_name", PACKED_TYPES)
def test_a_token_gets_the_same_result_in_any_batch(vectors, type_name):
    """bit for bit: alone, first or last of a tile of 8, in the tail after the tiles"""
    raw = vectors[type_name]
    packed = mm.packed_weight(type_name, raw)
    k = packed.n_in
    rng = np.random.default_rng(7)
    x = rng.standard_normal((20, k)).astype(np.float32)
    alone = np.stack([mm.matmul(type_name, raw, x[i:i + 1], packed=packed)[0] for i in range(20)])
    for lo, hi in ((0, 20), (3, 20), (5, 9), (0, 8), (7, 16)):
        batch = mm.matmul(type_name, raw, x[lo:hi], packed=packed)
        assert np.array_equal(batch, alone[lo:hi]), (lo, hi)
    assert np.array_equal(mm.matmul(type_name, raw, x[4], packed=packed), alone[4])  # 1-D x


def test_what_packs(vectors):
    raw = vectors["Q4_1"]
    assert mm.packed_weight("Q4_1", raw) is not None
    assert mm.packed_weight("Q4_1", np.ascontiguousarray(raw[:24])) is None  # rows % 16
    assert mm.packed_weight("Q5_K", vectors["Q5_K"]) is None  # no packed kernel
    with pytest.raises(ValueError, match="cannot be packed"):
        matmul_packed.pack("Q4_1", np.ascontiguousarray(raw[:24]))


def test_no_packed_kernels_without_int8(vectors, monkeypatch):
    """LLAMATUI_INT8=0 (USE_INT8 False): nothing packed, and a packed weight made before is not
    used (the float32 kernels answer)"""
    raw = vectors["Q8_0"]
    packed = mm.packed_weight("Q8_0", raw)
    monkeypatch.setattr(mm, "USE_INT8", False)
    assert mm.packed_weight("Q8_0", raw) is None
    x = np.random.default_rng(8).standard_normal((2, packed.n_in)).astype(np.float32)
    assert np.array_equal(mm.matmul("Q8_0", raw, x, packed=packed), mm.matmul("Q8_0", raw, x))


def test_the_backend_packs_a_matrix_at_its_first_product(smollm2_path):
    with GGUFFile.open(smollm2_path) as f:
        be = CPUBackend()
        w = be.weight(f.tensors["blk.1.attn_q.weight"])
        embd = be.weight(f.tensors["token_embd.weight"])
        be.get_rows(embd, np.array([5, 9]))
        assert isinstance(w, QWeight) and w.packed is None and embd.packed is None  # lookups only
        x = np.random.default_rng(9).standard_normal((2, w.n_in)).astype(np.float32)
        got = be.matmul(w, x)
        assert w.packed and w.packed.type_name == "Q4_1"
        assert np.array_equal(got, matmul_packed.matmul(w.packed, x, True)[0])


def test_a_packed_matrix_leaves_its_file_pages(smollm2_path):
    """The file's pages of a packed matrix are released (madvise) and read back intact; an
    array read into memory (no mmap) is never touched (MADV_DONTNEED would zero it)."""
    with GGUFFile.open(smollm2_path) as f:
        rows = f.tensors["blk.2.ffn_up.weight"].rows
        before = rows.copy()
        assert release_pages(rows) > 0.9 * rows.nbytes
        assert np.array_equal(rows, before)
    with GGUFFile.open(smollm2_path, use_mmap=False) as f:
        rows = f.tensors["blk.2.ffn_up.weight"].rows
        before = rows.copy()
        assert release_pages(rows) == 0
        assert np.array_equal(rows, before)


def test_packing_in_chunks_releases_each_chunk(vectors, monkeypatch):
    """A matrix packed a few rows at a time gives the same packed bytes, and hands every chunk
    of its rows to `release` once packed (the backend drops their file pages)"""
    raw = np.ascontiguousarray(np.concatenate([vectors["Q4_1"]] * 3))  # 96 rows
    whole = matmul_packed.pack("Q4_1", raw)
    monkeypatch.setattr(matmul_packed, "PACK_CHUNK", 32 * raw.shape[1])  # 32 rows a chunk
    released = []
    chunked = matmul_packed.pack("Q4_1", raw, release=released.append)
    assert np.array_equal(chunked.data, whole.data)
    assert [len(r) for r in released] == [32, 32, 32]
    assert np.array_equal(np.concatenate(released), raw)


def test_matrices_of_one_input_are_multiplied_as_one_with_the_same_results(smollm2_path):
    """matmul_many (Q, K, V; gate and up): one product over their packed copies fused, each
    matrix's result bit for bit its own product's, and each packed copy a view of the fused one
    (no second copy of the weights)"""
    with GGUFFile.open(smollm2_path) as f:
        be = CPUBackend()
        names = ("attn_q", "attn_k", "attn_v")
        ws = [be.weight(f.tensors[f"blk.4.{name}.weight"]) for name in names]
        alone = [be.weight(f.tensors[f"blk.4.{name}.weight"]) for name in names]
        x = np.random.default_rng(10).standard_normal((8, ws[0].n_in)).astype(np.float32)
        for n in (0, 1, 8):
            got = be.matmul_many(ws, x[:n])
            assert [g.shape for g in got] == [(n, w.n_out) for w in ws]
            for g, w in zip(got, alone):
                assert g.flags.c_contiguous and np.array_equal(g, be.matmul(w, x[:n]))
        matrices, whole = ws[0].fused
        assert matrices == tuple(ws) and whole.n_out == sum(w.n_out for w in ws)
        assert all(w.packed.data.base is whole.data for w in ws)
        for w, a in zip(ws, alone):  # the parts still serve single products
            assert np.array_equal(be.matmul(w, x), be.matmul(a, x))


def test_matrices_that_cannot_be_fused_are_multiplied_one_by_one(smollm2_path):
    """different input sizes (gate and down) or a matrix without a packed copy: separate
    products, the same as matmul's"""
    with GGUFFile.open(smollm2_path) as f:
        be = CPUBackend()
        gate, down = (be.weight(f.tensors[f"blk.0.ffn_{n}.weight"]) for n in ("gate", "down"))
        x = np.random.default_rng(11).standard_normal((3, gate.n_in)).astype(np.float32)
        with pytest.raises(ValueError, match="input of shape"):
            be.matmul_many((gate, down), x)  # down reads n_ff values
        assert gate.fused is False
        q, k = (be.weight(f.tensors[f"blk.0.attn_{n}.weight"]) for n in ("q", "k"))
        q.packed = False  # as a format without packed kernels
        got = be.matmul_many((q, k), x)
        assert q.fused is False and k.packed.data.base is None
        assert np.array_equal(got[1], be.matmul(k, x))
    with pytest.raises(ValueError, match="different formats"):
        matmul_packed.fuse([matmul_packed.pack("Q4_1", np.zeros((16, 20), np.uint8)),
                            matmul_packed.pack("Q8_0", np.zeros((16, 34), np.uint8))])


@pytest.mark.parametrize("type_name", ["Q4_K", "Q8_0"])
def test_matrices_packed_together_are_their_fused_copies(type_name):
    """pack_fused (what matmul_many packs at first use) writes each matrix straight into its
    part of the whole: the same bytes as packing each and fusing the copies"""
    rng = np.random.default_rng(12)
    type_size = get_quant_type(type_name).type_size

    def rows(n_out, n_blocks):  # any bytes: packing moves them, whatever they mean
        return rng.integers(0, 256, (n_out, n_blocks * type_size), dtype=np.uint8)

    raws = [rows(n_out, 3) for n_out in (32, 16, 48)]
    whole, parts = matmul_packed.pack_fused(type_name, raws)
    expect, _ = matmul_packed.fuse([matmul_packed.pack(type_name, r) for r in raws])
    assert np.array_equal(whole.data, expect.data) and np.array_equal(whole.parts, expect.parts)
    assert all(p.data.base is whole.data for p in parts) and not whole.data.flags.writeable
    with pytest.raises(ValueError, match="different input sizes"):
        matmul_packed.pack_fused(type_name, [raws[0], rows(16, 2)])
