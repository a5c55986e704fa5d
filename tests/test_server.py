"""`llamatui serve` on SmolLM2 through the official `openai` client, as a llama-server user's
code would call it: chat and completions (streamed and not), usage, stop, n, logprobs, seeds,
errors with their statuses and fields, API keys on every route of the route table, CORS off."""
import base64
import json

import numpy as np
import openai
import pytest

from llamatui.app.server.routes import PUBLIC_PATHS, ROUTES

from server_helpers import http, serve

KEY = "sk-test-key"
N_SLOTS, N_CTX = 4, 1024  # 256 tokens per slot
CHAT = [{"role": "user", "content": "Name three colors."}]
MIN_COSINE = 0.999  # as tests/test_embeddings.py asks of the engine against llama.cpp


@pytest.fixture(scope="module")
def server(smollm2_path):
    with serve(smollm2_path, "-c", str(N_CTX), "-np", str(N_SLOTS), "-t", "2", "--metrics",
               "--api-key", KEY, "--alias", "smol", "--embeddings", "--pooling", "mean") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, timeout=120, max_retries=0)


def _auth():
    return {"Authorization": f"Bearer {KEY}"}


def test_health_said_loading_before_ready(server):
    assert server.saw_loading  # 503 "Loading model" while the model loaded
    assert server.json("/health") == {"status": "ok"}


def test_chat_not_streamed(client):
    r = client.chat.completions.create(model="smol", messages=CHAT, max_tokens=12,
                                       temperature=0)
    assert r.object == "chat.completion" and r.model == "smol"
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 5 and 1 <= r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_streamed_matches_not_streamed_with_usage(client):
    kw = dict(model="smol", messages=CHAT, max_tokens=12, temperature=0)
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == whole.choices[0].finish_reason and not any(finals[:-1])
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == \
        (whole.usage.prompt_tokens, whole.usage.completion_tokens, whole.usage.total_tokens)
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_without_include_usage_has_no_usage_chunk(server):
    status, headers, body = http("POST", server.url + "/v1/chat/completions",
                                 {"messages": CHAT, "max_tokens": 3, "stream": True},
                                 headers=_auth())
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = body.decode().split("\n\n")
    assert events[-2] == "data: [DONE]" and events[-1] == ""
    objects = [json.loads(e[len("data: "):]) for e in events[:-2]]
    assert all(o["choices"] for o in objects) and "usage" not in objects[-1]


def test_completions_streamed_and_not(client):
    kw = dict(model="smol", prompt="The capital of France is", max_tokens=8, temperature=0)
    whole = client.completions.create(**kw)
    assert whole.object == "text_completion" and whole.choices[0].text
    parts = list(client.completions.create(**kw, stream=True,
                                           stream_options={"include_usage": True}))
    assert "".join(p.choices[0].text for p in parts if p.choices) == whole.choices[0].text
    assert parts[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert parts[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_with_raw_response(client):
    raw = client.chat.completions.with_raw_response.create(
        model="smol", messages=CHAT, max_tokens=4, temperature=0)
    assert raw.status_code == 200
    assert raw.headers["content-type"].startswith("application/json")
    assert raw.parse().choices[0].message.content


def test_stop_ends_before_the_stop_string(client):
    kw = dict(model="smol", prompt="1, 2, 3, 4, 5,", max_tokens=16, temperature=0)
    free = client.completions.create(**kw).choices[0].text
    assert " 7," in free, free
    stopped = client.completions.create(**kw, stop=[" 7,"]).choices[0]
    assert stopped.text == free[:free.index(" 7,")] and stopped.finish_reason == "stop"


def test_n_choices_and_seeds(client):
    kw = dict(model="smol", messages=CHAT, max_tokens=16, temperature=1.0, seed=42, n=2)
    first = client.chat.completions.create(**kw)
    assert [c.index for c in first.choices] == [0, 1]
    texts = [c.message.content for c in first.choices]
    assert texts[0] != texts[1]  # choice i samples with seed + i
    again = client.chat.completions.create(**kw)
    assert [c.message.content for c in again.choices] == texts  # same seed, same text
    single = client.chat.completions.create(**{**kw, "n": 1})
    assert single.choices[0].message.content == texts[0]
    assert first.usage.completion_tokens > single.usage.completion_tokens
    assert first.usage.prompt_tokens == single.usage.prompt_tokens  # one prompt, counted once


def test_logprobs(client):
    r = client.chat.completions.create(model="smol", messages=CHAT, max_tokens=6,
                                       temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) >= 1
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        tops = [t.logprob for t in entry.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert entry.token == entry.top_logprobs[0].token  # greedy takes the most likely
        assert abs(entry.logprob - tops[0]) < 1e-6
    assert "".join(e.token for e in content).startswith(r.choices[0].message.content[:3])


def test_wrong_key_is_an_authentication_error(server):
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0, timeout=30)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.chat.completions.create(model="smol", messages=CHAT, max_tokens=2)
    assert e.value.status_code == 401
    assert e.value.body["type"] == "authentication_error"
    assert bad.models.list().data[0].id == "smol"  # /v1/models is public


def test_oversized_prompt_is_a_bad_request(client, server):
    long = "hello " * 400  # more than a slot's 256 tokens
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="smol", prompt=long, max_tokens=4)
    err = e.value.body
    assert err["type"] == "exceed_context_size_error"
    assert err["n_ctx"] == N_CTX // N_SLOTS and err["n_prompt_tokens"] > N_CTX // N_SLOTS
    # streamed: still a 400 with a JSON body, before any event
    status, headers, body = http("POST", server.url + "/v1/completions",
                                 {"prompt": long, "max_tokens": 4, "stream": True},
                                 headers=_auth())
    assert status == 400 and headers["content-type"] == "application/json"
    assert json.loads(body)["error"]["type"] == "exceed_context_size_error"


@pytest.mark.parametrize("body, param", [
    ({"messages": CHAT, "max_tokens": -1}, "max_tokens"),
    ({"messages": CHAT, "max_tokens": 10**9}, "max_tokens"),
    ({"messages": CHAT, "max_completion_tokens": 0}, "max_completion_tokens"),
    ({"messages": CHAT, "n": N_SLOTS + 1}, "n"),
    ({"messages": CHAT, "temperature": "hot"}, "temperature"),
    ({"messages": CHAT, "top_p": 1.5}, "top_p"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({}, "messages"),
    ({"messages": CHAT, "stop": 5}, "stop"),
    ({"messages": CHAT, "logit_bias": {"abc": 1}}, "logit_bias"),
    ({"messages": CHAT, "logit_bias": {"99999999": 1}}, "logit_bias"),
    ({"messages": CHAT, "top_logprobs": 2}, "top_logprobs"),
    ({"messages": CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "not": {}}}}}, "response_format"),
    ({"messages": CHAT, "response_format": {"type": "xml"}}, "response_format"),
    ({"messages": CHAT, "grammar": "root ::= undefined_rule"}, "grammar"),
    ({"messages": CHAT, "tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ({"messages": CHAT, "tools": [{"type": "function", "function": {"name": "f"}}],
      "json_schema": {"type": "object"}}, "json_schema"),
])
def test_bad_fields_are_400_naming_the_field(server, body, param):
    status, _, raw = server.post("/v1/chat/completions", body, headers=_auth())
    assert status == 400, raw
    error = json.loads(raw)["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert param.split("[")[0].split(".")[0] in error["message"]


def test_malformed_json_and_unknown_fields(server):
    status, _, raw = server.post("/v1/chat/completions", b'{"messages": [', headers=_auth())
    assert status == 400 and "not valid JSON" in json.loads(raw)["error"]["message"]
    status, _, raw = server.post("/v1/chat/completions", b"[1, 2]", headers=_auth())
    assert status == 400 and "JSON object" in json.loads(raw)["error"]["message"]
    deep = b'{"messages": ' + b"[" * 5000 + b"]" * 5000 + b"}"  # Python's parser recurses
    status, _, raw = server.post("/v1/chat/completions", deep, headers=_auth())
    assert status == 400 and "nests too deeply" in json.loads(raw)["error"]["message"]
    ok = {"messages": CHAT, "max_tokens": 2, "frobnicate": {"x": 1}, "user": "me"}
    status, _, raw = server.post("/v1/chat/completions", ok, headers=_auth())
    assert status == 200, raw


def test_unknown_route_and_method(server):
    status, _, raw = server.get("/nope", headers=_auth())
    assert status == 404 and json.loads(raw)["error"]["type"] == "not_found_error"
    status, _, raw = server.get("/v1/chat/completions", headers=_auth())
    assert status == 405 and "error" in json.loads(raw)


def test_every_route_but_the_public_ones_needs_the_key(server):
    assert PUBLIC_PATHS == {"/health", "/v1/health", "/v1/models", "/models"}
    for route in ROUTES:
        for path in route.paths:
            body = b"{}" if route.method == "POST" else None
            for headers in ({}, {"Authorization": "Bearer nope"}, {"X-Api-Key": "nope"},
                            {"Authorization": KEY[:-1]}):
                status, _, raw = http(route.method, server.url + path, body, headers=headers)
                if route.public:
                    assert status == 200, (path, raw)
                else:
                    assert status == 401, (path, headers, status)
                    assert json.loads(raw)["error"]["type"] == "authentication_error"
            for headers in (_auth(), {"X-Api-Key": KEY}):
                status, _, _ = http(route.method, server.url + path, body, headers=headers)
                assert status != 401, path
    status, _, _ = server.get("/not-a-route")  # unknown paths are protected too
    assert status == 401


def test_no_cors_headers_unless_configured(server):
    for method, path in (("GET", "/health"), ("OPTIONS", "/v1/chat/completions")):
        status, headers, _ = http(method, server.url + path, headers={
            "Origin": "http://evil.example", "Access-Control-Request-Method": "POST", **_auth()})
        assert not any(h.lower().startswith("access-control-") for h in headers), headers


def test_llama_server_routes(server):
    tokens = json.loads(server.post("/tokenize", {"content": "Hello world"},
                                    headers=_auth())[2])["tokens"]
    assert tokens and all(isinstance(t, int) for t in tokens)
    pieces = json.loads(server.post("/tokenize", {"content": "Hello world", "with_pieces": True},
                                    headers=_auth())[2])["tokens"]
    assert [p["id"] for p in pieces] == tokens and "".join(p["piece"] for p in pieces) == \
        "Hello world"
    text = json.loads(server.post("/detokenize", {"tokens": tokens}, headers=_auth())[2])
    assert text == {"content": "Hello world"}
    prompt = json.loads(server.post("/apply-template", {"messages": CHAT}, headers=_auth())[2])
    assert "Name three colors." in prompt["prompt"] and "<|im_start|>" in prompt["prompt"]
    props = server.json("/props", headers=_auth())
    assert props["total_slots"] == N_SLOTS and props["model_alias"] == "smol"
    assert props["default_generation_settings"]["n_ctx"] == N_CTX // N_SLOTS
    slots = server.json("/slots", headers=_auth())
    assert len(slots) == N_SLOTS and all(not s["is_processing"] for s in slots)
    assert not any("prompt" in k and isinstance(v, str) for s in slots for k, v in s.items())
    metrics = server.get("/metrics", headers=_auth())[2].decode()
    for name in ("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total",
                 "llamacpp:requests_processing 0", "llamacpp:requests_deferred 0",
                 "llamacpp:kv_cache_usage_ratio", "llamacpp:n_decode_total"):
        assert name in metrics
    spec = server.json("/openapi.json", headers=_auth())
    assert set(spec["paths"]) == {r.paths[0] for r in ROUTES}


def test_native_completion(server):
    body = {"prompt": "The capital of France is", "n_predict": 6, "temperature": 0}
    status, _, raw = server.post("/completion", body, headers=_auth())
    final = json.loads(raw)
    assert status == 200 and final["stop"] is True and final["content"]
    assert final["tokens_predicted"] <= 6 and final["stop_type"] in ("eos", "limit", "word")
    status, headers, raw = server.post("/completion", {**body, "stream": True}, headers=_auth())
    events = [json.loads(e[len("data: "):]) for e in raw.decode().split("\n\n") if e]
    assert all(not e["stop"] for e in events[:-1]) and events[-1]["stop"] is True
    assert "".join(e["content"] for e in events) == final["content"]
    assert b"[DONE]" not in raw  # llama-server's own stream has no [DONE]


def test_embeddings_match_llama_server(client, golden_dir):
    golden = json.loads((golden_dir / "llama_server_smollm2_embeddings.json").read_text())
    r = client.embeddings.create(model="smol", input=golden["texts"], encoding_format="float")
    assert [d.index for d in r.data] == list(range(len(golden["texts"])))
    ours = np.array([d.embedding for d in r.data])
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)  # L2-normalised
    theirs = np.array(golden["embeddings"])
    cosines = (ours * theirs).sum(axis=1)
    print(f"\nvs llama-server: cosine ≥ {cosines.min():.6f}, "
          f"largest difference {np.abs(ours - theirs).max():.5f}")
    # llama.cpp multiplies Q4_1 weights by activations quantized to Q8_1 and keeps K/V in f16;
    # the engine works in f32, so directions agree to 1e-3 but single entries differ by ~0.007
    assert (cosines >= MIN_COSINE).all()
    assert r.usage.prompt_tokens == golden["usage"]["prompt_tokens"]
    again = client.embeddings.create(model="smol", input=golden["texts"][1])
    assert float(np.dot(again.data[0].embedding, ours[1])) == pytest.approx(1.0, abs=1e-6)


def test_embeddings_in_base64(server):
    body = {"input": ["Hello world"], "encoding_format": "base64"}
    status, _, raw = server.post("/v1/embeddings", body, headers=_auth())
    packed = json.loads(raw)["data"][0]["embedding"]
    floats = json.loads(server.post("/v1/embeddings", {**body, "encoding_format": "float"},
                                    headers=_auth())[2])["data"][0]["embedding"]
    assert status == 200
    assert np.array_equal(np.frombuffer(base64.b64decode(packed), "<f4"),
                          np.array(floats, dtype=np.float32))


# ---------------------------------------------------------------------------- property-based

MAX_TOKENS_IN_RUN = 4  # generation fields capped so that the run stays short
CAPPED = ("max_tokens", "max_completion_tokens", "n_predict")


def _cap_generation(node):
    """The served /openapi.json with every generation length capped (n_predict's -1, "until the
    end", too)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in CAPPED and isinstance(value, dict):
                value.update(minimum=1, maximum=MAX_TOKENS_IN_RUN)
            else:
                _cap_generation(value)
    elif isinstance(node, list):
        for value in node:
            _cap_generation(value)
    return node


@pytest.fixture(scope="module")
def api_schema(server):
    import schemathesis
    from schemathesis.config import HealthCheck

    doc = _cap_generation(json.loads(server.get("/openapi.json", headers=_auth())[2]))
    schema = schemathesis.openapi.from_dict(doc)
    schema.config.update(base_url=server.url, headers=_auth(), request_timeout=120,
                         suppress_health_check=[HealthCheck.all])
    # examples and fuzzing (the coverage phase's boundary cases, one generation each, take
    # too long for the suite); a fixed seed, so that a run is the same every time
    schema.config.phases.update(phases=["examples", "fuzzing"])
    schema.config.generation.update(max_examples=12, deterministic=True)
    return schema


def _property_run():
    import schemathesis
    return schemathesis.pytest.from_fixture("api_schema")


@_property_run().parametrize()
def test_openapi_property_run(case):
    """Generated requests, valid and invalid, on every route of /openapi.json: no 5xx answer,
    every answer's status, content type and body as the document says."""
    from schemathesis.checks import (content_type_conformance, not_a_server_error,
                                     response_schema_conformance, status_code_conformance)
    case.call_and_validate(checks=[not_a_server_error, status_code_conformance,
                                   content_type_conformance, response_schema_conformance])


@pytest.mark.parametrize("text", ["hi", 'a "quoted" \\ back\nslash', "é 😀 \u2028", ""])
def test_content_chunks_are_written_as_chat_chunks_are(text):
    """The per-token fast path writes the bytes the general one writes."""
    from llamatui.app.server.shapes import Shaper
    from llamatui.app.server.sse import sse
    shaper = Shaper("chat", "smol")
    for index in (0, 12):
        assert shaper.content_chunk(index, text) == sse(shaper.chat_chunk(index,
                                                                          {"content": text}))


def test_keep_alive_ticks_only_after_a_quiet_interval():
    import asyncio

    from llamatui.app.server.served_engine import _TICK, _KeepAlive

    async def ticks(busy: bool) -> tuple[int, float]:
        queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        keep_alive = _KeepAlive(queue, 0.2)
        for _ in range(20):
            await asyncio.sleep(0.025)
            if busy:
                keep_alive.last = loop.time()  # an event came
        keep_alive.cancel()
        n = sum(1 for _ in range(queue.qsize()) if queue.get_nowait() is _TICK)
        return n, loop.time() - t0

    assert asyncio.run(ticks(busy=True))[0] == 0
    n, elapsed = asyncio.run(ticks(busy=False))  # 0.5 s of silence: a tick per 0.2 s
    assert 2 <= n <= elapsed / 0.2


def test_a_steps_events_wake_the_event_loop_once_the_step_is_over():
    """The engine thread's events wait for its after-step hand-over and then take one loop
    wake-up; a post from any other thread (a handler's) is scheduled at once."""
    import asyncio
    import threading

    from llamatui.app.server.served_engine import Mailbox

    async def scenario():
        loop = asyncio.get_running_loop()
        wakeups = []
        real = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda fn, *args: (wakeups.append(fn), real(fn, *args))
        box, queues = Mailbox(loop), [asyncio.Queue() for _ in range(8)]
        before_hand_over = []

        def engine_thread():
            Mailbox.defer_on_this_thread()
            for i, queue in enumerate(queues):  # one step: a token for each of eight slots
                box.post(queue, i)
            before_hand_over.append(len(wakeups))
            Mailbox.hand_over_deferred()

        thread = threading.Thread(target=engine_thread)
        thread.start()
        await asyncio.to_thread(thread.join)
        await asyncio.sleep(0.05)
        got = [queue.get_nowait() for queue in queues]
        n_step_wakeups = wakeups.count(box._deliver)
        box.post(queues[0], "from the loop's thread")
        await asyncio.sleep(0.01)
        return before_hand_over, n_step_wakeups, got, wakeups.count(box._deliver), queues[0]

    before, n_step_wakeups, got, n_wakeups, first = asyncio.run(scenario())
    assert before == [0] and n_step_wakeups == 1 and got == list(range(8))
    assert n_wakeups == 2 and first.get_nowait() == "from the loop's thread"
