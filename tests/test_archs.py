"""Every family of the catalog, and variants of some (synthetic_models.VARIANTS: Llama 3's
rope_freqs, YaRN, a Mistral-style window, LongRoPE's long factors, OLMo 3's windows), against
llama.cpp itself, on synthetic models (tests/synthetic_models.py): at each of the 80 positions our top-1 token equals llama.cpp's wherever
llama.cpp's top-2 margin is at least 0.1 nats, and the log-probability we give llama.cpp's top token
is within 0.02 on average (0.1 at most), for F16, Q8_0, Q4_K and Q6_K weights."""
import json
import pathlib

import numpy as np
import pytest

from llamatui.inference.catalog import ARCHITECTURES
from llamatui.inference.model import Batch, Model
from synthetic_models import CASES, RECIPES, TOKENS, TYPES, sha256_of, write_model

GOLDEN = json.loads((pathlib.Path(__file__).parent / "golden" / "synthetic_logits.json")
                    .read_text())
MARGIN = 0.1  # nats between llama.cpp's top two: below it, either token may win
MODELS = [(name, t) for name in CASES for t in TYPES]


def test_every_catalog_family_has_a_synthetic_model_and_reference():
    assert set(RECIPES) == set(ARCHITECTURES)
    assert {f"{name}/{t}" for name, t in MODELS} <= set(GOLDEN["models"])
    assert GOLDEN["tokens"] == TOKENS


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("synthetic")


@pytest.mark.parametrize("name,type_name", MODELS)
def test_logits_match_llama_cpp(name, type_name, model_dir, float32_prompts):
    ref = GOLDEN["models"][f"{name}/{type_name}"]
    path = write_model(name, type_name, model_dir)
    assert sha256_of(path) == ref["sha256"], "the recipe changed: record the reference again"
    model = Model.load(path, n_ctx=CASES[name].n_ctx)
    try:
        logprobs = _log_softmax(model.decode(Batch(TOKENS, pos=0, logits=True)))
    finally:
        model.close()
    top2 = np.array(ref["top2"])
    top1, top1_lp, top2_lp = top2[:, 0].astype(int), top2[:, 1], top2[:, 3]
    diffs = np.abs(logprobs[np.arange(len(TOKENS)), top1] - top1_lp)
    confident = top1_lp - top2_lp >= MARGIN
    ours = logprobs.argmax(axis=1)
    print(f"\n{name}/{type_name}: mean |Δ logprob| {diffs.mean():.4f}, max {diffs.max():.4f}, "
          f"top-1 agreement {np.mean(ours[confident] == top1[confident]):.2%} over "
          f"{confident.sum()} confident positions")
    assert confident.sum() >= 32, "too few confident positions to mean much"
    assert (ours[confident] == top1[confident]).all()
    assert diffs.mean() <= 0.02 and diffs.max() <= 0.1
