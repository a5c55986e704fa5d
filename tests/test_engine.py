"""The engine API as the app and the server use it, on the real SmolLM2 model."""
import threading

import pytest

from llamatui.inference import ChatTemplateError, ContextFullError, Engine, LoadConfig


@pytest.fixture(scope="module")
def engine(smollm2_path):
    with Engine.load(smollm2_path, LoadConfig(n_ctx=256, threads=2)) as e:
        yield e


def _text(events):
    events = list(events)
    assert events[-1].kind == "done"
    return "".join(e.text for e in events), events


def test_info(engine):
    info = engine.info
    assert (info.architecture, info.quantization, info.n_layer) == ("llama", "Q4_1", 30)
    assert info.n_ctx == 256 and info.n_ctx_train == 8192 and info.n_vocab == 49152
    assert info.n_params == 134_515_008 and info.kv_bytes > 0


def test_greedy_matches_llama_cpp(engine, golden_smollm2):
    run = next(r for r in golden_smollm2["greedy"] if r["prompt"] == "1, 2, 3, 4, 5,")
    text, events = _text(engine.generate(run["prompt"], temperature=0,
                                         max_tokens=len(run["tokens"])))
    tokens = [e.token_id for e in events if e.kind == "token"]
    # Greedy paths may part where two tokens are nearly tied; in this run every step is decided
    # by more than 2.8 nats (see tests/test_forward.py for the step-by-step comparison).
    assert tokens[:10] == run["tokens"][:10]
    assert text.startswith(run["content"][:20])


def test_same_seed_same_text(engine):
    kw = dict(temperature=0.9, seed=42, max_tokens=24)
    a, _ = _text(engine.generate("Once upon a time", **kw))
    b, _ = _text(engine.generate("Once upon a time", **kw))
    c, _ = _text(engine.generate("Once upon a time", **{**kw, "seed": 7}))
    assert a == b and a != c


def test_events_report_speed_and_cache(engine):
    _, events = _text(engine.generate("Hello there", temperature=0, max_tokens=5))
    prompt = events[0]
    assert prompt.kind == "prompt" and prompt.n_prompt == len(engine.tokenize("Hello there"))
    assert prompt.prompt_tps > 0
    tokens = [e for e in events if e.kind == "token"]
    assert len(tokens) == 5 and all(e.gen_tps > 0 and e.kv_total == 256 for e in tokens)
    assert [e.kv_used for e in tokens] == sorted(e.kv_used for e in tokens)
    assert events[-1].finish_reason == "length" and events[-1].n_generated == 5


def test_chat_turn_reuses_cached_prefix(engine):
    messages = [{"role": "user", "content": "What is 2+2?"}]
    reply, events = _text(engine.generate(messages, temperature=0, max_tokens=8))
    assert events[0].n_reused == 0 or events[0].n_reused < events[0].n_prompt
    messages += [{"role": "assistant", "content": reply},
                 {"role": "user", "content": "And 3+3?"}]
    _, events = _text(engine.generate(messages, temperature=0, max_tokens=4))
    first_turn = len(engine.prompt_tokens(messages[:1]))
    assert events[0].n_reused >= first_turn  # only the new turn was evaluated


def test_stop_string(engine):
    text, events = _text(engine.generate("1, 2, 3, 4, 5,", temperature=0, max_tokens=40,
                                         stop=[" 8"]))
    assert events[-1].finish_reason == "stop"
    assert " 8" not in text and text.strip().startswith("6")


def test_cancel_from_another_thread(engine):
    seen = []
    timer = None
    for event in engine.generate("Once upon a time, there was a dragon", temperature=0.7, seed=1,
                                 max_tokens=200):
        seen.append(event)
        if event.kind == "token" and timer is None:
            timer = threading.Timer(0.0, engine.cancel)
            timer.start()
            timer.join()
    assert seen[-1].finish_reason == "cancelled" and seen[-1].n_generated < 200


def test_unknown_sampling_option(engine):
    with pytest.raises(ValueError, match="unknown sampling option.*temprature"):
        list(engine.generate("x", temprature=0.5))


def test_logits_shape(engine):
    ids = engine.tokenize("The quick brown fox")
    out = engine.logits(ids)
    assert out.shape == (len(ids), 49152)
    assert engine.detokenize(ids) == "The quick brown fox"


def test_context_policies(smollm2_path):
    long_prompt = "one two three four five six seven eight nine ten " * 12  # > 64 tokens
    with Engine.load(smollm2_path, LoadConfig(n_ctx=64, threads=2, context_policy="error",
                                              warmup=False)) as e:
        with pytest.raises(ContextFullError, match="context holds 64"):
            list(e.generate(long_prompt, max_tokens=4))
        # a short prompt that fills the context while generating stops cleanly
        _, events = _text(e.generate("Count: 1, 2, 3,", temperature=0, max_tokens=200))
        assert events[-1].finish_reason == "context_full" and events[-1].kv_used <= 64
    with Engine.load(smollm2_path, LoadConfig(n_ctx=64, threads=2, context_policy="shift", n_keep=4,
                                              warmup=False)) as e:
        _, events = _text(e.generate(long_prompt, temperature=0, max_tokens=4))
        assert events[0].n_prompt < 64 and events[-1].n_generated == 4
        _, events = _text(e.generate("Count: 1, 2, 3,", temperature=0, max_tokens=150))
        assert events[-1].finish_reason == "length" and events[-1].n_generated == 150
        assert all(ev.kv_used <= 64 for ev in events)


def test_gemma_without_template_chats_in_gemma_turns(gemma3_path):
    # Gemma 3 270M has no chat template; its vocabulary has <start_of_turn>, so it is prompted
    # with llama.cpp's built-in "gemma" template (llama.cpp itself would use ChatML), and a
    # reply ends at its end-of-generation token <end_of_turn>, which never shows in the text.
    question = [{"role": "user", "content": "What is the capital of France?"}]
    with Engine.load(gemma3_path, LoadConfig(n_ctx=256, threads=2, warmup=False)) as e:
        assert e.template.name == "gemma" and e.template.origin == "vocabulary"
        assert e.apply_chat_template(question) == \
            "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n" \
            "<start_of_turn>model\n"
        # the starter is a base model that seldom ends a turn by itself: make it end at once
        end_of_turn = e.tokenizer.token_to_id("<end_of_turn>")
        text, events = _text(e.generate(question, temperature=0, max_tokens=20,
                                        logit_bias={end_of_turn: 100.0}))
        assert events[-1].finish_reason == "eog" and events[-1].n_generated == 1 and text == ""
        # In ChatML, as llama.cpp 0.6.0 speaks to it, the model can only write <|im_end|> as
        # text (no such token in its vocabulary): the engine stops there
        e.set_chat_template("chatml")
        assert e.tokenizer.token_to_id("<|im_end|>") is None
        text, events = _text(e.generate(question, temperature=0, max_tokens=120))
        assert events[-1].finish_reason == "stop" and "<|im_end|>" not in text
        assert events[-1].n_generated < 120


def test_a_broken_template_does_not_stop_the_model(smollm2_path):
    broken = "{% for m in messages %}{{ m.content"
    with Engine.load(smollm2_path, LoadConfig(n_ctx=64, threads=2, warmup=False,
                                              chat_template=broken)) as e:
        text, events = _text(e.generate("The capital of France is", temperature=0,
                                        max_tokens=3))
        assert events[-1].n_generated == 3
        with pytest.raises(ChatTemplateError, match="does not compile"):
            list(e.generate([{"role": "user", "content": "Hi"}], max_tokens=3))
        e.set_chat_template(None)  # back to the model's own
        assert e.apply_chat_template([{"role": "user", "content": "Hi"}]).endswith(
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
