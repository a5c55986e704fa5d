"""The model manager's Local tab: the store's models, and the disk they use."""
from __future__ import annotations

from textual import on, work
from textual.app import ComposeResult
from textual.message import Message
from textual.widgets import DataTable, Static, TabPane

from llamatui.models import store as model_store

from ..errors import describe_hub_error
from ..formatting import fmt_bytes, fmt_opt, fmt_time
from .work_failed import WorkFailed


class LocalListed(Message):
    def __init__(self, models, usage):
        super().__init__()
        self.models, self.usage = models, usage


class Deleted(Message):
    def __init__(self, name: str, removed):
        super().__init__()
        self.name, self.removed = name, removed


def disk_usage_text(n_models: int, u) -> str:
    """The line under the table: how many models, the disk used and free, what is unfinished."""
    text = (f"{n_models} model{'s' * (n_models != 1)}, "
            f"{fmt_bytes(u.models_bytes)} used · {fmt_bytes(u.free_bytes)} free")
    if u.n_partials:
        text += f" · {u.n_partials} partial download(s), {fmt_bytes(u.partial_bytes)}"
    if u.n_incomplete:
        text += (f" · {u.n_incomplete} unfinished file(s) being written or left by an "
                 f"interrupted run, {fmt_bytes(u.incomplete_bytes)}")
    text += f" · store: {u.path}"
    return text if n_models else "No models yet: search the Hub (F3). " + text


class LocalTab(TabPane):
    """The store's models (read in a worker); Enter or o opens a chat with one (the screen's
    action), Delete removes it."""

    def __init__(self, title: str, **kwargs):
        super().__init__(title, **kwargs)
        self.models: list = []
        self.loads = 0  # lists shown (tests wait on it)

    def compose(self) -> ComposeResult:
        yield DataTable(id="local-table", cursor_type="row", zebra_stripes=True)
        yield Static("", id="disk-usage", markup=False)

    def on_mount(self) -> None:
        self.query_one("#local-table", DataTable).add_columns(
            "Name", "Arch", "Params", "Quant", "Context", "Size", "Source", "Last used")

    def refresh_models(self) -> None:
        self._list_models()

    @work(thread=True, exclusive=True, exit_on_error=False, group="local")
    def _list_models(self) -> None:
        try:
            models = [m for m in model_store.list_models() if m.kind == "model"]
            usage = model_store.disk_usage()
        except BaseException as e:  # noqa: BLE001 - shown, never raised
            self.post_message(WorkFailed("reading the store", e))
            return
        self.post_message(LocalListed(models, usage))

    @on(LocalListed)
    def _models_listed(self, msg: LocalListed) -> None:
        table = self.query_one("#local-table", DataTable)
        selected = self.selected_model()
        table.clear()
        self.models = msg.models
        for m in msg.models:
            table.add_row(m.name, m.architecture or "?", fmt_opt(m.parameters),
                          m.quantization or "?", str(m.context_length or "-"), fmt_bytes(m.size),
                          m.repo or m.source, fmt_time(m.last_used), key=m.name)
        names = [m.name for m in msg.models]
        if selected is not None and selected.name in names:
            table.move_cursor(row=names.index(selected.name))
        self.query_one("#disk-usage", Static).update(disk_usage_text(len(msg.models),
                                                                     msg.usage))
        self.loads += 1

    def selected_model(self):
        """The highlighted model (models.store's listing entry), or None."""
        table = self.query_one("#local-table", DataTable)
        if not self.models or table.row_count == 0:
            return None
        row = table.cursor_row
        return self.models[row] if 0 <= row < len(self.models) else None

    @work(thread=True, exclusive=True, exit_on_error=False, group="delete")
    def delete_model(self, name: str) -> None:
        """Deletes the model `name` from the store (in a worker)."""
        try:
            removed = model_store.delete_model(name)
        except BaseException as e:  # noqa: BLE001
            self.post_message(WorkFailed(f"deleting {name}", e))
            return
        self.post_message(Deleted(name, removed))

    @on(Deleted)
    def _model_deleted(self, msg: Deleted) -> None:
        self.notify(f"{msg.name}: {len(msg.removed)} file(s) removed", title="Deleted")
        self.refresh_models()

    @on(WorkFailed)
    def _work_failed(self, msg: WorkFailed) -> None:
        msg.stop()
        title, text, severity = describe_hub_error(msg.error, msg.what)
        self.notify(text, title=title, severity=severity, timeout=10)
