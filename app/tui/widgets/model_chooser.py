"""The model chooser (first run, and ctrl+o): the store's models, the starter models (fetched
with a progress bar, in a worker that only posts messages), or the path of a file."""
from __future__ import annotations

import pathlib
import threading

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input, Label, OptionList, ProgressBar
from textual.widgets.option_list import Option

from llamatui.models import store as model_store

from ..formatting import fmt_bytes
from ..local_models import store_models
from ..model_names import BASE_MODEL, starter_for

STYLESHEET = pathlib.Path(__file__).with_suffix(".tcss")


class PullAborted(Exception):
    """The chooser went away while a starter model was downloading."""


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
