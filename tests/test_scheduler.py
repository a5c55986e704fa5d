"""The scheduler of slots that Engine.generate and the server drive, on the real SmolLM2 model:
several requests decoded in one ragged batch give what each gives alone, prompts reuse a slot's
cached prefix, cancellation frees slots from any state, contexts shift per slot keeping BOS, and
the engine's edges (an abandoned generator, close, tiny contexts, non-finite logits)."""
import gc
import queue
import threading
import time

import numpy as np
import pytest

from llamatui.inference import LoadConfig
from llamatui.inference import (ContextFullError, Engine, EngineBusyError, EngineClosedError,
                                NonFiniteLogitsError, QueueFullError, SamplingParams)
from llamatui.inference.cpu.simd import HAS_INT8_DOT
from llamatui.inference.scheduler import SlotState


@pytest.fixture(scope="module")
def engine(smollm2_path):
    with Engine.load(smollm2_path, LoadConfig(n_ctx=1024, threads=2, n_parallel=4)) as e:
        yield e


def _run(sched, prompts, n_probs=0, **params):
    """Queues every prompt, steps until all are done; returns (texts, events per request)."""
    outs = [queue.SimpleQueue() for _ in prompts]
    reqs = [sched.add_request(p, SamplingParams(**params), q.put, n_probs=n_probs)
            for p, q in zip(prompts, outs)]
    while sched.has_work():
        sched.step()
    events = [[q.get() for _ in range(q.qsize())] for q in outs]
    assert all(r.done.is_set() for r in reqs)
    return ["".join(e.text for e in evs) for evs in events], events


def _tokens(events):
    return [e for e in events if e.kind == "token"]


def test_batched_slots_give_what_each_gives_alone(engine, float32_products):
    prompts = [engine.tokenize(t) for t in ("The capital of France is", "1, 2, 3, 4,",
                                            "def fibonacci(n):", "Roses are red,")]
    alone = [_tokens(_run(engine.scheduler, [p], n_probs=2, temperature=0, max_tokens=12)[1][0])
             for p in prompts]
    for slot in engine.scheduler.slots:  # nothing cached: every prompt is evaluated again
        slot.tokens.clear()
    _, events = _run(engine.scheduler, prompts, temperature=0, max_tokens=12)
    assert sorted(evs[-1].slot for evs in events) == [0, 1, 2, 3]  # all four ran at once
    assert all(evs[-1].finish_reason == "length" for evs in events)
    for solo, evs in zip(alone, events):
        batched = [e.token_id for e in _tokens(evs)]
        for step, (a, b) in enumerate(zip(solo, batched)):
            if a.token_id != b:  # a batch sums in another order: only a near-tie may flip
                (_, lp1), (_, lp2) = a.top_logprobs
                assert lp1 - lp2 < 0.05, f"step {step}: a decisive token changed"
                break


def test_sampled_requests_keep_their_own_seeds(engine):
    p = engine.tokenize("Once upon a time")
    kw = dict(temperature=0.9, max_tokens=16)
    texts, _ = _run(engine.scheduler, [p, p, p], **kw, seed=5)
    assert texts[0] == texts[1] == texts[2]
    again, _ = _run(engine.scheduler, [p], **kw, seed=5)
    assert again[0] == texts[0]


@pytest.mark.skipif(not HAS_INT8_DOT, reason="no packed 8-bit kernels on this CPU")
def test_a_request_samples_the_same_whatever_shares_its_steps(engine):
    """SmolLM2's matrices are all packed (Q4_1, Q8_0: matmul_packed), which compute every token on
    its own: a seeded request gets the very same tokens and log-probs alone, batched with other
    requests, and while another request's prompt is processed in its steps (batches of at most
    16 tokens here, so attention takes the per-token kernel throughout)."""
    sched = engine.scheduler
    p = engine.tokenize("Once upon a time")
    kw = dict(temperature=0.9, seed=11, max_tokens=20)

    def forget():
        for slot in sched.slots:
            slot.tokens.clear()

    def trace(events):
        return [(e.token_id, e.logprob) for e in _tokens(events)]

    forget()
    alone = trace(_run(sched, [p], n_probs=1, **kw)[1][0])
    forget()
    got = queue.SimpleQueue()
    sched.add_request(p, SamplingParams(**kw), got.put, n_probs=1)
    for text in ("Roses are red,", "Hi"):  # with A's prompt: 11 tokens in one step
        sched.add_request(engine.tokenize(text), SamplingParams(seed=3, max_tokens=30), lambda e: None)
    for _ in range(6):
        sched.step()
    late = sched.add_request(engine.tokenize("The quick brown fox jumps over"),
                             SamplingParams(max_tokens=4), lambda e: None)
    while sched.has_work():
        sched.step()
    assert late.done.is_set()
    assert trace([got.get() for _ in range(got.qsize())]) == alone


def test_new_request_reuses_the_slot_with_the_longest_prefix(engine):
    sched = engine.scheduler
    base = engine.tokenize("A long shared system prompt about the weather in Paris today. " * 3)
    _run(sched, [base + engine.tokenize(" First question?", add_special=False)],
         temperature=0, max_tokens=2)
    _, events = _run(sched, [base + engine.tokenize(" Second one?", add_special=False)],
                     temperature=0, max_tokens=2)
    assert events[0][0].kind == "prompt" and events[0][0].n_reused >= len(base)


def test_cancel_frees_queued_prefilling_and_generating_requests(smollm2_path):
    with Engine.load(smollm2_path, LoadConfig(n_ctx=512, threads=2, n_parallel=1,
                                              warmup=False)) as e:
        sched = e.scheduler
        long_prompt = e.tokenize("word " * 300)
        got = [queue.SimpleQueue() for _ in range(3)]
        gen = sched.add_request(e.tokenize("Hello"), SamplingParams(max_tokens=None), got[0].put)
        waiting = sched.add_request(long_prompt, SamplingParams(), got[1].put)
        sched.step()  # admits the first; the second waits for the one slot
        assert sched.n_queued() == 1
        sched.cancel(waiting)
        sched.step()
        assert waiting.done.is_set() and got[1].get().finish_reason == "cancelled"
        sched.cancel(gen)
        sched.step()
        assert gen.done.is_set()
        sched.n_batch = 64  # a prompt over several steps
        pre = sched.add_request(long_prompt, SamplingParams(), got[2].put)
        sched.step()
        assert sched.slots[0].state == SlotState.PROMPT
        sched.cancel(pre)
        sched.step()
        assert pre.done.is_set() and sched.slots[0].state == SlotState.IDLE
        assert not sched.has_work()


def test_context_shift_keeps_bos_and_the_slot_goes_on(gemma3_path):
    with Engine.load(gemma3_path, LoadConfig(n_ctx=64, threads=2, n_parallel=2, warmup=False)) as e:
        sched = e.scheduler
        bos = e.tokenizer.bos_id
        prompt = e.tokenize("Count: 1, 2, 3,")
        assert prompt[0] == bos
        _, events = _run(sched, [prompt, prompt], temperature=0, max_tokens=80)
        for evs in events:
            assert evs[-1].finish_reason == "length" and evs[-1].n_generated == 80
        assert all(s.tokens[0] == bos and len(s.tokens) <= s.n_ctx for s in sched.slots)


def test_oversized_prompt_is_refused_when_not_truncated(engine):
    long = engine.tokenize("word " * 400)  # a slot holds 1024 / 4 = 256
    with pytest.raises(ContextFullError) as err:
        engine.scheduler.add_request(long, SamplingParams(), print, truncate=False)
    assert (err.value.n_prompt, err.value.n_ctx) == (len(long), 256)


def test_bounded_queue(smollm2_path):
    with Engine.load(smollm2_path, LoadConfig(n_ctx=64, threads=2, warmup=False)) as e:
        sched = e.scheduler
        sched.max_queue = 1
        ids = e.tokenize("Hi")
        busy = sched.add_request(ids, SamplingParams(max_tokens=None), lambda ev: None)
        sched.step()
        sched.add_request(ids, SamplingParams(max_tokens=1), lambda ev: None)
        with pytest.raises(QueueFullError, match="--max-queue 1"):
            sched.add_request(ids, SamplingParams(max_tokens=1), lambda ev: None)
        sched.cancel(busy)
        while sched.has_work():
            sched.step()


def test_logprobs_are_the_raw_log_softmax(engine):
    ids = engine.tokenize("The capital of France is")
    got = queue.SimpleQueue()
    engine.scheduler.add_request(ids, SamplingParams(temperature=0, max_tokens=1), got.put,
                                 n_probs=3)
    while engine.scheduler.has_work():
        engine.scheduler.step()
    token = next(ev for ev in iter(got.get, None) if ev.kind == "token")
    row = engine.logits(ids)[-1].astype(np.float64)
    lse = row.max() + np.log(np.exp(row - row.max()).sum())
    assert token.logprob == pytest.approx(row[token.token_id] - lse, abs=1e-3)
    assert [t for t, _ in token.top_logprobs] == list(np.argsort(-row)[:3])


# ----------------------------------------------------------------------------- the engine's edges


def test_an_abandoned_generator_does_not_block_the_next_caller(smollm2_path):
    with Engine.load(smollm2_path, LoadConfig(n_ctx=256, threads=2, warmup=False)) as e:
        gen = e.generate("Tell me a long story", max_tokens=None)
        next(gen)  # started, then dropped without closing
        with pytest.raises(EngineBusyError, match="busy with another generation"):
            next(e.generate("Hi", max_tokens=2))
        del gen
        gc.collect()
        t0 = time.perf_counter()
        events = list(e.generate("Hi", temperature=0, max_tokens=2))
        assert events[-1].finish_reason == "length" and time.perf_counter() - t0 < 10
        gen = e.generate("Another story", max_tokens=None)
        next(gen)
        gen.close()  # closing frees the slot at once
        assert list(e.generate("Hi", max_tokens=1))[-1].finish_reason == "length"


def test_generate_after_close(smollm2_path):
    e = Engine.load(smollm2_path, LoadConfig(n_ctx=64, threads=2, warmup=False))
    e.close()
    with pytest.raises(EngineClosedError, match="closed"):
        e.generate("Hi")
    with pytest.raises(EngineClosedError):
        e.logits([1, 2])


@pytest.mark.parametrize("warmup", [True, False])
def test_tiny_contexts_are_refused_clearly(smollm2_path, warmup):
    with pytest.raises(ValueError, match="at least 8 tokens"):
        Engine.load(smollm2_path, LoadConfig(n_ctx=1, warmup=warmup))
    with pytest.raises(ValueError, match="0 \\(the model's own\\) or at least"):
        Engine.load(smollm2_path, LoadConfig(n_ctx=-5, warmup=warmup))


def test_non_finite_logits_end_in_a_clear_error(engine, monkeypatch):
    real = engine.model.decode

    def broken(batch):
        out = real(batch)
        out[:] = np.nan
        return out

    monkeypatch.setattr(engine.model, "decode", broken)
    with pytest.raises(NonFiniteLogitsError, match="non-finite logits"):
        list(engine.generate("Hi", max_tokens=3))
    monkeypatch.undo()
    assert list(engine.generate("Hi", max_tokens=1))[-1].finish_reason == "length"


def test_cancel_from_another_thread_ends_a_generation_at_its_next_step(engine):
    # end-of-generation tokens banned: only the cancel can end it, however fast the machine
    never_ends = {t: float("-inf") for t in engine.tokenizer.eog_ids}
    gen = engine.generate("Write a very long essay", max_tokens=None, logit_bias=never_ends)
    next(gen)
    threading.Timer(0.2, engine.cancel).start()
    t0 = time.perf_counter()
    last = list(gen)[-1]
    # a bound that catches a generation that ignores the cancel (a step takes milliseconds)
    assert last.finish_reason == "cancelled" and time.perf_counter() - t0 < 10


def test_stats_count_what_llama_servers_metrics_show(engine):
    """The counters /metrics reads: cached prompt tokens, busy slots per decode, and the longest
    sequence, beside the evaluated and generated tokens."""
    sched = engine.scheduler
    before = dict(sched.stats)
    base = engine.tokenize("Counting the cached tokens of a shared prefix, twice:")
    _, events = _run(sched, [base, base], temperature=0, max_tokens=4)
    after = sched.stats
    reused = sum(evs[0].n_reused for evs in events)
    assert after["n_prompt_tokens_cached"] - before["n_prompt_tokens_cached"] == reused
    assert after["n_prompt_tokens"] - before["n_prompt_tokens"] == 2 * len(base) - reused
    n_decode = after["n_decode"] - before["n_decode"]
    n_busy = after["n_busy_slots"] - before["n_busy_slots"]
    assert n_decode <= n_busy <= 2 * n_decode  # two requests ran side by side at most
    assert n_busy > n_decode  # ... and did share some decodes
    assert after["n_tokens_max"] >= len(base) + 3  # prompt + the generated tokens cached


def test_work_between_steps_runs_on_the_serve_loops_thread(engine):
    """Embeddings asked from another thread (a server's thread pool) run on the engine thread:
    a second thread launching numba's OpenMP kernels, kept alive, made libgomp put its workers
    to sleep after every kernel, and every later decode step ~3x slower."""
    sched = engine.scheduler
    seen = []
    real_embed = engine.model.embed

    def recording_embed(*args, **kwargs):
        seen.append(threading.get_ident())
        return real_embed(*args, **kwargs)

    engine.model.embed = recording_embed
    stop = threading.Event()
    loop = threading.Thread(target=sched.serve_forever, args=(stop,), daemon=True)
    try:
        assert sched.run_between_steps(threading.get_ident) == threading.get_ident()
        loop.start()
        while not sched.serving:
            time.sleep(0.01)
        vectors = engine.embed(["a short text"], pooling="mean")
        assert vectors.shape == (1, engine.info.n_embd) and seen == [loop.ident]
        with pytest.raises(ZeroDivisionError):
            sched.run_between_steps(lambda: 1 / 0)
        assert sched.run_between_steps(threading.get_ident) == loop.ident
    finally:
        stop.set()
        sched.wake()
        loop.join(timeout=30)
        engine.model.embed = real_embed
    assert not loop.is_alive() and not sched.serving
    assert sched.run_between_steps(threading.get_ident) == threading.get_ident()


def test_serve_loop_calls_after_step_on_its_thread_once_the_steps_events_are_out(engine):
    """A server hands each step's events to its event loop in one go, from `after_step`."""
    sched = engine.scheduler
    events, calls = [], []
    stop = threading.Event()
    loop = threading.Thread(target=sched.serve_forever, args=(stop,),
                            kwargs={"after_step": lambda: calls.append(
                                (threading.get_ident(), len(events)))}, daemon=True)
    loop.start()
    try:
        req = sched.add_request(engine.tokenize("Once upon a time"),
                                SamplingParams(temperature=0.0, max_tokens=4), events.append)
        sched.wake()
        assert req.done.wait(60)
        deadline = time.monotonic() + 10
        while (not calls or calls[-1][1] < len(events)) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        sched.wake()
        loop.join(timeout=30)
    assert [e.kind for e in events] == ["prompt", "token", "token", "token", "token", "done"]
    assert {ident for ident, _ in calls} == {loop.ident}
    # every step ends with an after_step call that sees its events: the prompt step's (prompt
    # and first token), one token each, then the last token with "done"
    seen = [n for _, n in calls]
    assert seen == sorted(seen) and sorted(set(seen)) == [2, 3, 4, 6]
