"""Mixture-of-experts pieces: `matmul_id` (ggml_mul_mat_id) against each chosen expert's own
product on both of its paths, reading only the chosen experts; build_moe_ffn's routing; a MoE
model decoded token by token (the fused kernel over the chosen rows) as in one batch (experts'
tokens gathered); clear errors for a broken MoE file. The forward pass itself is compared with
llama.cpp in test_archs.py."""
import math

import numpy as np
import pytest

from llamatui.inference import LoadConfig
import llamatui.inference.cpu.matmul as mm
import synthetic_models
from llamatui.inference.archs import moe
from llamatui.inference.hparams import ModelMetadataError
from llamatui.inference.model import Batch, Model
from llamatui.inference.quants import quantize
from synthetic_models import TOKENS, write_model

pytestmark = pytest.mark.usefixtures("float32_products")

N_EXPERT, N_OUT, N_IN = 6, 40, 512
RTOL = 1e-4  # of sum_k |x_k * w_k|: float32 accumulation error only


def expert_bytes(type_name: str, values: np.ndarray) -> np.ndarray:
    """float32 (n_expert, n_out, n_in) as the uint8 rows of a 3-D GGUF tensor of that type."""
    n_expert, n_out, n_in = values.shape
    rows = values.reshape(-1, n_in)
    if type_name == "F32":
        raw = rows.view(np.uint8)
    elif type_name == "F16":
        raw = rows.astype(np.float16).view(np.uint8)
    else:
        raw = np.asarray(quantize(type_name, rows)).view(np.uint8)
    return np.ascontiguousarray(raw).reshape(n_expert, n_out, -1)


def choices(rng, n_tokens: int, n_used: int, among: int = N_EXPERT) -> np.ndarray:
    """n_used different experts per token out of the first `among`, expert 0 far more often
    than the others (so a batch has experts of many tokens and experts of few)."""
    bias = np.where(np.arange(among) == 0, 3.0, 0.0)
    return np.argsort(-(rng.standard_normal((n_tokens, among)) + bias), axis=1)[:, :n_used]


@pytest.mark.parametrize("type_name", ["F32", "F16", "Q8_0", "Q4_K", "Q6_K", "Q5_0"])
@pytest.mark.parametrize("n_tokens", [1, 3, 9, 64])  # fused kernel only; then both paths
@pytest.mark.parametrize("per_expert_input", [False, True])
def test_matmul_id_equals_each_chosen_experts_product(type_name, n_tokens, per_expert_input):
    rng = np.random.default_rng(n_tokens)
    values = rng.standard_normal((N_EXPERT, N_OUT, N_IN)).astype(np.float32)
    raw = expert_bytes(type_name, values)
    ids = choices(rng, n_tokens, 2)
    shape = (n_tokens, 2, N_IN) if per_expert_input else (n_tokens, N_IN)
    x = rng.standard_normal(shape).astype(np.float32)
    got = mm.matmul_id(type_name, raw, x, ids)
    assert got.shape == (n_tokens, 2, N_OUT) and got.dtype == np.float32
    for t in range(n_tokens):
        for j, e in enumerate(ids[t]):
            xi = x[t, j] if per_expert_input else x[t]
            want = mm.matmul(type_name, raw[e], xi[None])[0]
            W = mm.embedding_rows(type_name, raw[e], np.arange(N_OUT)).astype(np.float64)
            scale = np.abs(W) @ np.abs(xi.astype(np.float64)) + 1e-30
            assert (np.abs(got[t, j] - want) / scale).max() <= RTOL


@pytest.mark.parametrize("type_name", ["F16", "Q4_K"])
@pytest.mark.parametrize("n_tokens", [1, 64])
def test_matmul_id_reads_only_the_chosen_experts(type_name, n_tokens):
    rng = np.random.default_rng(7)
    raw = expert_bytes(type_name, rng.standard_normal((N_EXPERT, N_OUT, N_IN)).astype(np.float32))
    ids = choices(rng, n_tokens, 2, among=4)
    x = rng.standard_normal((n_tokens, N_IN)).astype(np.float32)
    want = mm.matmul_id(type_name, raw, x, ids)
    poisoned = raw.copy()
    poisoned[4:] = 0xFF  # NaN halves: any read of these experts shows in the result
    got = mm.matmul_id(type_name, poisoned, x, ids)
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, want)


def test_matmul_id_rejects_bad_input():
    raw = expert_bytes("Q8_0", np.zeros((N_EXPERT, N_OUT, N_IN), np.float32))
    x = np.zeros((2, N_IN), np.float32)
    with pytest.raises(IndexError, match=r"expert id out of range \[0, 6\)"):
        mm.matmul_id("Q8_0", raw, x, np.array([[0, 6], [1, 2]]))
    with pytest.raises(ValueError, match=r"x of shape \(2, 256\)"):
        mm.matmul_id("Q8_0", raw, x[:, :256], np.array([[0, 1], [1, 2]]))
    with pytest.raises(TypeError, match="3-D"):
        mm.matmul_id("Q8_0", raw[0], x, np.array([[0, 1], [1, 2]]))


def test_route_is_build_moe_ffns_softmax_top_k():
    logits = np.array([[0.0, 2.0, 1.0, -1.0], [3.0, 3.5, -2.0, 0.5]], np.float32)
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    chosen, weights = moe.route(logits, 2, normalize=False)
    np.testing.assert_array_equal(chosen, [[1, 2], [1, 0]])
    np.testing.assert_allclose(weights, np.take_along_axis(probs, chosen, 1), rtol=1e-6)
    _, normalized = moe.route(logits, 2, normalize=True)
    np.testing.assert_allclose(normalized.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(normalized[0, 0] / normalized[0, 1], np.exp(1.0), rtol=1e-5)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("moe")


@pytest.mark.parametrize("family", ["qwen2moe", "qwen3moe"])
def test_routing_spreads_tokens_over_the_experts(family, model_dir, monkeypatch):
    """The synthetic models' routers make routing matter: every expert is used, and tokens
    choose different sets of experts."""
    sets = []
    route = moe.route

    def recording_route(logits, n_used, *gating):
        chosen, weights = route(logits, n_used, *gating)
        sets.append(chosen)
        return chosen, weights

    monkeypatch.setattr(moe, "route", recording_route)
    model = Model.load(write_model(family, "Q8_0", model_dir), LoadConfig(n_ctx=128))
    model.decode(Batch(TOKENS, pos=0, logits=True))
    hp = model.hparams
    assert len(sets) == hp.n_layer
    for chosen in sets:
        uses = np.bincount(chosen.reshape(-1), minlength=hp.n_expert)
        assert uses.min() > 0 and uses.max() <= 0.6 * len(TOKENS)
        n_sets = len({frozenset(row) for row in chosen.tolist()})
        assert n_sets >= min(len(TOKENS), math.comb(hp.n_expert, hp.n_expert_used)) // 2


@pytest.mark.parametrize("family", ["qwen2moe", "qwen3moe"])
def test_moe_decoding_token_by_token_equals_one_batch(family, model_dir):
    """Token by token (each expert's rows through the fused kernel) as in one batch (each
    expert's tokens gathered into one product): the same logits up to float32 rounding."""
    model = Model.load(write_model(family, "Q4_K", model_dir), LoadConfig(n_ctx=128))
    ids, n_prompt = TOKENS[:24], 16
    full = model.logits_for(ids)[n_prompt - 1:]
    model.kv.clear()
    rows = [model.decode(Batch(ids[:n_prompt], pos=0))[0]]
    rows += [model.decode(Batch([t]))[0] for t in ids[n_prompt:]]
    err = np.abs(np.stack(rows) - full).max() / np.abs(full).max()
    assert err <= 2e-3
    assert (np.stack(rows).argmax(axis=1) == full.argmax(axis=1)).all()


def _broken(monkeypatch, family, change):
    recipe = synthetic_models.RECIPES[family]

    def broken_recipe(rng):
        r = recipe(rng)
        change(r)
        return r

    monkeypatch.setitem(synthetic_models.CASES, family, synthetic_models.Case(broken_recipe))


def test_a_moe_model_without_chosen_experts_is_refused(monkeypatch, model_dir):
    _broken(monkeypatch, "qwen3moe",
            lambda r: r.metadata.update({"qwen3moe.expert_used_count": 0}))
    with pytest.raises(ModelMetadataError, match="qwen3moe.expert_used_count = 0"):
        Model.load(write_model("qwen3moe", "F16", model_dir), LoadConfig(n_ctx=32))


def test_expert_tensors_are_checked_against_the_hyperparameters(monkeypatch, model_dir):
    def drop_an_expert(r):
        t = r.tensors["blk.1.ffn_up_exps.weight"]
        r.tensors["blk.1.ffn_up_exps.weight"] = t[:-1]

    _broken(monkeypatch, "qwen2moe", drop_an_expert)
    with pytest.raises(ModelMetadataError, match=r"'blk.1.ffn_up_exps.weight' has shape "
                       r"\(7, 256, 256\): expected \(8, 256, 256\)"):
        Model.load(write_model("qwen2moe", "F16", model_dir), LoadConfig(n_ctx=32))
