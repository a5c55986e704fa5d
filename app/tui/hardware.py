"""The hardware screen: what this machine has (RAM, CPU, SIMD, GPUs with what fits on each, whether
GPU offload works, free disk) and what it can run (the starter models and the store's models,
each with its fit label); the rows come from hardware_report.py, shared with `llamatui hw`.

Detection and the estimates run in a thread worker (nvidia-smi and GGUF headers can be slow);
the handler on the UI thread fills the screen.
"""
from __future__ import annotations

import pathlib

from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message as TMessage
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Label, Static

from llamatui.models import hardware as model_hardware

from ..hardware_report import machine_rows, what_it_runs
from .formatting import FIT_STYLES, fmt_bytes
from .keys import footer_bindings

CSS_DIR = pathlib.Path(__file__).parent

HARDWARE_ACTIONS = [
    ("escape", "close", "Back", "Close the hardware screen", "back to the chat"),
    ("ctrl+r", "refresh", "Refresh", "Detect the hardware again",
     "read RAM, GPUs and disk again"),
]


class HardwareReady(TMessage):
    def __init__(self, hw, runs, n_ctx: int):
        super().__init__()
        self.hw, self.runs, self.n_ctx = hw, runs, n_ctx


class HardwareFailed(TMessage):
    def __init__(self, error: BaseException):
        super().__init__()
        self.error = error


class HardwareScreen(Screen):
    CSS_PATH = CSS_DIR / "hardware_screen.tcss"
    BINDINGS = [Binding(key, action, label, show=True) for key, action, label, _, _ in
                HARDWARE_ACTIONS] + footer_bindings("f3", "f5")
    TITLE = "Hardware"

    def __init__(self):
        super().__init__()
        self.hw = None
        self.rows: list[tuple[str, str]] = []
        self.runs: list = []
        self.loads = 0  # tests wait on it

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll(id="hw-body"):
            yield Label("This machine", classes="section-title")
            yield Static("Detecting…", id="hw-machine")
            yield Label("What it can run", classes="section-title", id="runs-title")
            yield DataTable(id="hw-runs", cursor_type="row", zebra_stripes=True)
            yield Static("", id="hw-notes", markup=False)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.sub_title = "what this machine has and can run"
        runs = self.query_one("#hw-runs", DataTable)
        runs.add_columns("Model", "Source", "Size", "Fit", "Needs")
        # Shown with its rows: an empty table's header has each column as narrow as its title,
        # and would jump to the rows' widths when they arrive.
        runs.display = False
        self.action_refresh()

    def action_close(self) -> None:
        self.dismiss(None)

    def action_refresh(self) -> None:
        n_ctx = self.app.default_settings().n_ctx if hasattr(self.app, "default_settings") \
            else 4096
        self._detect(n_ctx)

    @work(thread=True, exclusive=True, exit_on_error=False, group="hardware")
    def _detect(self, n_ctx: int) -> None:
        try:
            hw = model_hardware.detect()
            runs = what_it_runs(hw, n_ctx)
        except BaseException as e:  # noqa: BLE001 - shown, never raised
            self.post_message(HardwareFailed(e))
            return
        self.post_message(HardwareReady(hw, runs, n_ctx))

    @on(HardwareReady)
    def _ready(self, msg: HardwareReady) -> None:
        self.hw, self.runs = msg.hw, msg.runs
        self.rows = machine_rows(msg.hw, msg.runs)
        # no padding before the first column: the labels line up with the table's first column
        table = Table(box=None, show_header=False, padding=(0, 2), pad_edge=False)
        table.add_column("", style="bold", no_wrap=True)
        table.add_column("")
        for label, value in self.rows:
            table.add_row(label, Text(value))
        self.query_one("#hw-machine", Static).update(table)
        self.query_one("#runs-title", Label).update(
            f"What it can run (context {msg.n_ctx})")
        runs = self.query_one("#hw-runs", DataTable)
        runs.clear()
        for name, source, size, note, fit in msg.runs:
            if isinstance(fit, str):
                badge, needs = Text(fit, style="red"), "?"
            else:
                badge = Text(fit.label, style=FIT_STYLES.get(fit.kind, ""))
                if note or fit.estimate.approximate:
                    badge.append(" (approximate)", style="dim")
                needs = fmt_bytes(fit.estimate.total_bytes)
            runs.add_row(name, source, fmt_bytes(size), badge, needs)
        if not runs.display:
            runs.display = True
            runs.focus()
        self.query_one("#hw-notes", Static).update("\n".join(msg.hw.notes))
        self.loads += 1

    @on(HardwareFailed)
    def _failed(self, msg: HardwareFailed) -> None:
        self.notify(f"{type(msg.error).__name__}: {msg.error}", title="Hardware detection failed",
                    severity="error", timeout=10)
        self.loads += 1


__all__ = ["HardwareScreen", "HARDWARE_ACTIONS", "machine_rows", "what_it_runs"]
