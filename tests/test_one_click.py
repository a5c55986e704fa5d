"""One-click download-and-quantize: an F16 SmolLM2 on the stand-in Hub becomes a chat-ready
Q4_K_M in the store (app.one_click, `llamatui pull --quantize`)."""
import threading
from types import SimpleNamespace

import pytest

from hub_server import hub_server  # noqa: F401 - the fixture
from llamatui.inference import LoadConfig
from llamatui.app.cli import main
from llamatui.app.one_click import (QuantizeCancelled, choose_target, fetch_and_quantize,
                                    output_name)
from llamatui.inference.engine import Engine
from llamatui.inference.gguf import GGUFFile
from llamatui.models.store import list_models, read_sidecar
from llamatui.quantizer.model import ModelFacts, quantize_model, select_tensor_types, tensor_specs

REPO = "acme/SmolLM2-135M-Instruct-F16-GGUF"
F16_NAME = "SmolLM2-135M-Instruct-F16.gguf"
GiB = 1 << 30
BIG_MACHINE = SimpleNamespace(ram_available=64 * GiB, vram_free=0)


@pytest.fixture(scope="module")
def f16_file(smollm2_path, tmp_path_factory):
    """An F16 copy of SmolLM2 (dequantized starter model, written F16), once per module."""
    out = tmp_path_factory.mktemp("one_click_f16") / F16_NAME
    quantize_model(smollm2_path, out, "F16", allow_requantize=True)
    return out


@pytest.fixture
def f16_hub(hub_server, f16_file, tmp_path, monkeypatch):  # noqa: F811
    """The stand-in Hub serving the F16 file (from disk) beside a README; the store in tmp."""
    monkeypatch.setenv("LLAMATUI_HOME", str(tmp_path / "home"))
    repo = hub_server.add_repo(REPO)
    repo.add(F16_NAME, disk=f16_file)
    repo.add("README.md", b"# SmolLM2 F16\n")
    return hub_server


def _folder(tmp_path):
    return tmp_path / "home" / "models" / REPO


def _names(folder):
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock"))


def test_output_name():
    assert output_name("SmolLM2-135M-Instruct-F16.gguf", "Q4_K_M") == \
        "SmolLM2-135M-Instruct-Q4_K_M.gguf"
    assert output_name("model.bf16.gguf", "Q3_K_M") == "model.Q3_K_M.gguf"
    assert output_name("ggml-model.gguf", "Q4_0") == "ggml-model-Q4_0.gguf"


def test_choice_follows_the_machine(f16_file):
    with GGUFFile.open(f16_file) as g:
        size = f16_file.stat().st_size
        big = choose_target(g, size, BIG_MACHINE)
        assert big.quant == "Q4_K_M" and "fits in RAM" in big.reason
        # a machine between the Q2_K and the Q4_K_M estimates gets a smaller type
        need_q4 = big.fit.estimate.total_bytes
        need_q2 = choose_target(g, size, BIG_MACHINE, target_type="Q2_K").fit.estimate.total_bytes
        assert need_q2 < need_q4
        small = choose_target(g, size, SimpleNamespace(ram_available=(need_q2 + 1) / 0.9,
                                                       vram_free=0))
        assert small.quant not in ("Q4_K_M", "Q8_0") and small.fit.fits
        assert "largest that fits" in small.reason
        with pytest.raises(Exception, match="no quantization fits"):
            choose_target(g, size, SimpleNamespace(ram_available=GiB // 100, vram_free=0))
        forced = choose_target(g, size, BIG_MACHINE, target_type="q8_0")
        assert forced.quant == "Q8_0" and "asked for" in forced.reason


def test_fetch_and_quantize_end_to_end(f16_hub, f16_file, tmp_path):
    stages = []
    r = fetch_and_quantize(REPO, progress=lambda s, d, t: stages.append((s, d, t)),
                           hw=BIG_MACHINE)
    folder = _folder(tmp_path)
    assert r.path == folder / "SmolLM2-135M-Instruct-Q4_K_M.gguf" and r.quant == "Q4_K_M"
    assert "default" in r.reason and r.source_path is None and r.source_quant == "F16"
    # the F16 and its sidecar are gone; no temporary or lock files are left
    assert sorted(p.name for p in folder.iterdir()) == [r.path.name, r.path.name + ".json"]
    labels = {s for s, _, _ in stages}
    assert F16_NAME in labels and "Quantizing to Q4_K_M" in labels
    done = [(d, t) for s, d, t in stages if s == "Quantizing to Q4_K_M" and t]
    assert len(done) > 100 and done[-1][0] == done[-1][1]  # per tensor, to the end

    # tensor types exactly as quantizer.model chooses them for this model
    with GGUFFile.open(f16_file) as src, GGUFFile.open(r.path) as q:
        expected = select_tensor_types(tensor_specs(src), ModelFacts.from_metadata(src.metadata),
                                       "Q4_K_M")
        assert {n: t.type for n, t in q.tensors.items()} == expected
        assert q.metadata["general.file_type"] == 15
    side = read_sidecar(r.path)
    assert side["source"] == "quantized" and side["repo"] == REPO and side["quant"] == "Q4_K_M"
    assert side["quantized_from"]["file"] == F16_NAME and side["quantized_from"]["type"] == "F16"
    [m] = list_models()
    assert m.quantization == "Q4_K_M" and m.repo == REPO and m.ref == f"{REPO}:Q4_K_M"

    # chat-ready: it loads, answers through its chat template, and still knows things
    with Engine.load(r, LoadConfig(n_ctx=256, threads=2)) as engine:
        chat = "".join(e.text for e in engine.generate(
            [{"role": "user", "content": "Hello!"}], temperature=0, max_tokens=4))
        assert chat.strip()
        text = "".join(e.text for e in engine.generate("The capital of France is",
                                                       temperature=0, max_tokens=6))
        assert "Paris" in text, text

    # a second call finds it and neither downloads nor quantizes again
    n_get = len(f16_hub.file_requests(F16_NAME))
    again = fetch_and_quantize(REPO, hw=BIG_MACHINE)
    assert again.already_present and again.path == r.path
    assert len(f16_hub.file_requests(F16_NAME)) == n_get


def test_cancel_leaves_no_output_then_cli_keeps_f16(f16_hub, tmp_path, capsys, monkeypatch):
    cancel = threading.Event()

    def progress(stage, done, total):
        if stage.startswith("Quantizing") and done > 0:
            cancel.set()  # mid-way: after the first tensor is written

    with pytest.raises(QuantizeCancelled, match="cancelled at tensor"):
        fetch_and_quantize(REPO, "Q8_0", progress=progress, cancel=cancel, hw=BIG_MACHINE)
    folder = _folder(tmp_path)
    # only the downloaded source (kept for the next try) and its sidecar: no output, no temp
    # (models.download leaves its hidden lock file, as after any pull)
    assert _names(folder) == [F16_NAME, F16_NAME + ".json"]

    # the CLI: an explicit type, keeping the F16 (already downloaded: not fetched again)
    import llamatui.models.hardware as hardware
    monkeypatch.setattr(hardware, "detect", lambda **kw: BIG_MACHINE)
    n_get = len(f16_hub.file_requests(F16_NAME))
    assert main(["pull", REPO, "--quantize", "Q8_0", "--keep-f16"]) == 0
    captured = capsys.readouterr()
    out = folder / "SmolLM2-135M-Instruct-Q8_0.gguf"
    assert captured.out.strip().splitlines()[-1] == str(out)
    assert "Q8_0 chosen" in captured.err and "kept the F16 source" in captured.err
    assert len(f16_hub.file_requests(F16_NAME)) == n_get
    assert _names(folder) == sorted([F16_NAME, F16_NAME + ".json", out.name,
                                     out.name + ".json"])
    with GGUFFile.open(out) as q:
        assert q.metadata["general.file_type"] == 7
