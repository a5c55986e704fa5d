"""Running the app under uvicorn: `Server.run()` in the foreground (`llamatui serve`) or
`Server.start()` in a thread with its own event loop (the app's Server screen, tests).

The socket is bound here, before uvicorn starts, so that a port in use is a clear error at once
(and port 0 picks a free one: `server.port` says which).
"""
from __future__ import annotations

import socket
import threading
import time

import uvicorn

from .app import create_app
from .config import ServerConfig

GRACE_S = 3  # how long a stop waits for open answers (their runs are cancelled first)


class ServerError(OSError):
    """The server cannot listen where it was asked to."""


class Server:
    def __init__(self, config: ServerConfig, served):
        self.config, self.served = config, served
        self.app = create_app(config, served)
        self.state = self.app.state.llamatui
        self._socket: socket.socket | None = None
        self._uvicorn: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def bind(self) -> None:
        family = socket.AF_INET6 if ":" in self.config.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.config.host, self.config.port))
        except OSError as e:
            sock.close()
            raise ServerError(f"cannot listen on {self.config.host}:{self.config.port}: "
                              f"{e.strerror or e}") from None
        sock.listen(2048)
        sock.set_inheritable(True)
        self._socket = sock

    @property
    def port(self) -> int:
        return self._socket.getsockname()[1] if self._socket else self.config.port

    @property
    def url(self) -> str:
        host = self.config.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    def _make_uvicorn(self) -> uvicorn.Server:
        cfg = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="on",
                             timeout_graceful_shutdown=GRACE_S, ws="none")
        self._uvicorn = uvicorn.Server(cfg)
        return self._uvicorn

    def run(self) -> None:
        """Serves in this thread until interrupted (uvicorn handles Ctrl+C), then stops."""
        if self._socket is None:
            self.bind()
        try:
            self._make_uvicorn().run(sockets=[self._socket])
        finally:
            self.close()

    def start(self, timeout: float = 30.0) -> None:
        """Serves from a thread; returns once it accepts connections."""
        if self._socket is None:
            self.bind()
        server = self._make_uvicorn()
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [self._socket]},
                                        name="llamatui-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if not server.started:
            self.close()
            raise ServerError("the HTTP server did not start")

    def request_stop(self) -> None:
        """Asks uvicorn to stop (from any thread, e.g. the loader when loading failed)."""
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True

    def stop(self) -> None:
        """Cancels every answer in progress, stops serving, releases the engine (if ours)."""
        for run in list(self.served.runs):
            run.cancel_requests()
        self.request_stop()
        if self._thread is not None:
            self._thread.join(timeout=GRACE_S + 10)
        self.close()

    def close(self) -> None:
        self.served.close()
        if self._socket is not None:
            self._socket.close()
            self._socket = None
