"""Widgets of the chat app: messages, the engine panel, the chat list and the model chooser."""
from __future__ import annotations

import pathlib
import re
import threading
import time

from markdown_it import MarkdownIt
from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input, Label, Markdown, OptionList, ProgressBar, Static
from textual.widgets.option_list import Option

from llamatui.models import store as model_store
from llamatui.models.hub import quant_of

from ..conversations import Conversation

WARMUP_STAGE = "Warming up (compiles kernels on first run)"


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def gpu_fact(info) -> str:
    """The engine panel's GPU line: layers offloaded and VRAM in use, or why the GPU is not used
    when a GPU library is installed ('' on a CPU-only install: nothing to say)."""
    from llamatui.inference.cuda.probe import CUPY_MISSING
    n_gpu = getattr(info, "n_gpu_layers", 0)
    if n_gpu:
        return (f"{n_gpu}/{info.n_layer + 1} layers, "
                f"{fmt_bytes(getattr(info, 'vram_bytes', 0))} VRAM")
    note = getattr(info, "gpu_note", "")
    return "" if not note or CUPY_MISSING in note else note


def fmt_count(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.1f}B"
    if n >= 1e6:
        return f"{n / 1e6:.0f}M"
    return f"{n / 1e3:.0f}K" if n >= 1e3 else str(n)


# --------------------------------------------------------------------------------------------
# what a model is called, and whether it chats

_SHARD_SUFFIX = re.compile(r"-\d{5}-of-\d{5}$")
_TITLE_QUANT = re.compile(r"\s*\([^()]*\)$")  # the catalogue's "(Q4_1)"


def starter_for(path) -> model_store.StarterModel | None:
    """The starter catalogue's entry of a model file, if it is one."""
    name = pathlib.Path(path).name
    return next((m for m in model_store.STARTER_MODELS.values() if m.filename == name), None)


def model_display_name(path, general_name: str | None = None) -> str:
    """What the app calls a model. GGUF's general.name is often the converter's guess from raw
    metadata ("Smollm2 135M 8k Lc100K Mix1 Ep2" for SmolLM2-135M-Instruct), so, in order: the
    starter catalogue's title, the file's name when its author capitalised it
    ("SmolLM2-135M-Instruct.Q4_1.gguf" → "SmolLM2 135M Instruct"), general.name, the file name.
    """
    path = pathlib.Path(path)
    starter = starter_for(path)
    if starter is not None:
        return _TITLE_QUANT.sub("", starter.title)
    stem = _SHARD_SUFFIX.sub("", path.name.removesuffix(".gguf"))
    quant = quant_of(stem)
    cut = stem.upper().rfind(quant) if quant else -1
    if cut > 0:  # the quantization and the separator before it
        stem = stem[:cut].rstrip("-_. ")
    words = re.sub(r"[-_ ]+", " ", stem).strip()
    if words and words != words.lower():
        return words
    return general_name or words or path.name


BASE_MODEL = "base model: it continues your text rather than chatting"


def base_model_hint(path, no_chat_template: bool) -> str | None:
    """A warning for a model that will not chat well, from the starter catalogue or from the
    model having no chat template (the engine then speaks ChatML to it, as llama.cpp does)."""
    starter = starter_for(path)
    if starter is not None and starter.base_model:
        return f"{model_display_name(path)} is a {BASE_MODEL}."
    if no_chat_template:
        return f"This model has no chat template, so it may be a {BASE_MODEL}."
    return None


# --------------------------------------------------------------------------------------------
# messages

FINISH_LABELS = {"eog": "done", "length": "max tokens", "stop": "stop string",
                 "cancelled": "stopped", "context_full": "context full", "error": "error",
                 "generating": "interrupted"}


def _soft_breaks_to_hard(state) -> None:
    for token in state.tokens:
        for child in token.children or ():
            if child.type == "softbreak":
                child.type = "hardbreak"


def chat_markdown() -> MarkdownIt:
    """The parser of messages: Textual's default ("gfm-like") keeping every line break. Chat
    apps show a reply's single newlines as breaks (a poem, an address), where CommonMark joins
    the lines into one paragraph; code blocks are not inline text and keep theirs anyway."""
    parser = MarkdownIt("gfm-like")
    parser.core.ruler.push("soft_breaks_to_hard", _soft_breaks_to_hard)
    return parser


class ChatMessage(Vertical, can_focus=True):
    """One message: who, the Markdown body and (for replies) how it ended."""

    BINDINGS = [("up", "neighbour(-1)", "Previous"), ("down", "neighbour(1)", "Next")]

    def __init__(self, role: str, content: str = "", *, author: str = "",
                 meta: str = "", message_id: int | None = None):
        super().__init__(classes=f"message {role}")
        self.role = role
        self.content = content
        self.author = author or ("You" if role == "user" else "Assistant")
        self.message_id = message_id
        self._meta = meta

    def compose(self) -> ComposeResult:
        yield Label(self.author, classes="author", markup=False)
        yield Markdown(self.content, classes="body", parser_factory=chat_markdown)
        if self.role == "assistant":
            yield Label(self._meta, classes="meta", markup=False)

    @property
    def markdown(self) -> Markdown:
        return self.query_one(".body", Markdown)

    def set_meta(self, text: str) -> None:
        self._meta = text
        if self.role == "assistant" and self.is_mounted:
            self.query_one(".meta", Label).update(text)

    @property
    def meta(self) -> str:
        return self._meta

    def action_neighbour(self, step: int) -> None:
        siblings = [w for w in self.parent.children if isinstance(w, ChatMessage)]
        i = siblings.index(self) + step
        if 0 <= i < len(siblings):
            siblings[i].focus()
            siblings[i].scroll_visible()
        elif step > 0:
            self.screen.focus_next(Input)


def reply_meta(n_generated: int, finish: str | None, gen_tps: float | None,
               show_timings: bool) -> str:
    parts = [f"{n_generated} token{'s' if n_generated != 1 else ''}"]
    if show_timings and gen_tps:
        parts.append(f"{gen_tps:.1f} tok/s")
    if finish:
        parts.append(FINISH_LABELS.get(finish, finish))
    return " · ".join(parts)


# --------------------------------------------------------------------------------------------
# engine panel


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


# --------------------------------------------------------------------------------------------
# chat list


class ConversationList(Vertical):
    """The sidebar: saved chats, most recent first."""

    class Picked(Message):
        def __init__(self, conversation_id: int):
            super().__init__()
            self.conversation_id = conversation_id

    def compose(self) -> ComposeResult:
        yield Label("Chats", classes="panel-title")
        yield OptionList(id="chat-list")

    def show(self, conversations: list[Conversation], current: int | None) -> None:
        options = self.query_one("#chat-list", OptionList)
        options.clear_options()
        items = []
        for c in conversations:
            label = Text(c.title or "New chat", overflow="ellipsis", no_wrap=True)
            label.append("\n")
            label.append(model_display_name(c.model_path) if c.model_path else "?", style="dim")
            items.append(Option(label, id=f"c{c.id}"))
        options.add_options(items)
        if current is not None:
            try:
                options.highlighted = options.get_option_index(f"c{current}")
            except Exception:
                pass

    @on(OptionList.OptionSelected, "#chat-list")
    def _picked(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.post_message(self.Picked(int(event.option.id[1:])))


# --------------------------------------------------------------------------------------------
# model chooser (first run, and ctrl+o)


class PullAborted(Exception):
    pass


def store_models(store: pathlib.Path | None = None) -> list[tuple[pathlib.Path, str]]:
    """The usable models in the store as (path, one-line description), by name. Uses the
    store's own listing (Hub downloads in subfolders, split models as one) where it has one."""
    store = store or model_store.store_dir()
    if not store.is_dir():
        return []
    list_models = getattr(model_store, "list_models", None)
    if list_models is None:
        return [(p, fmt_bytes(p.stat().st_size)) for p in sorted(store.glob("*.gguf"))
                if not p.name.startswith(".")]
    out = []
    for m in list_models(store):
        if m.kind != "model" or m.error:
            continue
        facts = [fmt_bytes(m.size)]
        if m.quantization:
            facts.append(m.quantization)
        if m.parameters:
            facts.append(f"{fmt_count(m.parameters)} parameters")
        out.append((m.path, " · ".join(facts)))
    return out


def mark_used(path: str) -> None:
    """Tells the store a model of its own was just loaded (for `llamatui ls`)."""
    mark = getattr(model_store, "mark_used", None)
    try:
        inside = pathlib.Path(path).resolve().is_relative_to(model_store.store_dir().resolve())
    except OSError:
        inside = False
    if mark is not None and inside:
        mark(path)


class ModelChooser(Vertical):
    """Models in the store, the starter models (fetched with a progress bar), or a path."""

    class Chosen(Message):
        def __init__(self, path: pathlib.Path):
            super().__init__()
            self.path = path

    class PullProgress(Message, bubble=False):
        def __init__(self, stage: str, done: int, total: int):
            super().__init__()
            self.stage, self.done, self.total = stage, done, total

    class PullDone(Message, bubble=False):
        def __init__(self, name: str, path: pathlib.Path | None, error: BaseException | None):
            super().__init__()
            self.name, self.path, self.error = name, path, error

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.pulling: str | None = None
        self._abort = threading.Event()  # set when the chooser goes away mid-download

    def on_unmount(self) -> None:
        self._abort.set()

    def compose(self) -> ComposeResult:
        yield OptionList(id="model-options")
        with Vertical(id="pull-box"):
            yield Label("", id="pull-stage", markup=False)
            yield ProgressBar(show_eta=False, id="pull-progress")
        yield Input(placeholder="…or type the path of a .gguf file and press Enter",
                    id="model-path")

    def on_mount(self) -> None:
        self.query_one("#pull-box").display = False
        self.refresh_options()

    def refresh_options(self) -> None:
        options = self.query_one("#model-options", OptionList)
        options.clear_options()
        local = store_models()
        store = model_store.store_dir()
        have = {p.name for p, _ in local}
        items: list = []
        for p, facts in local:
            t = Text(p.relative_to(store).as_posix() if p.is_relative_to(store) else p.name,
                     style="bold")
            t.append(f"  {facts}", style="dim")
            t.append("\nIn your model store", style="dim")
            starter = starter_for(p)
            if starter is not None and starter.base_model:
                t.append(" · ", style="dim")
                t.append("base model", style="yellow")
            items.append(Option(t, id=f"file:{p}"))
        for m in model_store.STARTER_MODELS.values():
            if m.filename in have:
                continue
            t = Text(m.title, style="bold")
            t.append(f"  {fmt_bytes(m.size)}  ", style="dim")
            t.append("download", style="reverse")
            t.append(f"\n{m.description}", style="dim")
            if m.base_model:
                t.append(f"\nA {BASE_MODEL}.", style="yellow")
            items.append(Option(t, id=f"starter:{m.name}"))
        options.add_options(items)
        if items:
            options.highlighted = 0

    @on(OptionList.OptionSelected, "#model-options")
    def _selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        kind, _, value = event.option.id.partition(":")
        if kind == "file":
            self.post_message(self.Chosen(pathlib.Path(value)))
        elif self.pulling:
            self.notify(f"Already downloading {self.pulling}", severity="warning")
        else:
            self.start_pull(value)

    @on(Input.Submitted, "#model-path")
    def _path(self, event: Input.Submitted) -> None:
        event.stop()
        raw = event.value.strip()
        if not raw:
            return
        path = pathlib.Path(raw).expanduser()
        if not path.is_file():
            self.notify(f"No file at {path}", title="Can't open model", severity="error")
            return
        self.post_message(self.Chosen(path))

    def start_pull(self, name: str) -> None:
        self.pulling = name
        self.query_one("#pull-box").display = True
        self.query_one("#pull-stage", Label).update(f"Fetching {name}…")
        self.query_one("#pull-progress", ProgressBar).update(total=None, progress=0)
        self._pull(name)

    @work(thread=True, exclusive=True, exit_on_error=False, group="pull")
    def _pull(self, name: str) -> None:
        def progress(stage: str, done: int, total: int) -> None:
            if self._abort.is_set():  # pull_starter cleans up its partial files on the way out
                raise PullAborted("the download was abandoned")
            self.post_message(self.PullProgress(stage, done, total))
        try:
            # Looked up on the module at call time: the real pull, or the one a test put there.
            path = model_store.pull_starter(name, progress=progress)
        except BaseException as e:  # StoreError, OSError, ...: shown, never raised
            self.post_message(self.PullDone(name, None, e))
        else:
            self.post_message(self.PullDone(name, path, None))

    @on(PullProgress)
    def _pull_progress(self, msg: PullProgress) -> None:
        self.query_one("#pull-stage", Label).update(msg.stage)
        self.query_one("#pull-progress", ProgressBar).update(total=msg.total or None,
                                                            progress=msg.done)

    @on(PullDone)
    def _pull_done(self, msg: PullDone) -> None:
        self.pulling = None
        self.query_one("#pull-box").display = False
        if msg.error is not None:
            self.notify(str(msg.error) or type(msg.error).__name__,
                        title=f"Could not fetch {msg.name}", severity="error", timeout=10)
            return
        self.notify(f"{msg.path.name} is in your model store", title="Downloaded")
        self.refresh_options()
        self.post_message(self.Chosen(msg.path))
