"""Greedy sampling where the logits are (Model.decode_tokens), from the scheduler's side, on the
CPU: which samplers may skip the host's logits (Sampler.argmax_only), and what the scheduler
does with the token ids a device hands back. The device kernel itself is checked under the
simulator (cuda_checks.py's greedy_tokens, test_cuda_kernels.py) and the offloaded generation in
cuda_backend_checks.py's offload_greedy_on_device."""
import numpy as np
import pytest

from cuda_backend_checks import PROMPT, tiny_model
from llamatui.inference import Engine, LoadConfig
from llamatui.inference.model import Model
from llamatui.inference.sampling import Sampler, SamplingParams, all_finite
from llamatui.inference.scheduler import NonFiniteLogitsError


@pytest.mark.parametrize("params, argmax_only", [
    ({"temperature": 0.0}, True),
    ({"temperature": -1.0, "top_k": 0, "top_p": 0.5}, True),
    ({"temperature": 0.8, "top_k": 1}, True),
    ({"temperature": 0.8, "top_k": 1, "typical_p": 0.5}, True),
    ({"temperature": 0.0, "typical_p": 0.5}, False),  # typical may drop the best token
    ({"temperature": 0.8}, False),
    ({"temperature": 0.0, "logit_bias": {3: 1.0}}, False),
    ({"temperature": 0.0, "repeat_penalty": 1.1}, False),
    ({"temperature": 0.0, "presence_penalty": 0.5}, False),
    ({"temperature": 0.0, "repeat_penalty": 1.1, "repeat_last_n": 0}, True),  # no window
])
def test_argmax_only_samplers_answer_the_argmax(params, argmax_only):
    sampler = Sampler(SamplingParams(seed=1, **params), 300)
    assert sampler.argmax_only is argmax_only
    rng = np.random.default_rng(4)
    for _ in range(20):
        row = rng.standard_normal(300).astype(np.float32)
        row[rng.integers(0, 300, 3)] = row.max() + 1.0  # tied maxima: the lowest id
        token = sampler.sample(row)
        if argmax_only:
            assert token == int(np.argmax(row))
        sampler.accept(token)


def _host_tokens(model):
    """decode_tokens computed from the host's logits (what the device kernel returns)."""
    def decode_tokens(batch):
        logits = model.decode(batch)
        return np.array([np.argmax(r) if all_finite(r) else -1 for r in logits], np.int32)
    return decode_tokens


def _engine(monkeypatch, on_device):
    engine = Engine.load(tiny_model("llama"), LoadConfig(n_ctx=64, warmup=False))
    asked = []
    if on_device is not None:
        monkeypatch.setattr(Model, "samples_greedy", property(lambda self: True))
        run = on_device(engine.model)
        engine.model.decode_tokens = lambda batch: asked.append(batch) or run(batch)
    return engine, asked


def test_greedy_steps_take_the_device_tokens(monkeypatch):
    host, _ = _engine(monkeypatch, None)
    want = "".join(e.text for e in host.generate(PROMPT, temperature=0.0, max_tokens=6))
    host.close()
    engine, asked = _engine(monkeypatch, _host_tokens)
    try:
        got = "".join(e.text for e in engine.generate(PROMPT, temperature=0.0, max_tokens=6))
        assert got == want and len(asked) == 6
        asked.clear()
        list(engine.generate(PROMPT, temperature=0.0, repeat_penalty=1.2, max_tokens=3))
        assert asked == []  # the penalties need the logits on the host
    finally:
        engine.close()


def test_a_device_token_for_non_finite_logits_ends_the_request(monkeypatch):
    def broken(model):
        return lambda batch: np.full(batch.n_outputs, -1, np.int32)
    engine, asked = _engine(monkeypatch, broken)
    try:
        with pytest.raises(NonFiniteLogitsError, match="non-finite logits"):
            list(engine.generate(PROMPT, temperature=0.0, max_tokens=3))
        assert len(asked) == 1
    finally:
        engine.close()
