"""A client that goes away frees its slot at once, whatever the request was doing: streaming,
waiting for a non-streamed answer, queued behind a busy slot, or still in its prompt
(llama-server keeps generating for such clients: its issues #11720 and #13262). Also the bounded
queue (503 past --max-queue) and CORS for configured origins only."""
import json
import select
import socket
import time

import pytest

from server_helpers import http, serve

REPEATS = 20
FREED_WITHIN = 1.0  # s, from the client's close to /slots all idle and no request processing
ALLOWED = "http://allowed.example"
COMPLETIONS = "/v1/completions"


@pytest.fixture(scope="module")
def server(smollm2_path):
    with serve(smollm2_path, "-c", "512", "-np", "1", "-t", "2", "--metrics",
               "--max-queue", "1", "--cors-origin", ALLOWED) as s:
        yield s


def _open(server, body: dict, path: str) -> socket.socket:
    """Sends a request on a raw socket (so the test decides when the client goes away)."""
    port = int(server.url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    data = json.dumps(body).encode()
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                 f"\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def _state(server) -> tuple[list[dict], dict]:
    slots = server.json("/slots")
    text = server.get("/metrics")[2].decode()
    gauges = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
              if line.startswith("llamacpp:requests_")}
    return slots, gauges


def _wait_for(server, cond, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not cond(*_state(server)):
        assert time.monotonic() < deadline, "the server never reached the expected state"
        time.sleep(0.01)


def _freed_after_close(server, sock: socket.socket) -> float:
    """Closes the client's socket; seconds until every slot is idle and no request is
    processing or queued (fails past FREED_WITHIN)."""
    sock.close()
    t0 = time.monotonic()
    while True:
        slots, gauges = _state(server)
        elapsed = time.monotonic() - t0
        if all(not s["is_processing"] for s in slots) and \
                gauges["llamacpp:requests_processing"] == 0 and \
                gauges["llamacpp:requests_deferred"] == 0:
            return elapsed
        assert elapsed < FREED_WITHIN, f"slots still busy {elapsed:.2f} s after the close: " \
                                       f"{slots}, {gauges}"
        time.sleep(0.01)


def _processing(state: str):
    return lambda slots, gauges: any(s["state"] == state for s in slots)


def _long(**kw) -> dict:
    """A completion that would run for a long time; its prompt is cached after the first, so
    that each repetition starts generating at once."""
    return {"prompt": "Once upon a time, in a small village by the sea,", "max_tokens": 200,
            "temperature": 1.0, **kw}


def _read_until(sock: socket.socket, marker: bytes) -> None:
    seen = b""
    while marker not in seen:
        chunk = sock.recv(4096)
        assert chunk, "the server closed the connection"
        seen += chunk


def test_disconnect_while_streaming(server):
    worst = 0.0
    for _ in range(REPEATS):
        sock = _open(server, _long(stream=True), COMPLETIONS)
        _read_until(sock, b"data: ")
        worst = max(worst, _freed_after_close(server, sock))
    print(f"streaming: slot freed within {worst * 1000:.0f} ms")


def test_disconnect_while_waiting_for_the_answer(server):
    worst = 0.0
    for _ in range(REPEATS):
        sock = _open(server, _long(), COMPLETIONS)
        _wait_for(server, _processing("generating"))
        worst = max(worst, _freed_after_close(server, sock))
    print(f"waiting: slot freed within {worst * 1000:.0f} ms")


def test_disconnect_while_queued(server):
    worst = 0.0
    for _ in range(REPEATS):
        blocker = _open(server, _long(stream=True), COMPLETIONS)
        _read_until(blocker, b"data: ")
        queued = _open(server, _long(), COMPLETIONS)
        _wait_for(server, lambda s, g: g["llamacpp:requests_deferred"] == 1)
        queued.close()
        t0 = time.monotonic()
        _wait_for(server, lambda s, g: g["llamacpp:requests_deferred"] == 0, FREED_WITHIN)
        worst = max(worst, time.monotonic() - t0)
        _freed_after_close(server, blocker)
    print(f"queued: request dropped within {worst * 1000:.0f} ms")


def test_disconnect_during_the_prompt(server):
    worst, caught = 0.0, 0
    words = " ".join(f"w{j}" for j in range(12))  # 26 tokens, never cached (cache_prompt off)
    for _ in range(3 * REPEATS):
        sock = _open(server, {"prompt": words, "max_tokens": 8, "cache_prompt": False},
                     COMPLETIONS)
        if _caught_in(server, sock, "processing prompt"):
            worst = max(worst, _freed_after_close(server, sock))
            caught += 1
            if caught == REPEATS:
                break
        else:  # the prompt's step was over before a look at /slots: let it finish, again
            _read_until(sock, b"\r\n\r\n")
            sock.close()
            _wait_for(server, lambda s, g: not any(x["is_processing"] for x in s))
    assert caught == REPEATS, f"caught only {caught} requests in their prompt"
    print(f"prompt: slot freed within {worst * 1000:.0f} ms")


def _caught_in(server, sock: socket.socket, state: str, limit: float = 60.0) -> bool:
    """Whether a slot was seen in `state` before it moved on (to generating, or done: the
    answer is on the socket)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        states = {s["state"] for s in server.json("/slots")}
        if state in states:
            return True
        if "generating" in states or select.select([sock], [], [], 0)[0]:
            return False
        time.sleep(0.005)
    raise AssertionError(f"no slot reached {state!r} in {limit:.0f} s")


def test_queue_past_max_queue_is_503(server):
    blocker = _open(server, _long(stream=True), COMPLETIONS)
    _read_until(blocker, b"data: ")
    queued = _open(server, _long(), COMPLETIONS)
    try:
        _wait_for(server, lambda s, g: g["llamacpp:requests_deferred"] == 1)
        status, _, raw = server.post(COMPLETIONS, _long())
        assert status == 503
        error = json.loads(raw)["error"]
        assert error["type"] == "unavailable_error" and "--max-queue 1" in error["message"]
    finally:
        queued.close()
        blocker.close()
    _wait_for(server, lambda s, g: not any(x["is_processing"] for x in s), 10)


def test_cors_only_for_named_origins(server):
    pre = {"Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization,content-type"}
    status, headers, _ = http("OPTIONS", server.url + "/v1/chat/completions",
                              headers={"Origin": ALLOWED, **pre})
    assert status == 200 and headers["access-control-allow-origin"] == ALLOWED
    status, headers, _ = server.get("/health", headers={"Origin": ALLOWED})
    assert headers["access-control-allow-origin"] == ALLOWED
    status, headers, _ = http("OPTIONS", server.url + "/v1/chat/completions",
                              headers={"Origin": "http://evil.example", **pre})
    assert status == 400 and "access-control-allow-origin" not in {k.lower() for k in headers}
    status, headers, _ = server.get("/health", headers={"Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in {k.lower() for k in headers}


def test_embeddings_need_the_flag(server):
    status, _, raw = server.post("/v1/embeddings", {"input": "hello"})
    assert status == 501 and "--embeddings" in json.loads(raw)["error"]["message"]
