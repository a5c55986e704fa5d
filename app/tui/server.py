"""The Server screen (LM Studio's local-server view): serve the chat's loaded model over the
OpenAI-compatible API of `llamatui serve`, with its port and API key, the slots (state, prompt
and generated tokens, tok/s), the queue, and a log of the requests.

The server (app/server/) runs in its own threads: uvicorn's event loop and the engine thread
that steps the scheduler; the chat shares the scheduler (its replies queue like any request).
Starting and stopping run in thread workers that post messages; a timer refreshes the tables
from the server's state. The screen is kept for the app's life (F12 reopens it), so the server
goes on while the chat is shown, and stops when the model is unloaded or the app quits.
"""
from __future__ import annotations

import pathlib
import time

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message as TMessage
from textual.screen import Screen
from textual.widgets import Button, DataTable, Footer, Header, Input, Label, Static

CSS_DIR = pathlib.Path(__file__).parent
REFRESH_S = 0.5
LOG_ROWS = 200  # the newest requests shown

SERVER_ACTIONS = [
    ("escape", "close", "Back", "Close the server screen", "back to the chat (it keeps serving)"),
    ("ctrl+s", "toggle", "Start/stop", "Start or stop serving",
     "serve the loaded model over the OpenAI-compatible API, or stop"),
]


class ServerStarted(TMessage):
    def __init__(self, server):
        super().__init__()
        self.server = server


class ServerStopped(TMessage):
    def __init__(self, reason: str | None = None):
        super().__init__()
        self.reason = reason


class ServerFailed(TMessage):
    def __init__(self, error: BaseException):
        super().__init__()
        self.error = error


def slot_rows(slots: list[dict]) -> list[tuple]:
    """(slot, state, prompt tokens, generated tokens, tok/s) for each slot."""
    return [(str(s["id"]), s["state"], str(s["n_prompt"]), str(s["n_generated"]),
             f"{s['gen_tps']:.1f}" if s["gen_tps"] else "") for s in slots]


def log_rows(entries) -> list[tuple]:
    """(time, client, request, status, seconds, tokens) for each log entry, newest first."""
    return [(time.strftime("%H:%M:%S", time.localtime(e.time)), e.client,
             f"{e.method} {e.path}", str(e.status), f"{e.seconds:.2f}",
             f"{e.n_prompt}+{e.n_generated}" if e.n_prompt or e.n_generated else "")
            for e in reversed(entries)][:LOG_ROWS]


class ServerScreen(Screen):
    CSS_PATH = CSS_DIR / "server_screen.tcss"
    BINDINGS = [Binding(key, action, label, show=True, priority=key == "ctrl+s")
                for key, action, label, _, _ in SERVER_ACTIONS]
    TITLE = "Server"

    def __init__(self):
        super().__init__()
        self.server = None  # a running llamatui.app.server.Server
        self.engine = None  # the engine it serves (the chat's)
        self.busy = False  # a start or stop in progress
        self._newest_logged = None  # the log entry the table was last filled up to

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical(id="server-body"):
            yield Static("Stopped", id="server-status", markup=False)
            with Horizontal(id="server-form"):
                yield Label("Port", classes="form-label")
                yield Input("8080", id="server-port", restrict=r"[0-9]*", max_length=5)
                yield Label("API key", classes="form-label")
                yield Input("", id="server-key", password=True,
                            placeholder="none: anyone on this machine may use it")
                yield Button("Start", id="server-toggle", variant="success")
            yield Label("Slots", classes="section-title")
            yield DataTable(id="server-slots", cursor_type="none", zebra_stripes=True)
            yield Static("", id="server-queue", markup=False)
            yield Label("Requests", classes="section-title")
            yield DataTable(id="server-log", cursor_type="row", zebra_stripes=True)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.sub_title = "serve the loaded model over an OpenAI-compatible API"
        self.query_one("#server-slots", DataTable).add_columns(
            "Slot", "State", "Prompt", "Generated", "tok/s")
        self.query_one("#server-log", DataTable).add_columns(
            "Time", "Client", "Request", "Status", "Seconds", "Tokens")
        self.set_interval(REFRESH_S, self.refresh_view)
        self.refresh_view()

    # ---------------------------------------------------------------- actions

    def action_close(self) -> None:
        self.app.pop_screen()

    def action_toggle(self) -> None:
        if self.busy:
            return
        if self.server is None:
            self.start()
        else:
            self.stop()

    @on(Button.Pressed, "#server-toggle")
    def _toggle_pressed(self) -> None:
        self.action_toggle()

    def start(self) -> None:
        chat = getattr(self.app, "chat", None)
        engine = chat.engine if chat is not None else None
        if engine is None:
            self.notify("Load a model in the chat first; the server serves the chat's model",
                        title="No model loaded", severity="warning")
            return
        port_text = self.query_one("#server-port", Input).value
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            self.notify(f"The port must be a number from 1 to 65535, not {port_text!r}",
                        title="Bad port", severity="error")
            return
        key = self.query_one("#server-key", Input).value.strip()
        self.busy, self.engine = True, engine
        self._set_status(f"Starting on port {port_text}…")
        self._start(engine, int(port_text), key)

    @work(thread=True, exclusive=True, exit_on_error=False, group="server")
    def _start(self, engine, port: int, key: str) -> None:
        from ..server import ServedEngine, Server, ServerConfig
        try:
            config = ServerConfig(host="127.0.0.1", port=port,
                                  api_keys=(key,) if key else (), metrics=True)
            server = Server(config, ServedEngine(engine, owns_engine=False))
            server.start()
        except BaseException as e:  # noqa: BLE001 - shown, never raised
            self.post_message(ServerFailed(e))
            return
        self.post_message(ServerStarted(server))

    def stop(self, reason: str | None = None) -> None:
        server, self.server, self.engine = self.server, None, None
        if server is None:
            return
        self.busy = True
        self._set_status("Stopping…")
        self._stop(server, reason)

    @work(thread=True, exit_on_error=False, group="server")
    def _stop(self, server, reason: str | None) -> None:
        try:
            server.stop()
        finally:
            self.post_message(ServerStopped(reason))

    def on_unmount(self) -> None:
        """The app is quitting: stop serving now."""
        server, self.server = self.server, None
        if server is not None:
            server.stop()

    # ---------------------------------------------------------------- messages

    @on(ServerStarted)
    def _started(self, msg: ServerStarted) -> None:
        self.busy, self.server = False, msg.server
        self.query_one("#server-toggle", Button).label = "Stop"
        self.query_one("#server-toggle", Button).variant = "error"
        self.notify(f"Serving at {msg.server.url}/v1", title="Server started")
        self.refresh_view()

    @on(ServerStopped)
    def _stopped(self, msg: ServerStopped) -> None:
        self.busy = False
        self.query_one("#server-toggle", Button).label = "Start"
        self.query_one("#server-toggle", Button).variant = "success"
        self._set_status(f"Stopped{f': {msg.reason}' if msg.reason else ''}")
        if msg.reason:
            self.notify(msg.reason, title="Server stopped", severity="warning")

    @on(ServerFailed)
    def _failed(self, msg: ServerFailed) -> None:
        self.busy, self.engine = False, None
        self._set_status(f"Not started: {msg.error}")
        self.notify(str(msg.error), title="Cannot start the server", severity="error",
                    timeout=10)

    # ---------------------------------------------------------------- view

    def _set_status(self, text: str) -> None:
        self.query_one("#server-status", Static).update(text)

    def refresh_view(self) -> None:
        server = self.server
        if server is None:
            return
        chat = getattr(self.app, "chat", None)
        if chat is None or chat.engine is not self.engine:
            self.stop("the chat's model was unloaded or changed")
            return
        sched = server.served.scheduler
        key = " (API key required)" if server.config.api_keys else ""
        self._set_status(f"Serving {self.engine.info.name} at {server.url}/v1{key}")
        self._fill(self.query_one("#server-slots", DataTable), slot_rows(sched.slots_info()))
        state = server.state
        self.query_one("#server-queue", Static).update(
            f"Queue: {sched.n_queued()} waiting · {state.n_requests} requests")
        entries = list(state.log)
        newest = entries[-1] if entries else None
        if newest is not self._newest_logged:
            self._newest_logged = newest
            self._fill(self.query_one("#server-log", DataTable), log_rows(entries))

    @staticmethod
    def _fill(table: DataTable, rows: list[tuple]) -> None:
        table.clear()
        for row in rows:
            table.add_row(*row)


__all__ = ["ServerScreen", "SERVER_ACTIONS", "slot_rows", "log_rows"]
