"""Every family of the catalog against llama.cpp itself, on synthetic models (tests/
synthetic_models.py): at each of the 80 positions our top-1 token equals llama.cpp's wherever
llama.cpp's top-2 margin is at least 0.1 nats, and the log-probability we give llama.cpp's top token
is within 0.02 on average (0.1 at most), for F16, Q8_0, Q4_K and Q6_K weights.

Mixture-of-experts models leave out the positions whose routing is a toss-up: where, on some
layer, the router's logits for the last expert chosen and the first one left out are under 0.1
apart, llama.cpp's 8-bit activations may choose the other expert, and that position's output then
differs by up to 0.2 nats for a reason that is not the forward pass's."""
import json
import pathlib

import numpy as np
import pytest

from llamatui.inference.archs import moe
from llamatui.inference.catalog import ARCHITECTURES
from llamatui.inference.model import Batch, Model
from synthetic_models import RECIPES, TOKENS, TYPES, sha256_of, write_model

GOLDEN = json.loads((pathlib.Path(__file__).parent / "golden" / "synthetic_logits.json")
                    .read_text())
MARGIN = 0.1  # nats between llama.cpp's top two: below it, either token may win
ROUTER_MARGIN = 0.1  # between the last expert chosen and the next: below it, either may be
CASES = [(f, t) for f in RECIPES for t in TYPES]


def test_every_catalog_family_has_a_synthetic_model_and_reference():
    assert set(RECIPES) == set(ARCHITECTURES)
    assert {f"{f}/{t}" for f, t in CASES} <= set(GOLDEN["models"])
    assert GOLDEN["tokens"] == TOKENS


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("synthetic")


@pytest.fixture
def router_margins(monkeypatch) -> list:
    """Per MoE layer run, each token's margin between the last expert chosen and the next."""
    margins = []
    route = moe.route

    def recording_route(logits, n_used, normalize):
        ranked = -np.sort(-np.asarray(logits, np.float32), axis=1)
        margins.append(ranked[:, n_used - 1] - ranked[:, n_used])
        return route(logits, n_used, normalize)

    monkeypatch.setattr(moe, "route", recording_route)
    return margins


@pytest.mark.parametrize("family,type_name", CASES)
def test_logits_match_llama_cpp(family, type_name, model_dir, float32_prompts, router_margins):
    ref = GOLDEN["models"][f"{family}/{type_name}"]
    path = write_model(family, type_name, model_dir)
    assert sha256_of(path) == ref["sha256"], "the recipe changed: record the reference again"
    model = Model.load(path, n_ctx=256)
    try:
        logprobs = _log_softmax(model.decode(Batch(TOKENS, pos=0, logits=True)))
    finally:
        model.close()
    settled = np.ones(len(TOKENS), bool)
    if router_margins:  # every layer routes all 80 tokens (all of them want logits)
        settled = np.min(router_margins, axis=0) >= ROUTER_MARGIN
        assert settled.sum() >= 40, "too many toss-up routings to mean much"
    top2 = np.array(ref["top2"])[settled]
    top1, top1_lp, top2_lp = top2[:, 0].astype(int), top2[:, 1], top2[:, 3]
    logprobs = logprobs[settled]
    diffs = np.abs(logprobs[np.arange(len(top1)), top1] - top1_lp)
    confident = top1_lp - top2_lp >= MARGIN
    ours = logprobs.argmax(axis=1)
    print(f"\n{family}/{type_name}: mean |Δ logprob| {diffs.mean():.4f}, max {diffs.max():.4f}, "
          f"top-1 agreement {np.mean(ours[confident] == top1[confident]):.2%} over "
          f"{confident.sum()} confident positions of {settled.sum()} compared")
    assert confident.sum() >= 32, "too few confident positions to mean much"
    assert (ours[confident] == top1[confident]).all()
    assert diffs.mean() <= 0.02 and diffs.max() <= 0.1
