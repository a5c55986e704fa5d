"""A download of the model manager: its state (`Download`) and its row on the Downloads tab."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, ProgressBar, Static

from ..formatting import fmt_bytes, fmt_duration


@dataclass
class Download:
    """One download (and quantization, with `quantize`) of the model manager."""
    dl_id: int
    ref: str
    quantize: bool = False  # fetch an F16/BF16 and quantize it here (one_click)
    cancel: threading.Event = field(default_factory=threading.Event)
    state: str = "starting"  # starting, downloading, done, failed, cancelled
    done: int = 0
    total: int | None = None
    result: object = None
    updates: int = 0  # progress reports shown

    @property
    def active(self) -> bool:
        return self.state in ("starting", "downloading")


class DownloadRow(Vertical, can_focus=True):
    """One download: its name, a progress bar, bytes, rate and ETA."""

    def __init__(self, dl: Download):
        super().__init__(id=f"dl-{dl.dl_id}", classes="download")
        self.dl = dl

    def compose(self) -> ComposeResult:
        name = f"{self.dl.ref} → quantize" if self.dl.quantize else self.dl.ref
        yield Label(name, classes="dl-name", markup=False)
        yield ProgressBar(total=None, show_eta=False, classes="dl-bar")
        yield Static("starting…", classes="dl-stats", markup=False)

    def show(self, p=None) -> None:
        dl = self.dl
        bar = self.query_one(ProgressBar)
        stats = self.query_one(".dl-stats", Static)
        if p is not None:
            done = p.overall_done if p.overall_done is not None else p.done
            total = p.overall_total if p.overall_total is not None else p.total
            dl.done, dl.total = done, total
            bar.update(total=total or None, progress=done)
            parts = [p.stage]
            parts.append(f"{fmt_bytes(done)} / {fmt_bytes(total)}" if total
                         else fmt_bytes(done))
            if p.rate:
                parts.append(f"{fmt_bytes(p.rate)}/s")
            if p.eta is not None and dl.active:
                parts.append(f"ETA {fmt_duration(p.eta)}")
            if p.file_count > 1:
                parts.append(f"file {p.file_index} of {p.file_count}")
            stats.update(" · ".join(parts))
        self.set_class(not dl.active, "finished")
        if dl.state == "done":
            bar.update(total=dl.total or 1, progress=dl.total or 1)
            path = getattr(dl.result, "path", None)
            stats.update(f"done: {path.name if path else ''} ({fmt_bytes(dl.done)}) · "
                         "o opens a chat from the Local tab")
        elif dl.state in ("failed", "cancelled"):
            stats.update(f"{dl.state} at {fmt_bytes(dl.done)}")
