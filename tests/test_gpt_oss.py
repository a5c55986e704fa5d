"""What gpt-oss adds to the engine, piece by piece (tests/test_archs.py compares whole synthetic
gpt-oss models with llama.cpp): attention sinks on every CPU attention path, the clamped SwiGLU,
SOFTMAX_WEIGHT routing, and the family's metadata checks."""
from types import SimpleNamespace

import numpy as np
import pytest

from llamatui.inference.archs import moe
from llamatui.inference.cpu import attention, ops
from llamatui.inference.hparams import ModelMetadataError, read_hparams


def _attention_with_sinks_f64(q, k, v, mask, scale, sinks):
    """softmax over [q·k·scale + mask, sink] per head, the sink's share weighing nothing."""
    n, n_head, _ = q.shape
    grp = n_head // k.shape[1]
    out = np.empty((n, n_head, v.shape[2]))
    for h in range(n_head):
        s = q[:, h].astype(np.float64) @ k[:, h // grp].astype(np.float64).T * scale + mask
        top = np.maximum(s.max(axis=1, keepdims=True), sinks[h])
        p = np.exp(s - top)
        out[:, h] = p @ v[:, h // grp] / (p.sum(axis=1, keepdims=True) + np.exp(sinks[h] - top))
    return out.reshape(n, -1)


@pytest.mark.parametrize("n,d,n_kv", [(1, 16, 30), (3, 64, 30), (2, 64, 700), (3, 24, 30),
                                       (20, 16, 30), (20, 24, 30)])
@pytest.mark.parametrize("f16", [False, True])
def test_attention_sinks_on_every_cpu_path(n, d, n_kv, f16):
    """The decode kernel (one piece, and a long cache in pieces merged), its fallback for odd
    head sizes, the GEMM path and the numpy path, each with one sink logit per head (some large
    enough to take most of the weight) against a float64 reference; and without sinks each is
    what it was."""
    rng = np.random.default_rng(n * 1000 + d)
    n_head, n_head_kv = 8, 2
    q = rng.standard_normal((n, n_head, d)).astype(np.float32)
    k = rng.standard_normal((n_kv, n_head_kv, d)).astype(np.float32)
    v = rng.standard_normal((n_kv, n_head_kv, d)).astype(np.float32)
    sinks = (rng.standard_normal(n_head) * 2).astype(np.float32)
    sinks[0] = 6.0
    mask = attention.build_kq_mask(np.arange(n_kv, dtype=np.int32), np.ones((n_kv, 1), bool),
                                   np.arange(n_kv - n, n_kv), np.zeros(n, np.int64), n_kv,
                                   n_swa=8 if n_kv < 100 else 400)
    if f16:
        k, v = k.astype(np.float16).astype(np.float32), v.astype(np.float16).astype(np.float32)
        kv = ops.f32_to_f16_bits(k), ops.f32_to_f16_bits(v)
    else:
        kv = k, v
    got = attention.attention(q, *kv, mask, 0.125, sinks=sinks)
    np.testing.assert_allclose(got, _attention_with_sinks_f64(q, k, v, mask, 0.125, sinks),
                               atol=2e-6)
    no_sinks = np.full(n_head, -np.inf, np.float32)  # exp(-inf) = 0: the plain softmax
    np.testing.assert_allclose(attention.attention(q, *kv, mask, 0.125),
                               _attention_with_sinks_f64(q, k, v, mask, 0.125, no_sinks),
                               atol=2e-6)


def test_attention_refuses_sinks_of_the_wrong_size():
    q = np.zeros((1, 4, 16), np.float32)
    kv = np.zeros((3, 2, 16), np.float32)
    with pytest.raises(ValueError, match=r"sinks of shape \(2,\) for 4 heads"):
        attention.attention(q, kv, kv, np.zeros((1, 3), np.float32), 0.25,
                            sinks=np.zeros(2, np.float32))


def test_swiglu_oai_is_ggmls_clamped_form():
    """ggml_compute_forward_swiglu_oai_f32: x = min(gate, 7), y = clamp(up, -7, 7),
    x · sigmoid(1.702 x) · (y + 1), on a prompt's worth of values (threads) and a token's."""
    rng = np.random.default_rng(3)
    for n in (1, 300):
        gate = (rng.standard_normal((n, 96)) * 6).astype(np.float32)
        up = (rng.standard_normal((n, 96)) * 6).astype(np.float32)
        gate[0, :4] = up[0, :4] = [7.5, -7.5, 7.0, -100.0]
        x = np.minimum(gate.astype(np.float64), 7.0)
        y = np.clip(up.astype(np.float64), -7.0, 7.0)
        want = x / (1 + np.exp(-1.702 * x)) * (y + 1)
        np.testing.assert_allclose(ops.swiglu_oai(gate, up, 1.702, 7.0), want, rtol=1e-5,
                                   atol=1e-6)


def test_softmax_weight_routing_softmaxes_the_chosen_logits():
    """LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT: the top logits, then a softmax over those
    alone (not over every expert's probability as the softmax gating)."""
    logits = np.array([[0.5, 3.0, -1.0, 2.0], [1.0, 1.0, 4.0, -2.0]], np.float32)
    chosen, weights = moe.route(logits, 2, False, "softmax_weight")
    np.testing.assert_array_equal(chosen, [[1, 3], [2, 0]])
    top = np.take_along_axis(logits, chosen, axis=1).astype(np.float64)
    want = np.exp(top) / np.exp(top).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(weights, want, rtol=1e-6)
    softmax_chosen, softmax_weights = moe.route(logits, 2, False)
    np.testing.assert_array_equal(softmax_chosen, chosen)
    assert (softmax_weights.sum(axis=1) < 1).all()  # shares of all four experts
    with pytest.raises(ValueError, match="gating 'sigmoid'"):
        moe.route(logits, 2, False, "sigmoid")


def _gpt_oss_hparams(**keys):
    arch = "gpt-oss"
    metadata = {"general.architecture": arch, f"{arch}.block_count": 4,
                f"{arch}.embedding_length": 256, f"{arch}.attention.head_count": 8,
                f"{arch}.attention.head_count_kv": 2, f"{arch}.attention.key_length": 64,
                f"{arch}.feed_forward_length": 256, f"{arch}.expert_count": 4,
                f"{arch}.expert_used_count": 2, f"{arch}.expert_feed_forward_length": 256,
                f"{arch}.attention.sliding_window": 128,
                **{f"{arch}.{k}": v for k, v in keys.items()}}
    metadata = {k: v for k, v in metadata.items() if v is not None}
    tensors = {"token_embd.weight": SimpleNamespace(shape=(512, 256))}
    return read_hparams(SimpleNamespace(metadata=metadata, tensors=tensors))


def test_gpt_oss_hyperparameters_follow_llama_cpp():
    hp = _gpt_oss_hparams(**{"rope.freq_base": 150000.0, "rope.scaling.type": "yarn",
                             "rope.scaling.factor": 32.0})
    assert hp.swa_layers == (True, False, True, False) and hp.n_swa == 128
    assert hp.rope_freq_base_swa == 150000.0  # the global base unless the file has its own
    assert hp.rope_freq_scale_swa == hp.rope_freq_scale == 1 / 32
    assert hp.kq_scale == 1 / 8 and hp.rope_neox
    assert _gpt_oss_hparams(**{"rope.freq_base_swa": 5000.0}).rope_freq_base_swa == 5000.0
    assert _gpt_oss_hparams(**{"attention.sliding_window_pattern": 3}).swa_layers == (
        True, True, False, True)


@pytest.mark.parametrize("key", ["attention.sliding_window", "expert_feed_forward_length"])
def test_gpt_oss_metadata_it_needs_is_named(key):
    with pytest.raises(ModelMetadataError, match=rf"lacks gpt-oss\.{key}"):
        _gpt_oss_hparams(**{key: None})
