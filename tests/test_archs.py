"""Every family of the catalog, and variants of some (synthetic_models.VARIANTS: Llama 3's
rope_freqs, YaRN, a Mistral-style window, LongRoPE's long factors, OLMo 3's windows), against
llama.cpp itself, on synthetic models (tests/synthetic_models.py): at each of the 80 positions
our top-1 token equals llama.cpp's wherever llama.cpp's top-2 margin is at least 0.1 nats, and
the log-probability we give llama.cpp's top token is within 0.02 on average (0.1 at most), for
F16, Q8_0, Q4_K and Q6_K weights. Then the family metadata llama.cpp reads its own way.

Mixture-of-experts models leave out the positions whose routing is a toss-up: where, on some
layer, the router's logits for the last expert chosen and the first one left out are under 0.1
apart, llama.cpp's 8-bit activations may choose the other expert, and that position's output then
differs by up to 0.2 nats for a reason that is not the forward pass's.

Encoders (BERT...) have no logits: their pooled embeddings (pooled as the model's pooling_type
says) point where llama.cpp's do, cosine similarity ≥ 0.999 for each input, for token ids
evaluated together in one batch and, on F16 models, for texts through the engine's API."""
import json
import pathlib
from types import SimpleNamespace

import numpy as np
import pytest

from llamatui.inference import LoadConfig
from llamatui.inference.archs import moe
from llamatui.inference.catalog import ARCHITECTURES
from llamatui.inference.engine import Engine
from llamatui.inference.hparams import ModelMetadataError, read_hparams
from llamatui.inference.model import Batch, Model
from synthetic_models import (CASES, EMBED_INPUTS, EMBED_TEXTS, RECIPES, TOKENS, TYPES,
                              sha256_of, write_model)

GOLDEN_DIR = pathlib.Path(__file__).parent / "golden"
GOLDEN = json.loads((GOLDEN_DIR / "synthetic_logits.json").read_text())
GOLDEN_EMBEDDINGS = json.loads((GOLDEN_DIR / "synthetic_embeddings.json").read_text())
MARGIN = 0.1  # nats between llama.cpp's top two: below it, either token may win
ROUTER_MARGIN = 0.1  # between the last expert chosen and the next: below it, either may be
MIN_COSINE = 0.999
ENCODERS = [name for name in CASES if ARCHITECTURES[CASES[name].arch].encoder]
MODELS = [(name, t) for name in CASES if name not in ENCODERS for t in TYPES]
ENCODER_CASES = [(name, t) for name in ENCODERS for t in TYPES]


def test_every_catalog_family_has_a_synthetic_model_and_reference():
    assert set(RECIPES) == set(ARCHITECTURES)
    assert {f"{name}/{t}" for name, t in MODELS} <= set(GOLDEN["models"])
    assert {f"{name}/{t}" for name, t in ENCODER_CASES} <= set(GOLDEN_EMBEDDINGS["models"])
    assert GOLDEN["tokens"] == TOKENS
    assert GOLDEN_EMBEDDINGS["inputs"] == EMBED_INPUTS
    assert GOLDEN_EMBEDDINGS["texts"] == EMBED_TEXTS


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

    def recording_route(logits, n_used, *gating):
        # every gating ranks the experts by their (biased) logits: the margin is theirs
        ranked = -np.sort(-np.asarray(logits, np.float32), axis=1)
        margins.append(ranked[:, n_used - 1] - ranked[:, n_used])
        return route(logits, n_used, *gating)

    monkeypatch.setattr(moe, "route", recording_route)
    return margins


@pytest.mark.parametrize("name,type_name", MODELS)
def test_logits_match_llama_cpp(name, type_name, model_dir, float32_products, router_margins):
    ref = GOLDEN["models"][f"{name}/{type_name}"]
    path = write_model(name, type_name, model_dir)
    assert sha256_of(path) == ref["sha256"], "the recipe changed: record the reference again"
    model = Model.load(path, LoadConfig(n_ctx=CASES[name].n_ctx))
    tokens = CASES[name].tokens  # TOKENS, or more positions where the case asks for them
    try:
        logprobs = _log_softmax(model.decode(Batch(tokens, pos=0, logits=True)))
    finally:
        model.close()
    assert len(ref["top2"]) == len(tokens)
    settled = np.ones(len(tokens), bool)
    if router_margins:  # every layer routes every token (all of them want logits)
        settled = np.min(router_margins, axis=0) >= ROUTER_MARGIN
        assert settled.sum() >= 64, "too many toss-up routings to mean much"
    top2 = np.array(ref["top2"])[settled]
    top1, top1_lp, top2_lp = top2[:, 0].astype(int), top2[:, 1], top2[:, 3]
    logprobs = logprobs[settled]
    diffs = np.abs(logprobs[np.arange(len(top1)), top1] - top1_lp)
    confident = top1_lp - top2_lp >= MARGIN
    ours = logprobs.argmax(axis=1)
    print(f"\n{name}/{type_name}: mean |Δ logprob| {diffs.mean():.4f}, max {diffs.max():.4f}, "
          f"top-1 agreement {np.mean(ours[confident] == top1[confident]):.2%} over "
          f"{confident.sum()} confident positions of {settled.sum()} compared")
    assert confident.sum() >= 32, "too few confident positions to mean much"
    assert (ours[confident] == top1[confident]).all()
    assert diffs.mean() <= 0.02 and diffs.max() <= 0.1


def _cosines(ours: np.ndarray, reference) -> np.ndarray:
    ref = np.asarray(reference, dtype=np.float64)
    ours = np.asarray(ours, dtype=np.float64)
    return (ours * ref).sum(axis=1) / (np.linalg.norm(ours, axis=1) *
                                       np.linalg.norm(ref, axis=1))


@pytest.mark.parametrize("family,type_name", ENCODER_CASES)
def test_encoder_embeddings_match_llama_cpp(family, type_name, model_dir):
    ref = GOLDEN_EMBEDDINGS["models"][f"{family}/{type_name}"]
    path = write_model(family, type_name, model_dir)
    assert sha256_of(path) == ref["sha256"], "the recipe changed: record the reference again"
    model = Model.load(path, LoadConfig(n_ctx=256))
    try:
        assert model.hparams.pooling == ("none", "mean", "cls", "last")[ref["pooling_type"]]
        ours = model.embed(EMBED_INPUTS, model.hparams.pooling)  # all inputs in one batch
    finally:
        model.close()
    cosines = _cosines(ours, ref["embeddings"])
    print(f"\n{family}/{type_name} ({model.hparams.pooling} pooling): cosine similarity "
          f"{', '.join(f'{c:.6f}' for c in cosines)}")
    assert (cosines >= MIN_COSINE).all()


@pytest.mark.parametrize("family", ENCODERS)
def test_encoder_embeds_texts_like_llama_cpp(family, model_dir):
    """Text in, through the WordPiece vocabulary ([CLS] ... [SEP]) and the engine's API."""
    ref = GOLDEN_EMBEDDINGS["models"][f"{family}/F16"]
    engine = Engine.load(write_model(family, "F16", model_dir), LoadConfig(n_ctx=256, threads=2))
    try:
        assert [engine.tokenize(t) for t in EMBED_TEXTS] == ref["text_tokens"]
        vectors = engine.embed(EMBED_TEXTS)
    finally:
        engine.close()
    assert vectors.shape == (len(EMBED_TEXTS), 256) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    assert (_cosines(vectors, ref["text_embeddings"]) >= MIN_COSINE).all()


@pytest.mark.parametrize("name", sorted(set(CASES) - set(ENCODERS)))
def test_decoding_token_by_token_matches_the_batch(name, model_dir, float32_products):
    """The decode path of each family (single-token kernels, the cache, the sliding windows at
    positions past them) gives the logits the batch gave, to float32 rounding."""
    model = Model.load(write_model(name, "F16", model_dir), LoadConfig(n_ctx=CASES[name].n_ctx))
    try:
        batch = _log_softmax(model.decode(Batch(TOKENS, pos=0, logits=True)))
        model.kv.seq_rm(0, -1, -1)
        model.decode(Batch(TOKENS[:72], pos=0, logits=False))
        steps = [_log_softmax(model.decode(Batch([t], pos=72 + i))) for i, t in
                 enumerate(TOKENS[72:])]
    finally:
        model.close()
    np.testing.assert_allclose(np.concatenate(steps), batch[72:], atol=2e-3)


# ----------------------------------------------------------------------------- family metadata


def _hparams(arch: str, **keys):
    """The checked hyperparameters of a header with `keys` (under `{arch}.`) and 2 layers."""
    metadata = {"general.architecture": arch, f"{arch}.block_count": 2,
                f"{arch}.embedding_length": 256, f"{arch}.attention.head_count": 4,
                f"{arch}.feed_forward_length": 512,
                **{f"{arch}.{k}": v for k, v in keys.items()}}
    tensors = {"token_embd.weight": SimpleNamespace(shape=(512, 256))}
    return read_hparams(SimpleNamespace(metadata=metadata, tensors=tensors))


def test_sliding_windows_only_where_llama_cpp_has_them():
    assert _hparams("llama", **{"attention.sliding_window": 8}).n_swa == 0  # Mistral's files
    assert _hparams("phi3", **{"attention.sliding_window": 8}).n_swa == 0  # turned off
    gemma2 = _hparams("gemma2")
    assert gemma2.n_swa == 4096 and gemma2.swa_layers == (True, False)
    assert _hparams("olmo2").swa_layers == ()


def test_rope_and_granite_metadata_errors_name_the_key():
    with pytest.raises(ModelMetadataError, match=r"llama\.rope\.scaling\.type .*'dynamic'"):
        _hparams("llama", **{"rope.scaling.type": "dynamic"})
    with pytest.raises(ModelMetadataError, match=r"granite\.logit_scale"):
        _hparams("granite")
    with pytest.raises(ModelMetadataError, match=r"gemma2\.attn_logit_softcapping = 0"):
        _hparams("gemma2", attn_logit_softcapping=0.0)


def test_longrope_factors_follow_the_context_size(model_dir):
    """llama.cpp rounds the context up to 256 cells before comparing it with the original
    context (256 in the phi3 recipe): 256 cells take the short factors, 257 the long ones."""
    path = write_model("phi3", "F16", model_dir)
    for n_ctx, which in ((256, "short"), (257, "long")):
        model = Model.load(path, LoadConfig(n_ctx=n_ctx))
        try:
            want = model.gguf.tensors[f"rope_factors_{which}.weight"].dequantize()
            assert all(np.array_equal(r.freq_factors, want) for r in model.layer_rope)
        finally:
            model.close()


def _gemma4_keys(**changes):
    keys = {"attention.sliding_window": 8, "attention.sliding_window_pattern": [True, False],
            "attention.layer_norm_rms_epsilon": 1e-6, "embedding_length_per_layer_input": 0,
            "attention.key_length": 128, "attention.value_length": 128,
            "attention.key_length_swa": 64, "attention.value_length_swa": 64}
    keys.update(changes)
    return {k: v for k, v in keys.items() if v is not None}


def test_gemma4_metadata():
    """Per-layer KV heads and FFN widths, the sliding layers' head size, which layers reuse
    which cache; what llama.cpp cannot run is refused naming the key."""
    hp = _hparams("gemma4", **_gemma4_keys(**{
        "block_count": 4, "attention.sliding_window_pattern": [True, False, True, False],
        "attention.head_count_kv": [2, 1, 2, 1], "feed_forward_length": [512, 512, 1024, 1024],
        "attention.shared_kv_layers": 2}))
    assert hp.n_head_kv == 2 and hp.n_ff == 1024 and hp.kq_scale == 1.0
    assert hp.extra["n_head_kv"] == (2, 1, 2, 1) and hp.extra["n_ff"] == (512, 512, 1024, 1024)
    assert hp.extra["kv_source"] == (0, 1, 0, 1)
    arch = ARCHITECTURES["gemma4"].load()
    assert [arch.kv_shape(hp, il) for il in range(4)] == [(2, 64, 64), (1, 128, 128)] * 2
    key = r"gemma4\.attention\."
    for keys, error in (
            ({"attention.sliding_window_pattern": 2}, key + "sliding_window_pattern"),
            ({"attention.key_length_swa": None}, key + "key_length_swa"),
            ({"attention.shared_kv_layers": 1}, key + "shared_kv_layers = 1: at least 2"),
            ({"block_count": 3, "attention.sliding_window_pattern": [False, True, True],
              "attention.shared_kv_layers": 1}, key + "shared_kv_layers .*other kind"),
            ({"attention.head_count_kv": [4, 3]}, "cannot share 3 KV heads on layer 1")):
        with pytest.raises(ModelMetadataError, match=error):
            _hparams("gemma4", **_gemma4_keys(**keys))
