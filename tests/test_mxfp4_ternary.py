"""What the shared tests leave out for MXFP4, TQ1_0 and TQ2_0: the experts' product (`matmul_id`,
gpt-oss's MXFP4 experts, on the fused decode kernel and on the gathered path), each code path of
simd's `vperm16`, the register table lookup of MXFP4's kernels (the other tests run the host's
own), and the MXFP4_MOE mix's choice of types (llama-quantize 11434 writes the same file for
tests/synthetic_models' qwen3moe, byte for byte)."""
import numpy as np
import pytest
from numba import njit

import llamatui.inference.cpu.matmul as mm
from llamatui.inference.cpu import simd
from llamatui.inference.quants import quantize
from llamatui.quantizer.model import ModelFacts, TensorSpec, parse_ftype, select_tensor_types

pytestmark = pytest.mark.usefixtures("float32_products")

RTOL = 1e-4  # of sum_k |x_k * w_k|: float32 accumulation error only


@pytest.mark.parametrize("type_name", ["MXFP4", "TQ1_0", "TQ2_0"])
@pytest.mark.parametrize("n_tokens", [1, 5])  # the fused kernel; then both paths
def test_matmul_id_equals_each_chosen_experts_product(type_name, n_tokens):
    n_expert, n_out, n_in = 5, 24, 512
    rng = np.random.default_rng(n_tokens)
    values = rng.standard_normal((n_expert * n_out, n_in)).astype(np.float32)
    raw = quantize(type_name, values).reshape(n_expert, n_out, -1)
    ids = np.argsort(rng.standard_normal((n_tokens, n_expert)), axis=1)[:, :2]
    ids[:, 0] = 0  # expert 0 for every token: the gathered path once there are several
    x = rng.standard_normal((n_tokens, 2, n_in)).astype(np.float32)
    got = mm.matmul_id(type_name, raw, x, ids)
    for t in range(n_tokens):
        for j, e in enumerate(ids[t]):
            W = mm.embedding_rows(type_name, raw[e], np.arange(n_out)).astype(np.float64)
            want = W @ x[t, j].astype(np.float64)
            scale = np.abs(W) @ np.abs(x[t, j].astype(np.float64)) + 1e-30
            assert (np.abs(got[t, j] - want) / scale).max() <= RTOL


def _lookup():
    @njit(cache=False)
    def lookup(table, idx, out):
        simd.vstore(out, 0, simd.vperm16(simd.vload(table, 0), simd.vloadi(idx, 0)))
    return lookup


@pytest.mark.parametrize("path", ["avx512f", "avx2", None])
def test_vperm16_every_path(path, monkeypatch):
    if path and not simd.host_has(path):
        pytest.skip(f"the host has no {path}")
    monkeypatch.setattr(simd, "_PERMUTE", path)  # read when a kernel is compiled
    table = np.arange(16, dtype=np.float32) * np.float32(-1.5) + np.float32(0.25)
    idx = np.random.default_rng(0).integers(0, 16, 16).astype(np.int32)
    idx[:2] = (15, 8)  # both halves of the AVX2 form
    out = np.empty(16, np.float32)
    lookup = _lookup()
    lookup(table, idx, out)
    assert np.array_equal(out, table[idx])
    lookup(table, idx + 16 * np.arange(16, dtype=np.int32), out)  # only the low 4 bits count
    assert np.array_equal(out, table[idx])


def _moe_specs(n_embd=256, n_ff=256, n_expert=16, untied=True):
    specs = [TensorSpec("token_embd.weight", "F16", (512, n_embd)),
             TensorSpec("output_norm.weight", "F32", (n_embd,))]
    if untied:
        specs.append(TensorSpec("output.weight", "F16", (512, n_embd)))
    for il in range(2):
        p = f"blk.{il}."
        specs += [TensorSpec(p + "attn_q.weight", "F16", (512, n_embd)),
                  TensorSpec(p + "attn_v.weight", "F16", (256, n_embd)),
                  TensorSpec(p + "ffn_gate_inp.weight", "F32", (n_expert, n_embd)),
                  TensorSpec(p + "ffn_up_exps.weight", "F16", (n_expert, n_ff, n_embd)),
                  TensorSpec(p + "ffn_down_exps.weight", "F16", (n_expert, n_embd, n_ff))]
    return specs


def test_mxfp4_moe_mix():
    assert parse_ftype("mxfp4_moe").name == parse_ftype("38").name == "MXFP4"
    facts = ModelFacts("qwen3moe", n_layer=2, n_head=4, n_head_kv=2, n_expert=16)
    for untied in (True, False):  # output (or the tied embeddings) Q8_0 as well
        t = select_tensor_types(_moe_specs(untied=untied), facts, "MXFP4_MOE")
        assert {k for k, v in t.items() if v == "MXFP4"} == {
            f"blk.{i}.ffn_{m}_exps.weight" for i in range(2) for m in ("up", "down")}
        assert {v for k, v in t.items() if "exps" not in k} == {"Q8_0", "F32"}
        assert t["blk.0.ffn_gate_inp.weight"] == "F32" and t["token_embd.weight"] == "Q8_0"
    # rows that are not whole 32-value blocks: F16, as llama.cpp's fallback for 32-value types
    odd = select_tensor_types(_moe_specs(n_ff=200), facts, "MXFP4_MOE")
    assert odd["blk.1.ffn_down_exps.weight"] == "F16" and odd["blk.1.ffn_up_exps.weight"] == "MXFP4"
    # bailingmoe3: only the ffn experts among its 3-D tensors
    bailing = ModelFacts("bailingmoe3", n_layer=2, n_head=4, n_head_kv=2, n_expert=16)
    mla = [TensorSpec("blk.0.attn_k_b.weight", "F16", (4, 128, 256))]
    t = select_tensor_types(_moe_specs() + mla, bailing, "MXFP4_MOE")
    assert t["blk.0.attn_k_b.weight"] == "Q8_0" and t["blk.0.ffn_up_exps.weight"] == "MXFP4"
