"""Whole-model quantization: llama-quantize's type per tensor, the `quantize` command, failures."""
import errno
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from llamatui.inference import LoadConfig
from llamatui.app.cli import main
from llamatui.inference.engine import Engine
from llamatui.inference.gguf import GGUFFile, GGUFValueType, GGUFWriter
from llamatui.models.store import disk_usage, list_incomplete, remove_leftovers
from llamatui.quantizer import model as qmodel
from llamatui.quantizer.imatrix import Imatrix, ImatrixEntry
from llamatui.quantizer.model import (ModelFacts, QuantizeError, TensorSpec,
                                      evaluate_against, parse_ftype, quantize_model,
                                      select_tensor_types)

STARTERS = {"SmolLM2-135M-Instruct.Q4_1": "smollm2_path", "gemma-3-270m-q4_k_m": "gemma3_path"}


def _f16_copy_specs(gguf):
    """The tensor list of an F16 copy of the model, as llama-quantize saw it: 2-D weights F16,
    norms (1-D) F32."""
    return [TensorSpec(t.name, "F16" if len(t.shape) >= 2 else "F32", t.shape)
            for t in gguf.tensors.values()]


@pytest.mark.parametrize("model", list(STARTERS))
def test_type_choice_matches_llama_quantize(model, golden_dir, request):
    golden = json.loads((golden_dir / "llama_quantize_tensor_types.json").read_text())
    path = request.getfixturevalue(STARTERS[model])
    with GGUFFile.open(path) as g:
        specs, facts = _f16_copy_specs(g), ModelFacts.from_metadata(g.metadata)
    prefix = f"{model}.F16."
    cases = {k[len(prefix):-len(".gguf")]: v for k, v in golden.items() if k.startswith(prefix)}
    assert sorted(cases) == sorted(["Q2_K", "Q3_K_M", "Q4_0", "Q4_K_S", "Q4_K_M", "Q5_1",
                                    "Q5_K_M", "Q6_K", "Q8_0"])
    for ftype, expected in cases.items():
        chosen = select_tensor_types(specs, facts, ftype)
        # every tensor, in llama.cpp's order (which is also the order the file is written in)
        assert list(chosen.items()) == list(expected.items()), ftype


def _synthetic_specs(n_layer=8, n_embd=512, n_ff=1024, untied=True):
    specs = [TensorSpec("token_embd.weight", "F16", (1000, n_embd)),
             TensorSpec("output_norm.weight", "F32", (n_embd,))]
    if untied:
        specs.append(TensorSpec("output.weight", "F16", (1000, n_embd)))
    for il in range(n_layer):
        p = f"blk.{il}."
        specs += [TensorSpec(p + "attn_norm.weight", "F32", (n_embd,)),
                  TensorSpec(p + "attn_q.weight", "F16", (n_embd, n_embd)),
                  TensorSpec(p + "attn_k.weight", "F16", (n_embd // 4, n_embd)),
                  TensorSpec(p + "attn_v.weight", "F16", (n_embd // 4, n_embd)),
                  TensorSpec(p + "attn_output.weight", "F16", (n_embd, n_embd)),
                  TensorSpec(p + "ffn_norm.weight", "F32", (n_embd,)),
                  TensorSpec(p + "ffn_gate.weight", "F16", (n_ff, n_embd)),
                  TensorSpec(p + "ffn_up.weight", "F16", (n_ff, n_embd)),
                  TensorSpec(p + "ffn_down.weight", "F16", (n_embd, n_ff))]
    return specs


def test_mix_rules_beyond_the_golden_set():
    facts = ModelFacts("llama", n_layer=8, n_head=8, n_head_kv=2)
    specs = _synthetic_specs()
    t = select_tensor_types(specs, facts, "Q4_K_M")
    assert t["output.weight"] == "Q6_K" and t["token_embd.weight"] == "Q4_K"  # untied
    # use_more_bits(i, 8): layers 0, 7 and (i - 1) % 3 == 2, i.e. 3 and 6
    assert [t[f"blk.{i}.attn_v.weight"] for i in range(8)] == \
        ["Q6_K", "Q4_K", "Q4_K", "Q6_K", "Q4_K", "Q4_K", "Q6_K", "Q6_K"]
    assert t["blk.0.attn_norm.weight"] == "F32" and t["blk.5.attn_q.weight"] == "Q4_K"

    pure = select_tensor_types(specs, facts, "Q4_K_M", pure=True)
    assert {v for k, v in pure.items() if not k.endswith("norm.weight")} == {"Q4_K"}
    over = select_tensor_types(specs, facts, "Q4_K_M", output_tensor_type="q8_0",
                               token_embedding_type="Q5_K")
    assert over["output.weight"] == "Q8_0" and over["token_embd.weight"] == "Q5_K"
    left = select_tensor_types(specs, facts, "Q4_K_M", leave_output_tensor=True)
    assert left["output.weight"] == "F16"

    q3l = select_tensor_types(specs, facts, "Q3_K_L")
    assert q3l["blk.4.attn_v.weight"] == q3l["blk.4.ffn_down.weight"] == \
        q3l["blk.4.attn_output.weight"] == "Q5_K" and q3l["blk.4.attn_q.weight"] == "Q3_K"
    # Q4_0 with an importance matrix guards the first n/8 ffn_down layers with Q4_1
    q40 = select_tensor_types(specs, facts, "Q4_0", has_imatrix=True)
    assert q40["blk.0.ffn_down.weight"] == "Q4_1" and q40["blk.1.ffn_down.weight"] == "Q4_0"
    assert select_tensor_types(specs, facts, "Q4_0")["blk.0.ffn_down.weight"] == "Q4_0"
    # IQ4_XS on rows of 576 falls back to IQ4_NL; F16 leaves every weight F16
    narrow = _synthetic_specs(n_embd=576, n_ff=1536, untied=False)
    iq = select_tensor_types(narrow, facts, "IQ4_XS")
    assert iq["blk.3.attn_q.weight"] == "IQ4_NL" and iq["blk.3.ffn_down.weight"] == "IQ4_XS"
    assert iq["token_embd.weight"] == "Q8_0"
    f16 = select_tensor_types(narrow, facts, "F16")
    assert {v for k, v in f16.items() if not k.endswith("norm.weight")} == {"F16"}


def test_ftype_names():
    assert parse_ftype("q4_k").name == "Q4_K_M" and parse_ftype("15").name == "Q4_K_M"
    with pytest.raises(QuantizeError, match="unknown quantization type 'Q4_X'.*Q4_K_M"):
        parse_ftype("Q4_X")


# ----------------------------------------------------------------------------- real models


@pytest.fixture(scope="session")
def smollm2_f16(smollm2_path, tmp_path_factory):
    """An F16 copy of SmolLM2 (what llama-quantize --allow-requantize ... F16 makes)."""
    out = tmp_path_factory.mktemp("f16") / "SmolLM2-135M-Instruct.F16.gguf"
    quantize_model(smollm2_path, out, "F16", allow_requantize=True)
    return out


def test_f16_copy(smollm2_path, smollm2_f16):
    with GGUFFile.open(smollm2_path) as src, GGUFFile.open(smollm2_f16) as f16:
        assert list(f16.tensors) == sorted(src.tensors, key=qmodel.llama_order)
        for name, t in f16.tensors.items():
            assert t.type == ("F16" if len(t.shape) == 2 else "F32"), name
        for name in ("blk.7.ffn_down.weight", "token_embd.weight", "blk.0.attn_norm.weight"):
            expected = src.tensors[name].dequantize()
            if len(expected.shape) == 2:
                expected = expected.astype(np.float16).astype(np.float32)
            assert np.array_equal(f16.tensors[name].dequantize(), expected)
        assert f16.metadata["general.file_type"] == 1


def _metadata_without(md, keys):
    return {k: (md.types[k], md[k].tolist() if isinstance(md[k], np.ndarray) else md[k])
            for k in md if k not in keys}


def test_cli_quantize_q4_k_m(smollm2_f16, golden_dir, tmp_path, capsys):
    out = tmp_path / "q4_k_m.gguf"
    assert main(["quantize", str(smollm2_f16), str(out), "Q4_K_M", "2"]) == 0
    printed = capsys.readouterr().out
    assert "quant size" in printed and "BPW" in printed
    assert [p.name for p in tmp_path.iterdir()] == ["q4_k_m.gguf"]  # no temporary left over
    umask = os.umask(0o022)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask  # not the temporary file's 0600
    golden = json.loads((golden_dir / "llama_quantize_tensor_types.json").read_text())
    expected = golden["SmolLM2-135M-Instruct.Q4_1.F16.Q4_K_M.gguf"]
    with GGUFFile.open(smollm2_f16) as src, GGUFFile.open(out) as q:
        assert {n: t.type for n, t in q.tensors.items()} == expected
        assert list(q.tensors) == list(expected)
        md = q.metadata
        assert md["general.file_type"] == 15 and md["general.quantization_version"] == 2
        assert md.types["general.file_type"].type == GGUFValueType.UINT32
        assert list(md)[-2:] == ["general.quantization_version", "general.file_type"]
        keep = ("general.file_type", "general.quantization_version")
        assert _metadata_without(md, keep) == _metadata_without(src.metadata, keep)
        for name in ("blk.0.attn_norm.weight", "output_norm.weight"):  # copied as they are
            assert np.array_equal(q.tensors[name].data, src.tensors[name].data)

    with Engine.load(out, LoadConfig(n_ctx=256, threads=2)) as engine:
        text = "".join(e.text for e in engine.generate("The capital of France is",
                                                       temperature=0, max_tokens=6))
    assert "Paris" in text

    # Against the F16 source on three 128-token chunks of the Apache license. SmolLM2-135M is
    # small enough to feel a Q4_K_M requantization: about +12% on six chunks, +16% on the whole
    # text (17 chunks); Q8_0 (below) stays within 1%.
    apache = (golden_dir / "texts" / "apache-2.0.txt").read_text()
    ev = evaluate_against(smollm2_f16, out, apache, n_ctx=128, n_chunks=3, threads=2)
    assert ev.n_scored == 3 * 63
    assert 1.0 < ev.ppl / ev.ppl_base < 1.25 and 0.01 < ev.kld_mean < 0.2
    assert ev.top1_agreement > 0.75


def test_q8_0_stays_close_to_the_source(smollm2_f16, golden_dir, tmp_path, float32_products):
    # float32 products: the weights' quantization error alone, not 8-bit activations' as well
    out = tmp_path / "q8_0.gguf"
    r = quantize_model(smollm2_f16, out, "Q8_0")
    assert r.type_counts() == {"Q8_0": 211, "F32": 61}
    assert abs(r.bits_per_weight - 8.5) < 0.01 and r.file_size == os.path.getsize(out)
    apache = (golden_dir / "texts" / "apache-2.0.txt").read_text()
    ev = evaluate_against(smollm2_f16, out, apache, n_ctx=128, n_chunks=2, threads=2)
    assert abs(ev.ppl / ev.ppl_base - 1) < 0.02 and ev.kld_mean < 0.005


def test_quantized_input_is_refused(smollm2_path, tmp_path, capsys):
    out = tmp_path / "out.gguf"
    with pytest.raises(QuantizeError, match="already quantized \\(Q4_1\\).*--allow-requantize"):
        quantize_model(smollm2_path, out, "Q4_K_M")
    assert main(["quantize", str(smollm2_path), str(out), "Q4_K_M"]) == 1
    err = capsys.readouterr().err
    assert "already quantized" in err and "--allow-requantize" in err
    assert list(tmp_path.iterdir()) == []


def test_failures_leave_no_output(smollm2_f16, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out.gguf"
    assert main(["quantize", str(smollm2_f16), str(out), "Q4_X"]) == 1
    assert "unknown quantization type 'Q4_X'" in capsys.readouterr().err
    # a type that cannot hold SmolLM2's rows of 576 values, found before anything is written
    assert main(["quantize", "--token-embedding-type", "Q4_K", str(smollm2_f16), str(out),
                 "Q4_0"]) == 1
    assert "rows of 576 values cannot be stored as Q4_K" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []

    calls = []

    def failing(type_name, rows, imatrix=None):
        calls.append(type_name)
        if len(calls) == 3:
            raise RuntimeError("simulated failure")
        return real(type_name, rows, imatrix)

    real = qmodel.quantize
    monkeypatch.setattr(qmodel, "quantize", failing)
    with pytest.raises(RuntimeError, match="simulated"):
        quantize_model(smollm2_f16, out, "Q4_0")
    assert list(tmp_path.iterdir()) == []

    out.write_bytes(b"an older file")  # an existing output survives a failed run untouched
    calls.clear()
    monkeypatch.setattr(qmodel, "quantize", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    assert main(["quantize", str(smollm2_f16), str(out), "Q4_0"]) == 130
    assert [p.name for p in tmp_path.iterdir()] == ["out.gguf"]
    assert out.read_bytes() == b"an older file"


# ----------------------------------------------------------------------------- imatrix use


def _tiny_model(path, n_layer=8, n_embd=256, n_ff=512):
    """A small llama-shaped F16 model with random weights (quantizing needs no forward pass)."""
    rng = np.random.default_rng(7)
    w = GGUFWriter(path)
    w.add("general.architecture", "llama")
    w.add("llama.block_count", n_layer, GGUFValueType.UINT32)
    w.add("llama.attention.head_count", 4, GGUFValueType.UINT32)
    w.add("llama.attention.head_count_kv", 4, GGUFValueType.UINT32)
    w.add("general.file_type", 1, GGUFValueType.UINT32)
    for s in _synthetic_specs(n_layer, n_embd, n_ff, untied=False):
        if s.type == "F32":
            w.add_tensor(s.name, "F32", s.shape, np.ones(s.shape, np.float32))
        else:
            x = rng.standard_normal(s.shape).astype(np.float32) * 0.02
            x[:, ::17] *= 8  # a few strong columns, so importance weights matter
            w.add_tensor(s.name, "F16", s.shape, x.astype(np.float16))
    w.write()


def test_quantize_uses_an_imatrix_file(tmp_path, capsys):
    src = tmp_path / "tiny.gguf"
    _tiny_model(src)
    rng = np.random.default_rng(3)
    with GGUFFile.open(src) as g:
        entries = {n: ImatrixEntry(rng.random((1, t.shape[1])).astype(np.float32) * 50, [100])
                   for n, t in g.tensors.items() if n.startswith("blk.") and len(t.shape) == 2}
    imx_path = tmp_path / "imatrix.gguf"
    Imatrix(entries, ["calibration.txt"], chunk_count=3, chunk_size=128).save(imx_path)

    plain, weighted = tmp_path / "plain.gguf", tmp_path / "weighted.gguf"
    assert main(["quantize", str(src), str(plain), "Q4_0"]) == 0
    assert main(["quantize", "--imatrix", str(imx_path), str(src), str(weighted), "Q4_0"]) == 0
    assert f"importance matrix used for {len(entries)} tensor(s)" in capsys.readouterr().out
    with GGUFFile.open(plain) as a, GGUFFile.open(weighted) as b:
        # with an imatrix llama.cpp guards the first n/8 ffn_down layers with Q4_1
        assert a.tensors["blk.0.ffn_down.weight"].type == "Q4_0"
        assert b.tensors["blk.0.ffn_down.weight"].type == "Q4_1"
        assert a.tensors["blk.3.attn_q.weight"].type == b.tensors["blk.3.attn_q.weight"].type
        assert not np.array_equal(a.tensors["blk.3.attn_q.weight"].data,
                                  b.tensors["blk.3.attn_q.weight"].data)
        # token_embd has no entry: quantized without one, identically
        assert np.array_equal(a.tensors["token_embd.weight"].data,
                              b.tensors["token_embd.weight"].data)
        md = b.metadata
        assert md["quantize.imatrix.file"] == str(imx_path)
        assert md["quantize.imatrix.dataset"] == "calibration.txt"
        assert md["quantize.imatrix.entries_count"] == len(entries)
        assert md["quantize.imatrix.chunks_count"] == 3
        assert "quantize.imatrix.file" not in a.metadata

    # the same weights given directly give the same bytes as through the file
    direct = quantize_model(src, tmp_path / "direct.gguf", "Q4_0",
                            imatrix={n: e.sums[0] / 100 for n, e in entries.items()})
    assert len(direct.imatrix_used) == len(entries)
    with GGUFFile.open(tmp_path / "direct.gguf") as c, GGUFFile.open(weighted) as b:
        for name in ("blk.3.attn_q.weight", "blk.0.ffn_down.weight"):
            assert np.array_equal(c.tensors[name].data, b.tensors[name].data)

    bad = dict(entries)
    bad["blk.2.attn_k.weight"] = ImatrixEntry(np.ones((1, 100), np.float32), [1])
    Imatrix(bad).save(imx_path)
    assert main(["quantize", "--imatrix", str(imx_path), str(src), str(tmp_path / "x.gguf"),
                 "Q4_K_M"]) == 1
    assert "imatrix size 100 is different from tensor size 256 for blk.2.attn_k.weight" in \
        capsys.readouterr().err
    assert not (tmp_path / "x.gguf").exists()


# ----------------------------------------------------------------------------- leftovers


def _wait_for_partial(store, proc, at_least: int):
    deadline = time.monotonic() + 300  # a first numba compile in the child can take a while
    while time.monotonic() < deadline:
        found = list_incomplete(store)
        if found and found[0].size >= at_least:
            return found[0]
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.01)
    pytest.fail("the quantize run never started writing")


def test_killed_quantize_leaves_nothing_behind(smollm2_path, tmp_path, monkeypatch, capsys):
    """kill -9 in the middle of `llamatui quantize` into the store: while it runs, `ls` and the
    disk-use figure count its partial file; after, they show it as left behind, and the next
    write into that folder removes it."""
    home = tmp_path / "home"
    store = home / "models"
    store.mkdir(parents=True)
    monkeypatch.setenv("LLAMATUI_HOME", str(home))
    monkeypatch.setenv("COLUMNS", "200")
    out = store / "SmolLM2-Q4_K_M.gguf"
    proc = subprocess.Popen(
        [sys.executable, "-m", "llamatui.app.cli", "quantize", "--allow-requantize",
         str(smollm2_path), str(out), "Q4_K_M", "1"],
        env={**os.environ, "LLAMATUI_HOME": str(home)}, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE)
    try:
        _wait_for_partial(store, proc, 4 << 20)
        proc.send_signal(signal.SIGSTOP)  # held mid-write: alive, its lock held
        os.waitpid(proc.pid, os.WUNTRACED)  # until it has stopped
        [p] = list_incomplete(store)
        assert (p.target, p.pid, p.abandoned) == (str(out), proc.pid, False)
        assert os.path.dirname(p.path) == str(store)
        usage = disk_usage(store)
        assert (usage.n_incomplete, usage.incomplete_bytes) == (1, os.path.getsize(p.path))
        assert main(["ls"]) == 0
        shown = capsys.readouterr().out
        assert f"incomplete SmolLM2-Q4_K_M.gguf: {p.size / 1e6:.1f} MB (being written by " \
               f"process {proc.pid})" in shown
        assert f"(+{p.size / 1e6:.1f} MB unfinished)" in shown
        assert remove_leftovers(store) == 0 and os.path.exists(p.path)  # not while it runs
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    [left] = list_incomplete(store)
    assert left.path == p.path and left.abandoned and not out.exists()
    assert main(["ls"]) == 0
    assert "SmolLM2-Q4_K_M.gguf: " in capsys.readouterr().out
    assert disk_usage(store).incomplete_bytes == left.size

    # The next run writing there (another, small quantization) removes it.
    src = tmp_path / "tiny.gguf"
    _tiny_model(src, n_layer=2)
    assert main(["quantize", str(src), str(store / "tiny-Q8_0.gguf"), "Q8_0"]) == 0
    assert sorted(os.listdir(store)) == ["tiny-Q8_0.gguf"]
    assert list_incomplete(store) == [] and disk_usage(store).incomplete_bytes == 0


def test_unwritable_output_folder_is_one_line(tmp_path, monkeypatch, capsys):
    """A folder that refuses writes (read-only; simulated, since tests run as root)."""
    src = tmp_path / "tiny.gguf"
    _tiny_model(src, n_layer=2)
    out_dir = tmp_path / "ro"
    out_dir.mkdir()
    real_mkstemp = tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):
        if dir == str(out_dir):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), dir)
        return real_mkstemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    assert main(["quantize", str(src), str(out_dir / "q.gguf"), "Q8_0"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == f"llamatui quantize: error: cannot write {out_dir / 'q.gguf'}: " \
                  "Read-only file system"
    assert list(out_dir.iterdir()) == []
