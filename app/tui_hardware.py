"""The hardware screen: what this machine has (RAM, CPU, SIMD, GPUs, free disk) and what it can
run (the starter models and the store's models, each with its fit label).

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
from llamatui.models import recommend as model_recommend
from llamatui.models import store as model_store

from .tui_keys import footer_bindings
from .tui_models import FIT_STYLES
from .tui_widgets import fmt_bytes

CSS_DIR = pathlib.Path(__file__).parent

HARDWARE_ACTIONS = [
    ("escape", "close", "Back", "Close the hardware screen", "back to the chat"),
    ("ctrl+r", "refresh", "Refresh", "Detect the hardware again",
     "read RAM, GPUs and disk again"),
]


def machine_rows(hw) -> list[tuple[str, str]]:
    """(label, value) rows describing a HardwareInfo."""
    rows = [("System", f"{hw.os} ({hw.machine}), Python {hw.python}"),
            ("CPU", hw.cpu_model or "?"),
            ("Cores", f"{hw.physical_cores or '?'} physical, {hw.logical_cores or '?'} logical"),
            ("SIMD", " ".join(hw.simd) or "none detected"),
            ("RAM", f"{fmt_bytes(hw.ram_available) if hw.ram_available is not None else '?'}"
                    f" available of "
                    f"{fmt_bytes(hw.ram_total) if hw.ram_total is not None else '?'}")]
    if hw.gpus:
        for g in hw.gpus:
            vram = (f"{fmt_bytes(g.vram_free)} free of {fmt_bytes(g.vram_total)}"
                    if g.vram_total is not None and g.vram_free is not None else "VRAM unknown")
            cc = f", compute {g.compute_capability}" if g.compute_capability else ""
            rows.append((f"GPU {g.index}", f"{g.name}: {vram}{cc} (via {g.backend})"))
    else:
        rows.append(("GPU", "none detected (models run on the CPU)"))
    if hw.disk_free is not None:
        rows.append(("Disk", f"{fmt_bytes(hw.disk_free)} free of "
                             f"{fmt_bytes(hw.disk_total or 0)} at {hw.disk_path}"))
    else:
        rows.append(("Disk", "unknown"))
    return rows


def what_it_runs(hw, n_ctx: int) -> list[tuple[str, str, int, str, object]]:
    """(model, source, size, note, Fit or error text) for the starter models and the store's
    models, at context n_ctx."""
    out = []
    store = model_store.store_dir()
    starters = {s.filename: s for s in model_store.STARTER_MODELS.values()}
    local = [m for m in model_store.list_models() if m.kind == "model"] \
        if store.is_dir() else []
    local_names = {m.path.name for m in local}
    for s in model_store.STARTER_MODELS.values():
        if s.filename in local_names:
            continue  # listed with the store's models below
        try:
            est = model_recommend.estimate(
                model_recommend.ModelShape.from_hub_info(None, s.size), n_ctx)
            fit = model_recommend.assess(est, hw)
        except Exception as e:  # noqa: BLE001
            fit = str(e)
        out.append((s.title, "starter (not downloaded)", s.size, "estimate from size", fit))
    for m in local:
        source = "starter" if m.path.name in starters else (m.repo or m.source)
        if m.error:
            out.append((m.name, source, m.size, "", f"unreadable: {m.error}"))
            continue
        try:
            fit = model_recommend.assess(model_recommend.estimate_file(m.path, n_ctx), hw)
        except Exception as e:  # noqa: BLE001
            fit = f"{type(e).__name__}: {e}"
        out.append((m.name, source, m.size, "", fit))
    return out


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
        self.rows = machine_rows(msg.hw)
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
