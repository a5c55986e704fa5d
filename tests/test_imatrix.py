"""Importance matrices: what is collected, llama.cpp's file formats, the `imatrix` command."""
import struct

import numpy as np
import pytest

from llamatui.inference import LoadConfig
from llamatui.app.cli import main
from llamatui.inference.gguf import GGUFFile
from llamatui.inference.tokenizers.tokenizer import Tokenizer
from llamatui.quantizer.imatrix import Imatrix, ImatrixEntry, ImatrixError, collect_imatrix


@pytest.fixture(scope="module")
def smollm2_imatrix(smollm2_path, golden_dir):
    text = (golden_dir / "texts" / "apache-2.0.txt").read_text()
    return collect_imatrix(smollm2_path, text, n_ctx=128, n_chunks=1, threads=2,
                           dataset="apache-2.0.txt")


def test_collects_squared_activations_per_column(smollm2_imatrix, smollm2_path, golden_dir):
    imatrix, ppl = smollm2_imatrix
    assert imatrix.chunk_count == 1 and imatrix.chunk_size == 128 and ppl.n_chunks == 1
    assert imatrix.datasets == ["apache-2.0.txt"]
    with GGUFFile.open(smollm2_path) as g:
        weights = {n: t for n, t in g.tensors.items() if n.startswith("blk.") and len(t.shape) == 2}
        assert sorted(imatrix.entries) == sorted(weights)  # 7 matrices × 30 layers
        for name, e in imatrix.entries.items():
            assert e.sums.shape == (1, weights[name].shape[1]) and list(e.counts) == [128]
            assert np.all(e.sums > 0)

        # Layer 0's Q, K and V all see rms_norm(embedding) · attn_norm of the chunk's tokens
        # (the first replaced by BOS... SmolLM2 adds none, so the text's own first 128 tokens).
        tok = Tokenizer.from_metadata(g.metadata)
        text = (golden_dir / "texts" / "apache-2.0.txt").read_text()
        ids = tok.encode(text, add_special=True, parse_special=False)[:128]
        assert not tok.add_bos
        emb = g.tensors["token_embd.weight"].dequantize()[ids]
        eps = g.metadata["llama.attention.layer_norm_rms_epsilon"]
        h = emb / np.sqrt((emb * emb).mean(-1, keepdims=True) + eps)
        h = h * g.tensors["blk.0.attn_norm.weight"].dequantize()
        expected = (h.astype(np.float64) ** 2).sum(0)
    for name in ("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"):
        np.testing.assert_allclose(imatrix.entries[name].sums[0], expected, rtol=2e-4)
    importance = imatrix.importance()["blk.0.attn_q.weight"]
    np.testing.assert_allclose(importance, expected / 128, rtol=2e-4)


def test_gguf_round_trip_in_llama_cpp_layout(smollm2_imatrix, tmp_path):
    imatrix, _ = smollm2_imatrix
    path = tmp_path / "imatrix.gguf"
    imatrix.save(path)
    back = Imatrix.load(path)
    assert back.datasets == imatrix.datasets and back.chunk_count == 1 and back.chunk_size == 128
    assert sorted(back.entries) == sorted(imatrix.entries)
    for name, e in imatrix.entries.items():
        assert np.array_equal(back.entries[name].sums, e.sums.astype(np.float32))
        assert np.array_equal(back.entries[name].counts, e.counts)

    # what llama.cpp's loaders look for, read with gguf-py
    import gguf
    r = gguf.GGUFReader(str(path))
    assert r.fields["general.type"].contents() == "imatrix"
    assert r.fields["imatrix.datasets"].contents() == ["apache-2.0.txt"]
    assert r.fields["imatrix.chunk_count"].contents() == 1
    assert r.fields["imatrix.chunk_size"].contents() == 128
    tensors = {t.name: t for t in r.tensors}
    assert sorted(tensors) == sorted(f"{n}{s}" for n in imatrix.entries
                                     for s in (".in_sum2", ".counts"))
    t = tensors["blk.3.ffn_down.weight.in_sum2"]
    assert t.tensor_type == gguf.GGMLQuantizationType.F32 and list(t.shape) == [1536, 1]
    c = tensors["blk.3.ffn_down.weight.counts"]
    assert list(c.shape) == [1, 1] and c.data.reshape(-1).tolist() == [128.0]


def test_legacy_dat_format(tmp_path):
    # int32 n_entries; per entry: name, ncall, nval, nval floats (mean of squares × ncall);
    # then the chunk count and the dataset name
    values = np.array([2.0, 4.0, 6.0, 8.0], np.float32)
    raw = struct.pack("<i", 2)
    for name, ncall in (("blk.0.attn_q.weight", 4), ("blk.0.ffn_up.weight", 0)):
        raw += struct.pack("<i", len(name)) + name.encode() + struct.pack("<ii", ncall, 4)
        raw += values.tobytes()
    raw += struct.pack("<i", 4) + struct.pack("<i", 8) + b"wiki.txt"
    path = tmp_path / "imatrix.dat"
    path.write_bytes(raw)
    m = Imatrix.load(path)
    assert m.is_legacy and m.chunk_count == 4 and m.datasets == ["wiki.txt"]
    imp = m.importance()
    np.testing.assert_array_equal(imp["blk.0.attn_q.weight"], values / 4)
    np.testing.assert_array_equal(imp["blk.0.ffn_up.weight"], values)  # ncall 0: as stored

    path.write_bytes(raw[:30])
    with pytest.raises(ImatrixError, match="not an imatrix file.*truncated"):
        Imatrix.load(path)


def test_unseen_matrices_get_weight_one():
    e = ImatrixEntry(np.array([[2.0, 4.0], [5.0, 5.0]], np.float32), [2, 0])
    np.testing.assert_array_equal(e.importance(), [1.0, 2.0, 1.0, 1.0])


def test_cli_imatrix(smollm2_path, golden_dir, tmp_path, capsys):
    out = tmp_path / "smollm2.imatrix.gguf"
    text = golden_dir / "texts" / "apache-2.0.txt"
    assert main(["imatrix", "-m", str(smollm2_path), "-f", str(text), "-o", str(out),
                 "-c", "64", "--chunks", "2", "-t", "2"]) == 0
    printed = capsys.readouterr().out
    assert "Final estimate: PPL = " in printed and "after 2 chunks for 210 tensors" in printed
    m = Imatrix.load(out)
    assert m.chunk_count == 2 and m.chunk_size == 64 and m.datasets == [str(text)]
    assert all(list(e.counts) == [128] for e in m.entries.values())

    short = tmp_path / "short.txt"
    short.write_text("Too short.")
    assert main(["imatrix", "-m", str(smollm2_path), "-f", str(short), "-o", str(out)]) == 1
    assert "a context of 512 needs at least 512" in capsys.readouterr().err


def test_experts_get_one_row_per_expert(tmp_path, monkeypatch):
    """A mixture of experts (Qwen3-MoE, synthetic): each ffn_*_exps entry holds one row of sums
    and one count per expert, from exactly the (token, slot) rows routed to it (llama-imatrix's
    MUL_MAT_ID case), and llama-quantize's planner takes them for the expert tensors."""
    from synthetic_models import TOKENS, write_model

    from llamatui.inference.archs import moe
    from llamatui.inference.model import Batch, Model
    from llamatui.quantizer.imatrix import ImatrixCollector
    from llamatui.quantizer.model import quantize_model

    chosen = []
    route = moe.route

    def recording_route(logits, n_used, *gating):
        experts, weights = route(logits, n_used, *gating)
        chosen.append(np.array(experts))
        return experts, weights

    monkeypatch.setattr(moe, "route", recording_route)
    path = write_model("qwen3moe", "F16", tmp_path)
    collector = ImatrixCollector(n_threads=2)
    model = Model.load(GGUFFile.open(path), LoadConfig(n_ctx=128), backend=collector)
    model.decode(Batch(TOKENS, pos=0, logits=True))
    imatrix = collector.imatrix(["synthetic"], 1, len(TOKENS))
    hp = model.hparams
    for layer, experts in enumerate(chosen):
        routed = np.bincount(experts.reshape(-1), minlength=hp.n_expert)
        for kind, n_in in (("gate", hp.n_embd), ("up", hp.n_embd), ("down", None)):
            e = imatrix.entries[f"blk.{layer}.ffn_{kind}_exps.weight"]
            assert e.sums.shape[0] == hp.n_expert and (n_in is None or e.sums.shape[1] == n_in)
            assert np.array_equal(e.counts, routed)
            assert np.all((e.sums.sum(axis=1) > 0) == (routed > 0))
    # gate and up see the same inputs: the FFN norm's output of each routed token
    np.testing.assert_allclose(imatrix.entries["blk.0.ffn_gate_exps.weight"].sums,
                               imatrix.entries["blk.0.ffn_up_exps.weight"].sums)
    result = quantize_model(path, tmp_path / "q4_k_m.gguf", "Q4_K_M", imatrix=imatrix)
    assert "blk.0.ffn_down_exps.weight" in result.imatrix_used
    # every expert quantized with its own row of importance: expert 3 alone equals quantizing its
    # matrix with that row
    from llamatui.inference.quants import quantize
    with GGUFFile.open(path) as src, GGUFFile.open(tmp_path / "q4_k_m.gguf") as dst:
        name = "blk.0.ffn_down_exps.weight"
        t = dst.tensors[name]
        expert3 = src.tensors[name].dequantize().reshape(t.shape)[3]
        row = imatrix.entries[name].importance().reshape(hp.n_expert, -1)[3]
        want = quantize(t.type, np.ascontiguousarray(expert3, np.float32), row)
        assert np.array_equal(np.asarray(t.rows).reshape(hp.n_expert, *want.shape)[3], want)
