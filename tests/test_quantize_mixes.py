"""The i-quant and ternary mixes (IQ1_S ... IQ3_M, TQ1_0, TQ2_0) against llama-quantize's own
output on synthetic models (tests/record_llama_quantize_mixes.py recorded it): the type of every
tensor, its bytes, the whole file, and the mixes refused without an importance matrix."""
import json

import pytest
from record_llama_quantize_mixes import GOLDEN, MIXES, MODELS, digest, write_imatrix, write_models

from llamatui.app.cli import main
from llamatui.inference.catalog import MIXES_BY_NAME
from llamatui.inference.gguf import GGUFFile
from llamatui.quantizer.model import (ModelFacts, QuantizeError, parse_ftype, quantize_model,
                                      select_tensor_types, tensor_specs)


@pytest.fixture(scope="module")
def golden():
    return json.loads(GOLDEN.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """model name → a folder holding in.gguf and imatrix.gguf, as the recording had them."""
    root = tmp_path_factory.mktemp("mixes")
    folders = {}
    for name, path in write_models(root).items():
        folder = root / f"run-{name}"
        folder.mkdir()
        path.rename(folder / "in.gguf")
        write_imatrix(folder / "in.gguf", folder / "imatrix.gguf")
        folders[name] = folder
    return folders


def test_recording_covers_every_mix(golden):
    assert sorted(golden) == sorted(MODELS)
    for cases in golden.values():
        assert sorted(cases) == sorted(f"{m}{s}" for m in MIXES for s in ("", "+imatrix"))
    for mix in MIXES:
        assert MIXES_BY_NAME[mix].quantizable and parse_ftype(mix).name == mix


@pytest.mark.parametrize("model", MODELS)
def test_types_match_llama_quantize(model, runs, golden):
    """Every recorded case, planning only: each tensor's type, in llama.cpp's order."""
    with GGUFFile.open(runs[model] / "in.gguf") as g:
        specs, facts = tensor_specs(g), ModelFacts.from_metadata(g.metadata)
    for key, want in golden[model].items():
        if want.get("refused"):
            continue
        mix, has_imatrix = key.removesuffix("+imatrix"), key.endswith("+imatrix")
        chosen = select_tensor_types(specs, facts, mix, has_imatrix=has_imatrix)
        assert list(chosen.items()) == [(n, t) for n, (t, _) in want["tensors"].items()], key


# Each mix's bytes on one model (the models in turn), with an imatrix; the four mixes that need
# none also without one. test_types_match_llama_quantize covers the rest.
BYTE_CASES = [(MODELS[i % len(MODELS)], f"{mix}+imatrix") for i, mix in enumerate(MIXES)] + \
    [(MODELS[i], mix) for i, mix in enumerate(("IQ3_S", "IQ3_M", "TQ1_0", "TQ2_0"))]


@pytest.mark.parametrize("model,key", BYTE_CASES)
def test_bytes_match_llama_quantize(model, key, runs, golden, monkeypatch):
    """The same file as llama-quantize's, byte for byte (run in the same folder with the same
    relative imatrix path, which the output's metadata records)."""
    monkeypatch.chdir(runs[model])
    mix = key.removesuffix("+imatrix")
    quantize_model("in.gguf", "out.gguf", mix,
                   imatrix="imatrix.gguf" if key.endswith("+imatrix") else None)
    got, want = digest("out.gguf"), golden[model][key]
    assert list(got["tensors"]) == list(want["tensors"])
    for name, (type_name, data) in want["tensors"].items():
        assert got["tensors"][name] == [type_name, data], name
    assert got["sha256"] == want["sha256"]


def test_refusals_without_an_imatrix_match_llama_quantize(runs, golden):
    """llama-quantize refuses the mixes whose tensors need importance weights (IQ1/IQ2 and
    IQ3_XXS/IQ3_XS, whose attn_q/attn_k are IQ2_S/IQ3_XXS), and quantizes the rest."""
    for model, folder in runs.items():
        for mix in MIXES:
            refused = golden[model][mix].get("refused", False)
            out = folder / f"refused-{mix}.gguf"
            try:
                quantize_model(folder / "in.gguf", out, mix)
            except QuantizeError as e:
                assert refused, f"{model} {mix}: {e}"
                assert not out.exists()
            else:
                assert not refused, f"{model} {mix}: llama-quantize refuses it"


@pytest.mark.parametrize("mix", ["IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"])
def test_cli_names_the_missing_imatrix(mix, runs, tmp_path, capsys):
    out = tmp_path / "q.gguf"
    assert main(["quantize", str(runs["llama_gqa1"] / "in.gguf"), str(out), mix]) == 1
    err = capsys.readouterr().err
    assert f"{mix} quantizes blk.0.attn_k.weight to {mix}, which needs an importance matrix; " \
        "pass --imatrix FILE" in err
    assert not out.exists()


def test_imatrix_without_the_entry(runs, tmp_path):
    """An imatrix that lacks a tensor the mix needs it for: refused, naming it (llama.cpp's
    "Missing importance matrix for tensor ... in a very low-bit quantization")."""
    with pytest.raises(QuantizeError, match="blk.0.attn_k.weight to IQ2_XXS, which needs an "
                                            "importance matrix, and the imatrix has no entry"):
        quantize_model(runs["llama_gqa1"] / "in.gguf", tmp_path / "q.gguf", "IQ2_XXS",
                       imatrix={"blk.7.ffn_up.weight": [1.0] * 256})
    assert not (tmp_path / "q.gguf").exists()
