"""The engine panel beside the chat: the model's facts, load progress, and the live numbers of
the reply being written (tokens, speeds, the KV cache's use)."""
from __future__ import annotations

import pathlib
import time

from rich.table import Table
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, ProgressBar, Static

from ..formatting import fmt_bytes, fmt_count
from .chat_message import FINISH_LABELS

STYLESHEET = pathlib.Path(__file__).with_suffix(".tcss")

# The load stage that compiles the engine's kernels (Engine.load's progress names it so)
WARMUP_STAGE = "Warming up (compiles kernels on first run)"


def gpu_fact(info) -> str:
    """The engine panel's GPU line: layers offloaded and VRAM in use, or why the GPU is not used
    when a GPU library is installed ('' on a CPU-only install: nothing to say)."""
    from llamatui.inference import CUPY_MISSING
    n_gpu = getattr(info, "n_gpu_layers", 0)
    if n_gpu:
        return (f"{n_gpu}/{info.n_layer + 1} layers, "
                f"{fmt_bytes(getattr(info, 'vram_bytes', 0))} VRAM")
    note = getattr(info, "gpu_note", "")
    return "" if not note or CUPY_MISSING in note else note


class EnginePanel(Vertical):
    """The model's facts, load progress, and live numbers of the running generation."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.info = None
        self.model_name = ""
        self.stages_seen: list[str] = []  # every load stage shown (tests read it)
        self.load_active = False
        self.status = "No model loaded"
        self.n_prompt = self.n_reused = self.n_generated = 0
        self.prompt_tps = self.gen_tps = self.ttft = None
        self.kv_used = 0
        self.t_start = self.t_gen = None  # generation start; first "prompt" event's arrival
        self.mask_ms: float | None = None  # constraint work per token; None: free text
        self._shown: dict[str, object] = {}  # what each widget shows: unchanged, not redrawn

    def compose(self) -> ComposeResult:
        yield Label("Engine", classes="panel-title")
        yield Static(id="model-facts")
        with Vertical(id="load-box"):
            yield Label("", id="load-stage", markup=False)
            yield ProgressBar(total=3, show_eta=False, id="load-progress")
        yield Label("Run", classes="panel-title")
        yield Static(id="run-stats")
        yield Label("KV cache", id="kv-label")
        yield ProgressBar(total=1, show_eta=False, id="kv-gauge")
        yield Label("", id="kv-detail", markup=False)

    def on_mount(self) -> None:
        self.query_one("#load-box").display = False
        self.refresh_all()

    @property
    def show_timings(self) -> bool:
        return getattr(self.app, "show_timings", True)

    # -- updates from the chat screen

    def begin_load(self, path: str | None) -> None:
        self.load_active = True
        self.info = None
        self.status = "Loading"
        self.stages_seen = []
        self.query_one("#load-box").display = True
        self.query_one("#load-stage", Label).update(
            f"Loading {pathlib.Path(path).name}" if path else "Loading")
        self.query_one("#load-progress", ProgressBar).update(total=3, progress=0)
        self.refresh_all()

    def load_progress(self, stage: str, done: int, total: int) -> None:
        self.stages_seen.append(stage)
        self.query_one("#load-stage", Label).update(stage)
        bar = self.query_one("#load-progress", ProgressBar)
        # After the next refresh: the bar quantizes to its width, unknown until it is laid out.
        self.call_after_refresh(bar.update, total=total or None, progress=done)

    def set_model(self, info, name: str) -> None:
        """info: the engine's ModelInfo; name: what the app calls the model."""
        self.load_active = False
        self.info = info
        self.model_name = name
        self.status = "Ready"
        self.query_one("#load-box").display = False
        self.kv_used = 0
        self.refresh_all()

    def set_unloaded(self, status: str) -> None:
        self.load_active = False
        self.info = None
        self.status = status
        self.query_one("#load-box").display = False
        self.refresh_all()

    def start_generation(self, kv_used: int | None = None) -> None:
        self.status = "Reading prompt"
        self.n_prompt = self.n_reused = self.n_generated = 0
        self.prompt_tps = self.gen_tps = self.ttft = None
        self.t_start, self.t_gen = time.monotonic(), None
        self.mask_ms = None
        self.refresh_all()

    def generation_event(self, event) -> None:
        """A GenerationEvent from the engine."""
        self.n_prompt, self.n_reused = event.n_prompt, event.n_reused
        self.kv_used = event.kv_used
        if event.constrained:
            self.mask_ms = event.mask_ms
        if event.kind == "prompt":
            self.prompt_tps = event.prompt_tps
            self.t_gen = time.monotonic()
            self.status = "Generating"
        elif event.kind == "token":
            self.n_generated = event.n_generated
            self.ttft = event.time_to_first_token
            self.gen_tps = event.gen_tps
        elif event.kind == "done":
            self.n_generated = event.n_generated
            if event.n_generated:
                self.gen_tps = event.gen_tps
                self.ttft = event.time_to_first_token
            self.status = f"Idle ({FINISH_LABELS.get(event.finish_reason, event.finish_reason)})"
            self.t_start = self.t_gen = None
        if event.kind != "token":  # a token's numbers wait for the next tick (4 a second):
            self.refresh_all()  # redrawn per token, the panel took the GIL from the engine

    def end_generation(self, status: str) -> None:
        self.status = status
        self.t_start = self.t_gen = None
        self.refresh_all()

    def tick(self) -> None:
        """Called several times a second while generating: live tokens/s between tokens."""
        if self.t_gen is not None and self.n_generated:
            elapsed = time.monotonic() - self.t_gen
            if elapsed > 0:
                self.gen_tps = self.n_generated / elapsed
        self.refresh_all()

    def set_kv(self, used: int) -> None:
        self.kv_used = used
        self.refresh_all()

    # -- rendering

    def _timing(self, value: float | None, fmt: str) -> str:
        if value is None:
            return "–"
        return fmt.format(value) if self.show_timings else "··"

    def refresh_all(self) -> None:
        if not self.is_mounted:
            return
        info = self.info
        if info is None:
            facts = [("Model", "–")]
        else:
            facts = [("Model", self.model_name),
                     ("File", pathlib.Path(info.path).name),
                     ("Arch", f"{info.architecture}, {info.n_layer} layers"),
                     ("Quant", f"{info.quantization}, {fmt_bytes(info.file_bytes)}"),
                     ("Params", fmt_count(info.n_params)),
                     ("Context", f"{info.n_ctx} (trained {info.n_ctx_train})")]
            gpu = gpu_fact(info)
            if gpu:
                facts.append(("GPU", gpu))
        self._show_table("#model-facts", facts, overflow="fold")

        prompt = f"{self.n_prompt} tok"
        if self.n_reused:
            prompt += f" ({self.n_reused} cached)"
        if self.t_start is not None and self.t_gen is None:
            prompt_tps = self._timing(time.monotonic() - self.t_start, "… {:.1f} s")
        else:
            prompt_tps = self._timing(self.prompt_tps, "{:.1f}")
        run = [("Status", self.status), ("Prompt", prompt), ("Prompt t/s", prompt_tps),
               ("Generated", f"{self.n_generated} tok"),
               ("Gen t/s", self._timing(self.gen_tps, "{:.1f}")),
               ("First token", self._timing(self.ttft, "{:.2f} s"))]
        if self.mask_ms is not None:  # the reply follows a JSON output setting
            run.append(("Constrained", self._timing(self.mask_ms, "mask {:.3f} ms/tok")))
        self._show_table("#run-stats", run)

        if info is None:
            gauge, detail = (1, 0), "–"
        else:
            used = min(self.kv_used, info.n_ctx)
            gauge = (info.n_ctx, used)
            detail = (f"{used} / {info.n_ctx} cells\n"
                      f"{fmt_bytes(info.kv_bytes * used / info.n_ctx)} of "
                      f"{fmt_bytes(info.kv_bytes)} ({info.cache_type_k}/{info.cache_type_v})")
        if self._changed("#kv-gauge", gauge):
            self.query_one("#kv-gauge", ProgressBar).update(total=gauge[0], progress=gauge[1])
        if self._changed("#kv-detail", detail):
            self.query_one("#kv-detail", Label).update(detail)

    def _changed(self, widget_id: str, content) -> bool:
        """Whether `content` differs from what the widget shows (then it is noted as shown):
        an update lays the whole screen out again, so an unchanged one is skipped."""
        if self._shown.get(widget_id) == content:
            return False
        self._shown[widget_id] = content
        return True

    def _show_table(self, widget_id: str, rows: list[tuple[str, str]],
                    overflow: str = "ellipsis") -> None:
        """rows as a two-column grid (dim labels) in the Static `widget_id`, if they changed."""
        if not self._changed(widget_id, rows):
            return
        table = Table.grid(padding=(0, 1))
        table.add_column(style="dim", no_wrap=True)
        table.add_column(overflow=overflow)
        for label, value in rows:
            table.add_row(label, value)
        self.query_one(widget_id, Static).update(table)
