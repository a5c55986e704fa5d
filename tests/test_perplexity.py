"""`llamatui perplexity` against llama-perplexity's figures (-c 128, texts/apache-2.0.txt)."""
import json
import re

import numpy as np
import pytest

from llamatui.app.cli import main
from llamatui.inference.perplexity import perplexity


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_perplexity_matches_llama_cpp(model, smollm2_path, gemma3_path, golden_dir, capsys):
    path = {"smollm2": smollm2_path, "gemma3": gemma3_path}[model]
    expected = json.loads((golden_dir / "perplexity.json").read_text())[path.name]
    expected = expected["texts/apache-2.0.txt"]
    text = golden_dir / "texts" / "apache-2.0.txt"
    assert main(["perplexity", "-m", str(path), "-f", str(text), "-c", "128", "-t", "2"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    m = re.fullmatch(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)", last)
    assert m, last
    ppl, err = float(m.group(1)), float(m.group(2))
    print(f"{path.name}: PPL {ppl:.4f} +/- {err:.5f}, llama.cpp {expected['ppl']}")
    assert abs(ppl - expected["ppl"]) / expected["ppl"] < 0.01
    assert abs(err - expected["stderr"]) / expected["stderr"] < 0.05


def test_scoring_uses_second_half_of_each_chunk():
    n_vocab, n_ctx = 5, 8
    tokens = [1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2]  # two whole chunks

    def uniform(ids):
        return np.zeros((len(ids), n_vocab), np.float32)

    r = perplexity(uniform, tokens, n_ctx, bos_id=None)
    assert r.n_chunks == 2 and r.n_scored == 2 * (n_ctx - 1 - n_ctx // 2)
    assert r.ppl == pytest.approx(n_vocab) and r.stderr == pytest.approx(0, abs=1e-9)

    def peaked(ids):  # certain of the true next token
        out = np.full((len(ids), n_vocab), -50, np.float32)
        for i, t in enumerate(ids[:-1]):
            out[i, (t + 1) % n_vocab] = 50
        return out

    assert perplexity(peaked, tokens, n_ctx, bos_id=None).ppl == pytest.approx(1.0)
    with pytest.raises(ValueError, match="at least n_ctx"):
        perplexity(uniform, tokens[:5], n_ctx, bos_id=None)
