"""The 8-bit decode kernels (llamatui.inference.cpu.matmul_int8): activations quantized as ggml's
quantize_row_q8_0 / q8_K quantize them, then multiplied into the weights' bytes by integer dot
products. Each product must equal the float64 product of the dequantized weights (gguf-py) and the
dequantized activations up to float32 rounding, and stay within the activations' 8-bit rounding of
the exact product; the generic LLVM lowering of vpdpbusd (CPUs without AVX512-VNNI) must give the
same results.
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import llamatui.inference.cpu.matmul as mm
from llamatui.inference.cpu import matmul_int8
from llamatui.inference.cpu import simd
from llamatui.inference.gguf import GGUFFile
from test_matmul import MODEL_TENSORS, RTOL, reference

INT8_TYPES = tuple(matmul_int8.KERNELS)
ROUNDING = 3e-3  # of sum |x * w|: what 8-bit activations may cost against the exact product


pytestmark = pytest.mark.skipif(not simd.HAS_INT8_DOT,
                                reason="no AVX512-VNNI / AVX-VNNI: decode uses the float32 kernels")


@pytest.fixture(autouse=True)
def int8_decode(monkeypatch):
    monkeypatch.setattr(mm, "USE_INT8", True)


@pytest.fixture(scope="module")
def vectors(quant_vectors):
    return quant_vectors


def block_values(type_name):
    return 256 if type_name.endswith("_K") else 32


def quantized_activations(x, qb):
    """numpy replica of ggml's 8-bit activations: d = amax / 127, q = round-half-even(x / d)"""
    xb = np.asarray(x, np.float32).reshape(-1, qb)
    d = np.abs(xb).max(axis=1) / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d > 0)
    q = np.rint(xb * inv[:, None]).astype(np.int32)
    return q, d


def rounded(x, qb):
    q, d = quantized_activations(x, qb)
    return (q * d[:, None].astype(np.float64)).reshape(np.shape(x))


def check_decode(type_name, raw, W, x):
    """matmul of one token (the decode path) against the rounded and the exact product"""
    got = mm.matmul(type_name, raw, x)
    scale = np.abs(x.astype(np.float64)) @ np.abs(W).T + 1e-30
    err = np.abs(got - rounded(x, block_values(type_name)) @ W.T) / scale
    assert err.max() <= RTOL, f"{type_name}: {err.max():.2e} off the product with 8-bit activations"
    err = np.abs(got - x.astype(np.float64) @ W.T) / scale
    assert err.max() <= ROUNDING, f"{type_name}: {err.max():.2e} off the exact product"
    return got


def test_activations_quantized_as_ggml():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 512)).astype(np.float32) * np.float32(3)
    x[0, :32] = 0  # an all-zero block: scale 0, values 0
    x[1, :256] = 0
    x[2, 0], x[2, 1] = 127 / 4, 2.5 / 4  # amax 31.75: x = 2.5 / 4 is q = 2.5, a tie (to even: 2)
    for qb in (32, 256):
        xq, xd, xsum, xs32 = matmul_int8.quantize_activations(x, qb)
        q, d = quantized_activations(x, qb)
        assert np.array_equal(xq.view(np.int8), q.reshape(-1).astype(np.int8))
        assert np.array_equal(xd, d)
        assert np.array_equal(xsum, q.reshape(-1, 16).sum(axis=1))
        sums32 = q.reshape(-1, 32).sum(axis=1).astype(np.float32)
        assert np.array_equal(xs32, np.repeat(d, qb // 32) * sums32)
    assert xq.view(np.int8)[2 * 512 + 1] == 2


@pytest.mark.parametrize("type_name", INT8_TYPES)
def test_decode_golden_vectors(vectors, type_name):
    rng = np.random.default_rng(1)
    for key in (type_name, type_name + "_imatrix"):
        raw = vectors[key]
        x = rng.standard_normal((1, 4096)).astype(np.float32)
        check_decode(type_name, raw, reference(type_name, raw), x)


@pytest.mark.parametrize("fixture,name,n_rows", MODEL_TENSORS)
def test_decode_model_tensors(request, fixture, name, n_rows):
    with GGUFFile.open(request.getfixturevalue(fixture)) as f:
        t = f.tensors[name]
        raw = t.rows if n_rows is None else t.rows[:n_rows]
        W = reference(t.type, raw)
        x = np.random.default_rng(2).standard_normal((1, W.shape[1])).astype(np.float32)
        check_decode(t.type, raw, W, x)


@pytest.mark.parametrize("type_name", ["Q4_1", "Q6_K", "Q8_0"])
def test_mixture_of_experts_decode(vectors, type_name):
    """matmul_id of one token over 3 of 4 experts (the fused decode kernel), with one input per
    expert as for the down projection"""
    raw = vectors[type_name]
    experts = np.ascontiguousarray(np.stack([raw[0:8], raw[8:16], raw[16:24], raw[24:32]]))
    ids = np.array([[2, 0, 3]])
    x = np.random.default_rng(3).standard_normal((1, 3, 4096)).astype(np.float32)
    got = mm.matmul_id(type_name, experts, x, ids)
    for j, e in enumerate(ids[0]):
        W = reference(type_name, experts[e])
        want = rounded(x[0, j], block_values(type_name)) @ W.T
        scale = np.abs(x[0, j].astype(np.float64)) @ np.abs(W).T + 1e-30
        assert (np.abs(got[0, j] - want) / scale).max() <= RTOL


def test_rows_not_a_multiple_of_64_take_the_float_kernel(vectors):
    raw = np.ascontiguousarray(vectors["Q8_0"][:5, :3 * 34])  # rows of 96 values
    W = reference("Q8_0", raw)
    x = np.random.default_rng(4).standard_normal((1, 96)).astype(np.float32)
    scale = np.abs(x.astype(np.float64)) @ np.abs(W).T + 1e-30
    assert (np.abs(mm.matmul("Q8_0", raw, x) - x @ W.T) / scale).max() <= RTOL


@pytest.mark.parametrize("vnni", ["avxvnni", None])
def test_other_lowerings_equal_this_one(vectors, tmp_path, vnni):
    """vpdpbusd as AVX-VNNI's two 256-bit halves, and as generic LLVM IR, give the very results
    of the kernels here (each in a process of its own with its own numba cache)."""
    x = np.random.default_rng(5).standard_normal((1, 4096)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    want = {t: mm.matmul(t, vectors[t], x) for t in INT8_TYPES}
    golden = tmp_path / "vectors.npz"
    np.savez(golden, **{t: vectors[t] for t in INT8_TYPES})
    script = textwrap.dedent(f"""
        import numpy as np
        import llamatui.inference.cpu.simd as simd
        simd.VNNI = {vnni!r}
        import llamatui.inference.cpu.matmul as mm
        mm.USE_INT8 = True
        x = np.load({str(tmp_path / "x.npy")!r})
        with np.load({str(golden)!r}) as z:
            np.savez({str(tmp_path / "got.npz")!r},
                     **{{t: mm.matmul(t, z[t], x) for t in z.files}})
    """)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"))
    if vnni == "avxvnni" and not simd.host_has("avxvnni"):
        pytest.skip("this CPU has no AVX-VNNI")
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=600)
    with np.load(tmp_path / "got.npz") as got:
        for t in INT8_TYPES:
            assert np.array_equal(got[t], want[t]), t
