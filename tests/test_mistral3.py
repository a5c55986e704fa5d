"""mistral3's own metadata (Ministral 3: YaRN's betas and log multiplier, Llama 4's attention
temperature) read as llama.cpp's llama_model_mistral3::load_arch_hparams reads it, and checked.
Its logits against llama.cpp are tests/test_archs.py's (the mistral3 cases of
synthetic_models)."""
import math
from types import SimpleNamespace

import numpy as np
import pytest
from llamatui.inference.archs.mistral3 import attn_temperature
from llamatui.inference.hparams import ModelMetadataError, read_hparams


def _hparams(**keys):
    """The checked hyperparameters of a 2-layer mistral3 header with `keys` (under mistral3.)."""
    metadata = {"general.architecture": "mistral3", "mistral3.block_count": 2,
                "mistral3.embedding_length": 256, "mistral3.attention.head_count": 4,
                "mistral3.feed_forward_length": 512, "mistral3.context_length": 4096,
                **{f"mistral3.{k}": v for k, v in keys.items()}}
    tensors = {"token_embd.weight": SimpleNamespace(shape=(512, 256))}
    return read_hparams(SimpleNamespace(metadata=metadata, tensors=tensors))


YARN = {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0}


def test_temperature_floor_is_the_original_context():
    hp = _hparams(**{"attention.temperature_scale": 0.1,
                     "rope.scaling.original_context_length": 16})
    assert (hp.extra["attn_temp_scale"], hp.extra["attn_temp_floor"]) == (np.float32(0.1), 16)
    # without the key llama.cpp's n_ctx_orig_yarn is the training context
    assert _hparams(**{"attention.temperature_scale": 0.1}).extra["attn_temp_floor"] == 4096
    assert _hparams().extra["attn_temp_scale"] == 0.0


def test_temperature_scale_steps_with_each_original_context():
    scale = attn_temperature(np.array([0, 15, 16, 31, 32, 79]), 0.4, 16)
    want = [1.0 + 0.4 * math.log(k) for k in (1, 1, 2, 2, 3, 5)]
    np.testing.assert_allclose(scale, want, rtol=1e-6)
    assert scale.dtype == np.float32


def test_yarn_keys_reach_the_rope():
    rope = _hparams(**YARN, **{"rope.scaling.yarn_beta_fast": 8.0,
                               "rope.scaling.yarn_beta_slow": 0.5}).layer_rope(0)
    assert (rope.beta_fast, rope.beta_slow) == (8.0, 0.5)
    # log multiplier 1: transformers' mscale / mscale_all_dim = 1, so rope_yarn's magnitude
    # 1 + 0.1·ln 4 is divided out; without it the magnitude stays
    with_mul = _hparams(**YARN, **{"rope.scaling.yarn_log_multiplier": 1.0}).layer_rope(0)
    assert with_mul.mscale() == pytest.approx(1.0, rel=1e-6)
    assert _hparams(**YARN).layer_rope(0).mscale() == pytest.approx(1 + 0.1 * math.log(4),
                                                                    rel=1e-6)


@pytest.mark.parametrize("key,value", [
    ("rope.scaling.original_context_length", 0),  # llama.cpp: invalid n_ctx_orig_yarn
    ("attention.temperature_scale", -0.1),
    ("attention.temperature_scale", float("nan")),
    ("rope.scaling.yarn_beta_fast", 0.0),
    ("rope.scaling.yarn_beta_slow", -1.0),
    ("rope.scaling.yarn_log_multiplier", -1.0),
])
def test_bad_values_name_the_key(key, value):
    keys = {"attention.temperature_scale": 0.1, **YARN, key: value}
    with pytest.raises(ModelMetadataError, match=rf"mistral3\.{key.replace('.', '[.]')} = "):
        _hparams(**keys)


def test_experts_need_the_feed_forward_length():
    moe = {"expert_count": 8, "expert_used_count": 2}
    assert _hparams(**moe).n_ff_exp == 512  # llama.cpp sizes mistral3's experts by n_ff
    with pytest.raises(ModelMetadataError, match=r"mistral3\.feed_forward_length"):
        _hparams(**moe, feed_forward_length=0)
    with pytest.raises(ModelMetadataError, match=r"mistral3\.expert_used_count"):
        _hparams(expert_count=8)


@pytest.mark.parametrize("keys", [{"rope.dimension_count": 32}, {"attention.value_length": 32}])
def test_rope_must_turn_whole_heads(keys):
    with pytest.raises(ModelMetadataError, match=r"mistral3\.rope\.dimension_count = .*equal"):
        _hparams(**keys)
