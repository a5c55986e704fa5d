"""The model manager's Search tab: GGUF repositories on the Hub, most downloaded first."""
from __future__ import annotations

from textual import on, work
from textual.app import ComposeResult
from textual.message import Message
from textual.widgets import DataTable, Input, Static, TabPane

from llamatui.models import hub as model_hub

from ..errors import describe_hub_error
from ..formatting import ENGINE_LABELS, fmt_opt
from .work_failed import WorkFailed


class SearchDone(Message):
    def __init__(self, req: int, query: str, results):
        super().__init__()
        self.req, self.query, self.results = req, query, results


class SearchTab(TabPane):
    """A query typed, searched in a worker; Enter on a result opens it in the Files tab (the
    screen's doing). Each search has an id: the answer to a search since replaced is dropped."""

    def __init__(self, title: str, **kwargs):
        super().__init__(title, **kwargs)
        self.results: list = []
        self.req = 0
        self.searches = 0  # searches answered (tests wait on it)

    def compose(self) -> ComposeResult:
        yield Input(placeholder="Search GGUF models on the Hub, Enter to search",
                    id="search-input")
        yield DataTable(id="search-table", cursor_type="row", zebra_stripes=True)
        yield Static("Type a name and press Enter; Enter on a result opens it.",
                     id="search-status", markup=False)

    def on_mount(self) -> None:
        self.query_one("#search-table", DataTable).add_columns(
            "Repository", "Downloads", "Likes", "Updated", "Engine")

    @on(Input.Submitted, "#search-input")
    def _submitted(self, event: Input.Submitted) -> None:
        self.search(event.value)

    def search(self, query: str) -> None:
        self.req += 1
        self.query_one("#search-status", Static).update(f"Searching for {query!r}…")
        self._search(self.req, query.strip())

    @work(thread=True, exclusive=True, exit_on_error=False, group="search")
    def _search(self, req: int, query: str) -> None:
        try:
            results = model_hub.search_models(query or None, sort="downloads", limit=50)
        except BaseException as e:  # noqa: BLE001
            self.post_message(WorkFailed(f"search {query!r}", e, req))
            return
        self.post_message(SearchDone(req, query, results))

    @on(SearchDone)
    def _search_done(self, msg: SearchDone) -> None:
        if msg.req != self.req:
            return
        self.results = msg.results
        table = self.query_one("#search-table", DataTable)
        table.clear()
        for m in msg.results:
            table.add_row(m.id, fmt_opt(m.downloads), fmt_opt(m.likes),
                          (m.last_modified or "")[:10], ENGINE_LABELS[m.engine_runs], key=m.id)
        n = len(msg.results)
        self.query_one("#search-status", Static).update(
            f"{n} repositor{'ies' if n != 1 else 'y'} for {msg.query!r}, most downloaded "
            "first · Enter opens one" if n else f"Nothing found for {msg.query!r}")
        if n:
            table.focus()
        self.searches += 1

    @on(WorkFailed)
    def _search_failed(self, msg: WorkFailed) -> None:
        msg.stop()
        if msg.req != self.req:
            return
        self.query_one("#search-status", Static).update("Search failed")
        title, text, severity = describe_hub_error(msg.error, msg.what)
        self.notify(text, title=title, severity=severity, timeout=10)
