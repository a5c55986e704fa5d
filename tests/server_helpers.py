"""Starting `llamatui serve` for tests: a child process on 127.0.0.1 and a free port, waited
for until /health answers 200, always stopped (terminate, then kill) whatever the test does."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

START_TIMEOUT = 180  # s: a cold numba cache compiles kernels on the first load


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method: str, url: str, body=None, headers=None, timeout: float = 60):
    """(status, headers, body bytes) of one request; HTTP errors are answers too."""
    data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None and "Content-Type" not in (headers or {}):
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


class ServerProcess:
    def __init__(self, proc: subprocess.Popen, url: str, log_path: str):
        self.proc, self.url, self.log_path = proc, url, log_path
        self.saw_loading = False  # /health answered 503 "Loading model" before 200

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def get(self, path: str, **kw):
        return http("GET", self.url + path, **kw)

    def post(self, path: str, body, **kw):
        return http("POST", self.url + path, body, **kw)

    def json(self, path: str, **kw):
        status, _, body = self.get(path, **kw)
        assert status == 200, (status, body)
        return json.loads(body)


@contextlib.contextmanager
def serve(model, *flags: str):
    port = free_port()
    log = tempfile.NamedTemporaryFile("w+b", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "llamatui.app.cli", "serve", "-m", str(model),
           "--port", str(port), *flags]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    server = ServerProcess(proc, f"http://127.0.0.1:{port}", log.name)
    try:
        _wait_ready(server)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
        os.unlink(log.name)


def _wait_ready(server: ServerProcess) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"llamatui serve exited ({server.proc.returncode}):\n"
                               f"{server.log()}")
        try:
            status, _, body = server.get("/health", timeout=5)
        except OSError:
            time.sleep(0.02)
            continue
        if status == 200:
            return
        if status == 503 and b"Loading model" in body:
            server.saw_loading = True
        time.sleep(0.02)
    raise RuntimeError(f"llamatui serve did not become ready in {START_TIMEOUT} s:\n"
                       f"{server.log()}")
