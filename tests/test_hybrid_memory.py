"""The memory of hybrid models (inference/recurrent.py) on the synthetic Qwen 3.5 model: each
sequence keeps its own recurrent states, a batch that fails leaves them as they were, a cached
prefix is reused only where a state was saved (the live one or a checkpoint) and then gives the
logits a fresh run of the whole conversation gives, and the scheduler's slots and chat turns go
through it."""
import queue

import numpy as np
import pytest
from llamatui.inference import LoadConfig
from llamatui.inference.engine import Engine
from llamatui.inference.model import Batch, Model
from llamatui.inference.recurrent import HybridCache
from llamatui.inference.sampling import SamplingParams
from synthetic_models import CASES, write_model

TOKENS = CASES["qwen35"].tokens
ATOL = 2e-3  # float32 rounding of a batch against single tokens (test_archs' decode test)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


@pytest.fixture(scope="module")
def qwen35_path(tmp_path_factory):
    return write_model("qwen35", "F16", tmp_path_factory.mktemp("hybrid"))


@pytest.fixture
def model(qwen35_path):
    m = Model.load(qwen35_path, LoadConfig(n_ctx=512, n_parallel=2))
    yield m
    m.close()


def test_the_memory_is_hybrid(model):
    assert isinstance(model.kv, HybridCache)
    assert model.kv.recurrent.layers == (0, 1, 2)  # full_attention_interval 4
    assert model.kv.k[0] is None and model.kv.k[3] is not None
    assert not model.kv.can_shift


def test_two_sequences_in_one_batch_keep_their_own_states(model, float32_products):
    a, b = TOKENS[:40], TOKENS[100:130]
    alone = [_log_softmax(model.logits_for(ids, seq_id=0)) for ids in (a, b)]
    model.kv.clear()
    both = model.decode(Batch(a + b, pos=list(range(40)) + list(range(30)),
                              seq_ids=[0] * 40 + [1] * 30, logits=True))
    np.testing.assert_allclose(_log_softmax(both[:40]), alone[0], atol=ATOL)
    np.testing.assert_allclose(_log_softmax(both[40:]), alone[1], atol=ATOL)
    # then each goes on by itself, token by token, from its own state
    for seq, ids, n in ((0, TOKENS[:45], 40), (1, TOKENS[100:135], 30)):
        steps = [model.decode(Batch([t], pos=n + i, seq_ids=seq))[0]
                 for i, t in enumerate(ids[n:])]
        fresh = _log_softmax(Model.logits_for(model, ids, seq_id=seq))[n:]
        np.testing.assert_allclose(_log_softmax(np.array(steps)), fresh, atol=ATOL)


def test_a_state_goes_back_only_to_a_checkpoint(model):
    model.decode(Batch(TOKENS[:50], pos=0, logits=False))  # a checkpoint at 50
    model.decode(Batch(TOKENS[50:51], pos=50))  # one token: none at 51
    kv = model.kv
    assert kv.reusable_prefix(0, 51) == 51 and kv.reusable_prefix(0, 50) == 50
    assert kv.reusable_prefix(0, 49) == 0
    assert not kv.seq_rm(0, 30, -1) and kv.seq_pos_max(0) == 50  # refused, nothing changed
    assert not kv.seq_rm(0, 10, 20)  # nor the middle
    assert kv.seq_rm(0, 50, -1) and kv.seq_pos_max(0) == 49 and kv.n_past[0] == 50
    with pytest.raises(ValueError, match="recurrent state holds positions"):
        model.decode(Batch(TOKENS[60:61], pos=60))


def test_a_failed_batch_leaves_the_states_as_they_were(model, monkeypatch):
    model.decode(Batch(TOKENS[:20], pos=0, logits=False))
    before = {il: s[0].copy() for il, s in model.kv.ssm.items()}
    arch = model.arch

    def failing(ctx, il, L, h):
        raise RuntimeError("boom")
    monkeypatch.setattr(arch, "gated_attention", failing)
    with pytest.raises(RuntimeError):
        model.decode(Batch(TOKENS[20:30], pos=20))
    assert model.kv.n_past[0] == 20 and model.kv.seq_pos_max(0) == 19
    assert all(np.array_equal(model.kv.ssm[il][0], before[il]) for il in before)


def _delta_rule_reference(q, k, v, g, beta, state):
    """The gated delta rule in float64, token by token, S[i][j] kept as state[h, j, i]."""
    s = state.astype(np.float64)
    out = np.empty(v.shape)
    for t in range(v.shape[0]):
        for h in range(v.shape[1]):
            kk, qq = k[t, h % k.shape[1]], q[t, h % q.shape[1]]
            s[h] *= np.exp(g[t, h])
            d = (v[t, h] - s[h] @ kk) * beta[t, h]
            s[h] += np.outer(d, kk)
            out[t, h] = s[h] @ qq / np.sqrt(v.shape[2])
    return out, s


def test_the_delta_net_kernels_follow_their_definitions():
    from llamatui.inference.cpu.delta_net import gated_delta_net, ssm_conv
    rng = np.random.default_rng(5)
    n, s = 7, 16
    q, k = (rng.standard_normal((n, 2, s)).astype(np.float32) / 4 for _ in "qk")
    v = rng.standard_normal((n, 4, s)).astype(np.float32)
    g = -rng.uniform(0, 1, (n, 4)).astype(np.float32)
    beta = rng.uniform(0, 1, (n, 4)).astype(np.float32)
    state = rng.standard_normal((4, s, s)).astype(np.float32)
    want, want_state = _delta_rule_reference(q, k, v, g, beta, state)
    split = state.copy()  # 3 tokens, then 4: the state carries on
    got = np.concatenate([gated_delta_net(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], split)
                          for a, b in ((0, 3), (3, n))])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(split, want_state, rtol=1e-4, atol=1e-4)

    conv_state = rng.standard_normal((6, 3)).astype(np.float32)
    x = rng.standard_normal((n, 6)).astype(np.float32)
    taps = rng.standard_normal((6, 4)).astype(np.float32)
    window = np.concatenate([conv_state, x.T], axis=1)
    out, new_state = ssm_conv(conv_state, x, taps)
    np.testing.assert_allclose(out, [(window[:, t:t + 4] * taps).sum(1) for t in range(n)],
                               rtol=1e-5, atol=1e-6)
    assert np.array_equal(new_state, window[:, -3:])
    _, short = ssm_conv(conv_state, x[:2], taps)  # fewer new inputs than the state holds
    assert np.array_equal(short, window[:, 2:5])


# ----------------------------------------------------------------------------- the scheduler


@pytest.fixture(scope="module")
def engine(qwen35_path):
    with Engine.load(qwen35_path, LoadConfig(n_ctx=1024, n_parallel=2)) as e:
        yield e


def _request(engine, prompt, max_tokens, n_probs=5):
    got = queue.SimpleQueue()
    engine.scheduler.add_request(prompt, SamplingParams(temperature=0, max_tokens=max_tokens),
                                 got.put, n_probs=n_probs)
    while engine.scheduler.has_work():
        engine.scheduler.step()
    events = [got.get() for _ in range(got.qsize())]
    prompt_event = next(e for e in events if e.kind == "prompt")
    return prompt_event, [e for e in events if e.kind == "token"]


def _matches_fresh_run(engine, prompt, token_event):
    row = _log_softmax(engine.logits(prompt)[-1])
    assert token_event.token_id == int(row.argmax())
    for token, logprob in token_event.top_logprobs:
        assert logprob == pytest.approx(row[token], abs=ATOL)


@pytest.mark.parametrize("n_kept", [8, 3])
def test_a_chats_second_turn_reuses_the_first(engine, n_kept, float32_products):
    """Turn 2 = turn 1 + its reply (all of it: the live state; 3 tokens of it: the checkpoint
    at the end of turn 1's prompt) + a new message: it starts from the saved state and gives
    the logits of a fresh run of the whole conversation."""
    engine.reset()
    first = TOKENS[:120]
    _, reply = _request(engine, first, max_tokens=8)
    second = first + [e.token_id for e in reply][:n_kept] + TOKENS[200:240]
    prompt, tokens = _request(engine, second, max_tokens=1)
    want = len(first) + 7 if n_kept == 8 else len(first)  # the 8th reply token was not decoded
    assert prompt.n_reused == want
    _matches_fresh_run(engine, second, tokens[0])


def test_a_prefix_without_a_saved_state_is_computed_again(engine, float32_products):
    engine.reset()
    _request(engine, TOKENS[:120], max_tokens=2)
    second = TOKENS[:100] + TOKENS[250:280]  # shares 100 tokens, but no state was saved there
    prompt, tokens = _request(engine, second, max_tokens=1)
    assert prompt.n_reused == 0
    _matches_fresh_run(engine, second, tokens[0])


def test_parallel_slots_each_keep_their_state(engine, float32_products):
    prompts = [TOKENS[:60], TOKENS[150:230]]
    alone = []
    for p in prompts:
        for slot in engine.scheduler.slots:  # nothing cached
            slot.tokens.clear()
        engine.model.kv.clear()
        alone.append(_request(engine, p, max_tokens=6)[1])
    for slot in engine.scheduler.slots:
        slot.tokens.clear()
    engine.model.kv.clear()
    outs = [queue.SimpleQueue() for _ in prompts]
    for p, q in zip(prompts, outs):
        engine.scheduler.add_request(p, SamplingParams(temperature=0, max_tokens=6), q.put,
                                     n_probs=2)
    while engine.scheduler.has_work():
        engine.scheduler.step()
    for solo, q in zip(alone, outs):
        together = [e for e in (q.get() for _ in range(q.qsize())) if e.kind == "token"]
        assert {e.slot for e in together} <= {0, 1}
        for a, b in zip(solo, together):
            assert a.logprob == pytest.approx(b.logprob, abs=ATOL)
            if a.token_id != b.token_id:  # only a near-tie may flip
                (_, lp1), (_, lp2) = a.top_logprobs[:2]
                assert lp1 - lp2 < 0.05
                break


# ----------------------------------------------------------------------------- metadata


def _qwen35_hparams(**keys):
    """The checked hyperparameters of a Qwen 3.5 header: the recipe's keys, `keys` replacing
    them (None: left out)."""
    from types import SimpleNamespace

    from llamatui.inference.hparams import read_hparams
    recipe = CASES["qwen35"].recipe(np.random.default_rng(0))
    metadata = {"general.architecture": "qwen35", **recipe.metadata}
    for k, v in keys.items():
        metadata.pop(f"qwen35.{k}", None)
        if v is not None:
            metadata[f"qwen35.{k}"] = v
    tensors = {"token_embd.weight": SimpleNamespace(shape=(512, 256))}
    return read_hparams(SimpleNamespace(metadata=metadata, tensors=tensors))


def test_qwen35_metadata():
    hp = _qwen35_hparams()
    assert hp.extra["recurrent"] == (True, True, True, False)
    assert hp.extra["ssm"]["state_size"] == 64
    assert _qwen35_hparams(full_attention_interval=2).extra["recurrent"] == (
        True, False, True, False)
    # a multi-token prediction block comes last, counted in block_count, and is not run
    mtp = _qwen35_hparams(block_count=5, nextn_predict_layers=1)
    assert mtp.n_layer == 4 and mtp.extra["recurrent"] == (True, True, True, False)


@pytest.mark.parametrize("key,value,match", [
    ("ssm.inner_size", 100, r"qwen35\.ssm\.inner_size = 100"),
    ("ssm.conv_kernel", None, r"qwen35\.ssm\.conv_kernel"),
    ("ssm.group_count", 3, r"qwen35\.ssm\.time_step_rank = 4 is not a multiple"),
    ("rope.dimension_sections", [0, 0, 0, 4], r"qwen35\.rope\.dimension_sections"),
    ("full_attention_interval", 0, r"qwen35\.full_attention_interval"),
])
def test_bad_qwen35_metadata_names_the_key(key, value, match):
    from llamatui.inference.hparams import ModelMetadataError
    with pytest.raises(ModelMetadataError, match=match):
        _qwen35_hparams(**{key: value})


def test_one_slot_reuses_the_checkpoint_before_the_prompts_last_token(qwen35_path,
                                                                       float32_products):
    """With one slot the prompt's last token gets a step of its own (scheduler.py): the
    checkpoint is the state before it, and a second turn that keeps 3 tokens of the reply
    starts there."""
    with Engine.load(qwen35_path, LoadConfig(n_ctx=512, n_parallel=1)) as one:
        first = TOKENS[:90]
        _, reply = _request(one, first, max_tokens=6)
        second = first + [e.token_id for e in reply][:3] + TOKENS[150:170]
        prompt, tokens = _request(one, second, max_tokens=1)
        assert prompt.n_reused == len(first) - 1
        _matches_fresh_run(one, second, tokens[0])
