"""The model manager screen: the local store, Hub search, a repository's files with fit badges,
and downloads in progress.

Threads: every Hub, disk and hardware call runs in a thread worker that only calls the models
API and posts a message; the handlers here, on the UI thread, own the state. Errors become
notifications (never tracebacks). Requests carry an id so that a late answer to a question
nobody asks any more (another search typed, another repository opened) is dropped.
"""
from __future__ import annotations

import pathlib
import threading
import time
from dataclasses import dataclass, field

from rich.markup import escape
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.message import Message as TMessage
from textual.screen import Screen
from textual.widgets import (DataTable, Footer, Header, Input, Label, ProgressBar, Static,
                             TabbedContent, TabPane)

from llamatui.models import download as model_download
from llamatui.models import hardware as model_hardware
from llamatui.models import hub as model_hub
from llamatui.models import recommend as model_recommend
from llamatui.models import store as model_store

from .keys import footer_bindings, manager_tab_key
from .modals import ConfirmModal
from .widgets import fmt_bytes, fmt_count

# Whether the engine runs a repository or file (the catalog's answer; None: not known yet)
ENGINE_LABELS = {True: Text("runs", style="green"), False: Text("no", style="red"),
                 None: Text("?", style="dim")}

CSS_DIR = pathlib.Path(__file__).parent

# (key, action, footer label, palette/help title, what it does): drives the screen's bindings
# and its part of the help screen. Keys of one tab only show (and work) on that tab. The tabs
# themselves open with the app's keys (tui_keys.APP_ACTIONS), shown on the tab labels.
MODELS_ACTIONS = [
    ("escape", "close", "Back", "Close the model manager", "back to the chat"),
    ("o", "open_chat", "Chat", "Chat with the model",
     "a new chat with the selected local model (also Enter)"),
    ("delete", "delete_model", "Delete", "Delete the model",
     "remove the selected local model from the store"),
    ("d", "download", "Download", "Download the quantization",
     "fetch the selected quantization (also Enter)"),
    ("q", "quantize", "Quantize", "Download and quantize",
     "fetch the selected F16/BF16 file and quantize it here to the type that fits this machine"),
    ("x", "cancel_download", "Cancel", "Cancel the download", "stop the selected download"),
    ("ctrl+r", "refresh", "Refresh", "Refresh", "read the store / the Hub again"),
]
TAB_ONLY = {"open_chat": "local", "delete_model": "local", "download": "files",
            "quantize": "files", "cancel_download": "downloads"}

FIT_STYLES = {"gpu": "bold green", "partial": "bold yellow", "ram": "green",
              "too_large": "bold red"}


def when(ts: float | None) -> str:
    if not ts:
        return "never"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


def fmt_opt(n: int | None) -> str:
    return "-" if n is None else fmt_count(n)


def fmt_duration(s: float | None) -> str:
    if s is None:
        return "?"
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def describe_hub_error(error: BaseException, what: str) -> tuple[str, str, str]:
    """(title, message, severity) of a notification for a failed Hub or store call."""
    text = str(error) or type(error).__name__
    if isinstance(error, model_download.DownloadCancelled):
        return f"Cancelled: {what}", text, "warning"
    if isinstance(error, model_hub.RepoNotFoundError):
        return "Not found", text, "error"
    if isinstance(error, model_hub.GatedRepoError):
        return "Gated repository", f"{text} (accept its terms on huggingface.co and set "\
            "HF_TOKEN)", "error"
    if isinstance(error, model_hub.EntryNotFoundError):
        return "File not found", text, "error"
    if isinstance(error, model_hub.HubUnreachableError):
        return "Hub unreachable (offline?)", text, "error"
    if isinstance(error, model_hub.HubError):
        return f"Hub error: {what}", text, "error"
    if isinstance(error, model_store.StoreError):
        return f"Store error: {what}", text, "error"
    if isinstance(error, ValueError):
        return f"Invalid: {what}", text, "error"
    return f"Failed: {what}", f"{type(error).__name__}: {text}", "error"


def fit_badge(fit, recommended: bool = False) -> Text:
    badge = Text(fit.label, style=FIT_STYLES.get(fit.kind, ""))
    if recommended:
        badge.append("  ★ recommended", style="bold magenta")
    return badge


# messages from the workers ------------------------------------------------------------------

class LocalListed(TMessage):
    def __init__(self, models, usage):
        super().__init__()
        self.models, self.usage = models, usage


class SearchDone(TMessage):
    def __init__(self, req: int, query: str, results):
        super().__init__()
        self.req, self.query, self.results = req, query, results


class RepoListed(TMessage):
    def __init__(self, req: int, repo: str, listing, rec, hw):
        super().__init__()
        self.req, self.repo, self.listing, self.rec, self.hw = req, repo, listing, rec, hw


class WorkFailed(TMessage):
    def __init__(self, what: str, error: BaseException, req: int | None = None,
                 kind: str = ""):
        super().__init__()
        self.what, self.error, self.req, self.kind = what, error, req, kind


class Deleted(TMessage):
    def __init__(self, name: str, removed):
        super().__init__()
        self.name, self.removed = name, removed


class DownloadUpdate(TMessage):
    def __init__(self, dl_id: int, progress):
        super().__init__()
        self.dl_id, self.progress = dl_id, progress


class DownloadFinished(TMessage):
    def __init__(self, dl_id: int, result=None, error: BaseException | None = None):
        super().__init__()
        self.dl_id, self.result, self.error = dl_id, result, error


# downloads ----------------------------------------------------------------------------------

@dataclass
class Download:
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


# the screen -----------------------------------------------------------------------------------

class ModelsScreen(Screen):
    CSS_PATH = CSS_DIR / "models_screen.tcss"
    BINDINGS = [Binding(key, action, label, show=True) for key, action, label, _, _ in
                MODELS_ACTIONS] + footer_bindings("f4")
    TITLE = "Models"

    def __init__(self, tab: str = "local"):
        super().__init__()
        self.initial_tab = tab
        self.local_models: list = []
        self.results: list = []
        self.listing = None
        self.recommendation = None
        self.fits: dict[str, object] = {}  # quant -> Fit
        self.row_quants: list[str] = []
        self.downloads: dict[int, Download] = {}
        self.hw = None
        self.search_req = 0
        self.repo_req = 0
        self._dl_ids = 0
        # counters tests wait on
        self.local_loads = 0
        self.searches = 0
        self.repo_loads = 0

    def compose(self) -> ComposeResult:
        yield Header()
        with TabbedContent(initial=self.initial_tab, id="tabs"):
            with TabPane(f"Local {manager_tab_key('local')}", id="local"):
                yield DataTable(id="local-table", cursor_type="row", zebra_stripes=True)
                yield Static("", id="disk-usage", markup=False)
            with TabPane(f"Downloads {manager_tab_key('downloads')}", id="downloads"):
                yield Static("No downloads yet: Enter or d on a quantization starts one.",
                             id="downloads-empty", markup=False)
                yield VerticalScroll(id="downloads-list")
            with TabPane(f"Search {manager_tab_key('search')}", id="search"):
                yield Input(placeholder="Search GGUF models on the Hub, Enter to search",
                            id="search-input")
                yield DataTable(id="search-table", cursor_type="row", zebra_stripes=True)
                yield Static("Type a name and press Enter; Enter on a result opens it.",
                             id="search-status", markup=False)
            with TabPane(f"Files {manager_tab_key('files')}", id="files"):
                yield Input(placeholder="owner/repo, Enter to list its files", id="repo-input")
                yield Static(f"No repository open: search the Hub ({manager_tab_key('search')})"
                             " or type one above.", id="repo-info")
                yield DataTable(id="files-table", cursor_type="row")
                yield Static("", id="fit-detail")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.sub_title = "model manager"
        local = self.query_one("#local-table", DataTable)
        local.add_columns("Name", "Arch", "Params", "Quant", "Context", "Size", "Source",
                          "Last used")
        self.query_one("#search-table", DataTable).add_columns(
            "Repository", "Downloads", "Likes", "Updated", "Engine")
        self.query_one("#files-table", DataTable).add_columns(
            " ", "Quant", "Files", "Size", "Fit", "Engine", "Needs")
        self.query_one("#fit-detail").display = False
        self.refresh_local()
        self._focus_tab(self.initial_tab)

    # ---------------------------------------------------------------- tabs and keys

    @property
    def tab(self) -> str:
        return self.query_one(TabbedContent).active

    def action_show_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab
        self._focus_tab(tab)

    def _focus_tab(self, tab: str) -> None:
        """Focuses a widget of the tab shown. Always one: a focus left on the hidden tab would
        move to its next widget, and TabbedContent would switch back to the tab of the focus."""
        rows = list(self.query(DownloadRow))
        target = {"local": "#local-table", "search": "#search-input",
                  "files": "#files-table" if self.listing else "#repo-input",
                  "downloads": rows[-1] if rows else "#downloads-list"}[tab]
        (self.query_one(target) if isinstance(target, str) else target).focus()

    @on(TabbedContent.TabActivated)
    def _tab_changed(self, event: TabbedContent.TabActivated) -> None:
        self.refresh_bindings()

    def check_action(self, action: str, parameters) -> bool | None:
        tab = TAB_ONLY.get(action)
        if tab is None:
            return True
        try:
            return self.tab == tab
        except Exception:  # noqa: BLE001 - before compose
            return False

    def action_close(self) -> None:
        self.dismiss(None)

    def action_refresh(self) -> None:
        tab = self.tab
        if tab == "search":
            self._start_search(self.query_one("#search-input", Input).value)
        elif tab == "files" and self.listing is not None:
            self.open_repo(self.listing.repo)
        else:
            self.refresh_local()

    # ---------------------------------------------------------------- local store

    def refresh_local(self) -> None:
        self._list_local()

    @work(thread=True, exclusive=True, exit_on_error=False, group="local")
    def _list_local(self) -> None:
        try:
            models = [m for m in model_store.list_models() if m.kind == "model"]
            usage = model_store.disk_usage()
        except BaseException as e:  # noqa: BLE001 - shown, never raised
            self.post_message(WorkFailed("reading the store", e, kind="local"))
            return
        self.post_message(LocalListed(models, usage))

    @on(LocalListed)
    def _local_listed(self, msg: LocalListed) -> None:
        table = self.query_one("#local-table", DataTable)
        selected = self.selected_local()
        table.clear()
        self.local_models = msg.models
        for m in msg.models:
            table.add_row(m.name, m.architecture or "?", fmt_opt(m.parameters),
                          m.quantization or "?", str(m.context_length or "-"), fmt_bytes(m.size),
                          m.repo or m.source, when(m.last_used), key=m.name)
        if selected is not None and selected.name in [m.name for m in msg.models]:
            table.move_cursor(row=[m.name for m in msg.models].index(selected.name))
        u = msg.usage
        text = (f"{len(msg.models)} model{'s' * (len(msg.models) != 1)}, "
                f"{fmt_bytes(u.models_bytes)} used · {fmt_bytes(u.free_bytes)} free")
        if u.n_partials:
            text += f" · {u.n_partials} partial download(s), {fmt_bytes(u.partial_bytes)}"
        if u.n_incomplete:
            text += (f" · {u.n_incomplete} unfinished file(s) being written or left by an "
                     f"interrupted run, {fmt_bytes(u.incomplete_bytes)}")
        text += f" · store: {u.path}"
        self.query_one("#disk-usage", Static).update(text)
        if not msg.models:
            self.query_one("#disk-usage", Static).update(
                "No models yet: search the Hub (F3). " + text)
        self.local_loads += 1

    def selected_local(self):
        table = self.query_one("#local-table", DataTable)
        if not self.local_models or table.row_count == 0:
            return None
        row = table.cursor_row
        return self.local_models[row] if 0 <= row < len(self.local_models) else None

    @on(DataTable.RowSelected, "#local-table")
    async def _local_selected(self, event: DataTable.RowSelected) -> None:
        await self.action_open_chat()

    async def action_open_chat(self) -> None:
        model = self.selected_local()
        if model is None:
            self.notify("No model selected", severity="warning")
            return
        await self.open_chat(model.path)

    async def open_chat(self, path: pathlib.Path) -> None:
        """Back to the chat screen, with a new chat on this model."""
        app = self.app
        chat = getattr(app, "chat", None)
        if chat is None:
            return
        while app.screen is not chat and len(app.screen_stack) > 1:
            app.pop_screen()
        await chat.open_new_chat(str(path), app.default_settings())

    def action_delete_model(self) -> None:
        model = self.selected_local()
        if model is None:
            self.notify("No model selected", severity="warning")
            return

        def answer(yes: bool | None) -> None:
            if yes:
                self._delete(model.name)

        self.app.push_screen(ConfirmModal(
            "Delete model", f"Delete {model.name} ({fmt_bytes(model.size)}) from the store?"),
            answer)

    @work(thread=True, exclusive=True, exit_on_error=False, group="delete")
    def _delete(self, name: str) -> None:
        try:
            removed = model_store.delete_model(name)
        except BaseException as e:  # noqa: BLE001
            self.post_message(WorkFailed(f"deleting {name}", e, kind="delete"))
            return
        self.post_message(Deleted(name, removed))

    @on(Deleted)
    def _deleted(self, msg: Deleted) -> None:
        self.notify(f"{msg.name}: {len(msg.removed)} file(s) removed", title="Deleted")
        self.refresh_local()

    # ---------------------------------------------------------------- Hub search

    @on(Input.Submitted, "#search-input")
    def _search_submitted(self, event: Input.Submitted) -> None:
        self._start_search(event.value)

    def _start_search(self, query: str) -> None:
        self.search_req += 1
        self.query_one("#search-status", Static).update(f"Searching for {query!r}…")
        self._search(self.search_req, query.strip())

    @work(thread=True, exclusive=True, exit_on_error=False, group="search")
    def _search(self, req: int, query: str) -> None:
        try:
            results = model_hub.search_models(query or None, sort="downloads", limit=50)
        except BaseException as e:  # noqa: BLE001
            self.post_message(WorkFailed(f"search {query!r}", e, req, kind="search"))
            return
        self.post_message(SearchDone(req, query, results))

    @on(SearchDone)
    def _search_done(self, msg: SearchDone) -> None:
        if msg.req != self.search_req:
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

    @on(DataTable.RowSelected, "#search-table")
    def _result_selected(self, event: DataTable.RowSelected) -> None:
        if 0 <= event.cursor_row < len(self.results):
            self.open_repo(self.results[event.cursor_row].id)

    # ---------------------------------------------------------------- a repository's files

    @on(Input.Submitted, "#repo-input")
    def _repo_submitted(self, event: Input.Submitted) -> None:
        if event.value.strip():
            self.open_repo(event.value.strip())

    def open_repo(self, repo: str) -> None:
        """Shows the Files tab and lists `repo` there (in a worker)."""
        self.repo_req += 1
        self.query_one(TabbedContent).active = "files"
        self.query_one("#repo-input", Input).value = repo
        self.query_one("#repo-info", Static).update(f"Listing {escape(repo)}…")
        n_ctx = self.app.default_settings().n_ctx if hasattr(self.app, "default_settings") \
            else 4096
        self._list_repo(self.repo_req, repo, n_ctx)

    @work(thread=True, exclusive=True, exit_on_error=False, group="repo")
    def _list_repo(self, req: int, repo: str, n_ctx: int) -> None:
        try:
            listing = model_hub.list_files(repo)
            hw = self.hw or model_hardware.detect()
            rec = model_recommend.recommend(listing, hw, n_ctx=n_ctx)
        except BaseException as e:  # noqa: BLE001
            self.post_message(WorkFailed(repo, e, req, kind="repo"))
            return
        self.post_message(RepoListed(req, repo, listing, rec, hw))

    @on(RepoListed)
    def _repo_listed(self, msg: RepoListed) -> None:
        if msg.req != self.repo_req:
            return
        self.hw = msg.hw
        listing, rec = msg.listing, msg.rec
        self.listing, self.recommendation = listing, rec
        self.fits = {f.quant: f for f in rec.fits}
        best = rec.best.quant if rec.best else None
        table = self.query_one("#files-table", DataTable)
        table.clear()
        self.row_quants = []
        for g in listing.groups:
            fit = self.fits.get(g.quant)
            is_best = g.quant == best
            star = Text("★" if is_best else "", style="bold magenta")
            quant = Text(g.quant, style="bold magenta" if is_best else "")
            files = g.first.name if len(g.files) == 1 else f"{len(g.files)} files (split)"
            engine = ENGINE_LABELS[fit.supported if fit else g.supported]
            table.add_row(star, quant, files, fmt_bytes(g.size) if g.size else "?",
                          fit_badge(fit, is_best) if fit else Text("size unknown",
                                                                   style="dim"),
                          engine, fmt_bytes(fit.estimate.total_bytes) if fit else "?",
                          key=g.quant)
            self.row_quants.append(g.quant)
        facts = [f"[b]{escape(listing.repo)}[/b]"]
        if listing.downloads is not None:
            facts.append(f"{fmt_count(listing.downloads)} downloads")
        if listing.likes is not None:
            facts.append(f"{fmt_count(listing.likes)} likes")
        if listing.gguf is not None and listing.gguf.architecture:
            facts.append(escape(listing.gguf.architecture))
        if listing.gated:
            facts.append("[yellow]gated[/yellow]")
        if listing.offline:
            facts.append("[yellow]offline: from the local store[/yellow]")
        extra = []
        if listing.mmproj:
            extra.append(f"{len(listing.mmproj)} mmproj")
        if listing.imatrix:
            extra.append(f"{len(listing.imatrix)} imatrix")
        rec_text = (f"recommended: [b magenta]{escape(best)}[/] ({rec.best.label})" if best else
                    "[red]nothing fits this machine[/red]")
        self.query_one("#repo-info", Static).update(
            " · ".join(facts) + "\n" + rec_text + f" at context {rec.n_ctx}"
            + (f" · also {', '.join(extra)}" if extra else "")
            + " · Enter or d downloads the selected row")
        if best in self.row_quants:
            table.move_cursor(row=self.row_quants.index(best))
        table.focus()
        self._show_detail()
        self.repo_loads += 1

    def selected_quant(self) -> str | None:
        table = self.query_one("#files-table", DataTable)
        row = table.cursor_row
        return self.row_quants[row] if 0 <= row < len(self.row_quants) else None

    @on(DataTable.RowHighlighted, "#files-table")
    def _file_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_detail()

    def _show_detail(self) -> None:
        detail = self.query_one("#fit-detail", Static)
        quant = self.selected_quant()
        fit = self.fits.get(quant) if quant else None
        if fit is None:
            detail.display = False
            return
        est = fit.estimate
        lines = Text()
        lines.append(f"{quant}: ", style="bold")
        lines.append(fit.label, style=FIT_STYLES.get(fit.kind, ""))
        lines.append(f" · needs {fmt_bytes(est.total_bytes)} at context {est.n_ctx}")
        if fit.vram_bytes:
            lines.append(f" ({fmt_bytes(fit.vram_bytes)} GPU, {fmt_bytes(fit.ram_bytes)} RAM)")
        if est.approximate:
            lines.append(" · approximate", style="yellow")
        if fit.note:
            lines.append(f"\n{fit.note}", style="dim")
        for name, value, note in est.breakdown():
            lines.append(f"\n  {name:<24}{fmt_bytes(value):>10}")
            if note:
                lines.append(f"  {note}", style="dim")
        detail.update(lines)
        detail.display = True

    @on(DataTable.RowSelected, "#files-table")
    def _file_selected(self, event: DataTable.RowSelected) -> None:
        self.action_download()

    # ---------------------------------------------------------------- downloads

    def action_download(self) -> None:
        quant = self.selected_quant()
        if self.listing is None or quant is None:
            self.notify("Open a repository and select a quantization first",
                        severity="warning")
            return
        ref = f"{self.listing.repo}:{quant}"
        if any(d.ref == ref and d.active for d in self.downloads.values()):
            self.notify(f"{ref} is already downloading", severity="warning")
            return
        fit = self.fits.get(quant)
        if fit is not None and fit.supported is False:
            self.notify(f"{quant}: the engine cannot run this file "
                        f"({fit.note or 'unsupported type'}); downloading anyway",
                        severity="warning")
        self.start_download(ref)

    def action_quantize(self) -> None:
        quant = self.selected_quant()
        if self.listing is None or quant is None:
            self.notify("Open a repository and select its F16 or BF16 file first",
                        severity="warning")
            return
        self.start_download(f"{self.listing.repo}:{quant}", quantize=True)

    def start_download(self, ref: str, quantize: bool = False) -> Download:
        self._dl_ids += 1
        dl = Download(self._dl_ids, ref, quantize)
        self.downloads[dl.dl_id] = dl
        self.query_one("#downloads-empty").display = False
        self.query_one("#downloads-list").mount(DownloadRow(dl))
        self.notify(f"{ref}: see the Downloads tab ({manager_tab_key('downloads')})",
                    title="Downloading and quantizing" if quantize else "Downloading")
        work = self._fetch_and_quantize if quantize else self._download
        self.run_worker(lambda: work(dl), thread=True, exclusive=True,
                        exit_on_error=False, group=f"download-{dl.dl_id}")
        return dl

    def _fetch_and_quantize(self, dl: Download) -> None:
        """Thread worker: one_click's download then quantization, as download progress."""
        from .. import one_click  # the quantizer's kernels load only when asked for
        repo = dl.ref.split(":")[0]

        def progress(stage: str, done: int, total: int) -> None:
            self.post_message(DownloadUpdate(dl.dl_id, model_download.DownloadProgress(
                repo, "", stage, done, total or None)))
        try:
            result = one_click.fetch_and_quantize(dl.ref, progress=progress, cancel=dl.cancel)
        except BaseException as e:  # noqa: BLE001 - cancelled, HubError, QuantizeError, OSError
            self.post_message(DownloadFinished(dl.dl_id, error=e))
            return
        self.post_message(DownloadFinished(dl.dl_id, result=result))

    def _download(self, dl: Download) -> None:
        """Thread worker: the pull, reporting progress as messages."""
        def progress(p) -> None:
            self.post_message(DownloadUpdate(dl.dl_id, p))
        try:
            result = model_download.pull(dl.ref, progress=progress, cancel=dl.cancel)
        except BaseException as e:  # noqa: BLE001 - DownloadCancelled, HubError, OSError
            self.post_message(DownloadFinished(dl.dl_id, error=e))
            return
        self.post_message(DownloadFinished(dl.dl_id, result=result))

    def _row(self, dl_id: int) -> DownloadRow | None:
        rows = self.query(f"#dl-{dl_id}")
        return rows.first() if rows else None

    @on(DownloadUpdate)
    def _download_update(self, msg: DownloadUpdate) -> None:
        dl = self.downloads.get(msg.dl_id)
        row = self._row(msg.dl_id)
        if dl is None or row is None or not dl.active:
            return
        dl.state = "downloading"
        dl.updates += 1
        row.show(msg.progress)

    @on(DownloadFinished)
    def _download_finished(self, msg: DownloadFinished) -> None:
        dl = self.downloads.get(msg.dl_id)
        if dl is None:
            return
        if msg.error is not None:
            cancelled = isinstance(msg.error, model_download.DownloadCancelled) or \
                dl.cancel.is_set()
            dl.state = "cancelled" if cancelled else "failed"
            title, text, severity = describe_hub_error(msg.error, dl.ref)
            self.notify(text, title=title, severity="warning" if cancelled else severity,
                        timeout=10)
        else:
            dl.state, dl.result = "done", msg.result
            path = msg.result.path
            if dl.total is None:
                files = getattr(msg.result, "files", None) or [path]
                dl.done = dl.total = sum(f.stat().st_size for f in files if f.exists())
            self.notify(f"{path.name} is in your model store", title="Downloaded")
            self.refresh_local()
            if self.app.screen is self:
                self._offer_chat(path)
        row = self._row(msg.dl_id)
        if row is not None:
            row.show()
        self.refresh_bindings()

    def _offer_chat(self, path: pathlib.Path) -> None:
        async def answer(yes: bool | None) -> None:
            if yes:
                await self.open_chat(path)

        self.app.push_screen(ConfirmModal("Download finished",
                                          f"Open a new chat with {path.name}?",
                                          yes="Open chat"), answer)

    def action_cancel_download(self) -> None:
        focused = self.focused
        dl = focused.dl if isinstance(focused, DownloadRow) else None
        if dl is None or not dl.active:
            dl = next((d for d in reversed(self.downloads.values()) if d.active), None)
        if dl is None or not dl.active:
            self.notify("No download in progress", severity="warning")
            return
        dl.cancel.set()
        row = self._row(dl.dl_id)
        if row is not None:
            row.query_one(".dl-stats", Static).update("cancelling…")

    def cancel_all(self) -> None:
        for dl in self.downloads.values():
            dl.cancel.set()

    # ---------------------------------------------------------------- errors

    @on(WorkFailed)
    def _work_failed(self, msg: WorkFailed) -> None:
        if msg.kind == "search":
            if msg.req != self.search_req:
                return
            self.query_one("#search-status", Static).update("Search failed")
        if msg.kind == "repo":
            if msg.req != self.repo_req:
                return
            self.query_one("#repo-info", Static).update(escape(
                f"Could not list {msg.what}" if self.listing is None else
                f"Could not list {msg.what}; showing {self.listing.repo}"))
        title, text, severity = describe_hub_error(msg.error, msg.what)
        self.notify(text, title=title, severity=severity, timeout=10)


__all__ = ["ModelsScreen", "MODELS_ACTIONS", "describe_hub_error"]
