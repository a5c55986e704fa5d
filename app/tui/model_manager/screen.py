"""The model manager screen (F3): the local store, Hub search, a repository's files with fit
badges, and downloads in progress, one tab each (local_tab, search_tab, files_tab,
downloads_tab).

Each tab runs its Hub, disk and hardware calls in thread workers that only call the models API
and post messages, and owns its state; errors become notifications (never tracebacks). The
screen holds the keys, moves between the tabs (a search result opens in the Files tab) and
follows up a finished download (the Local tab, a chat with it).
"""
from __future__ import annotations

import pathlib

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Input, TabbedContent

from ..dialogs import ConfirmModal
from ..formatting import fmt_bytes
from ..keys import footer_bindings, manager_tab_key
from .download_row import Download, DownloadRow
from .downloads_tab import DownloadsTab
from .files_tab import FilesTab
from .local_tab import LocalTab
from .search_tab import SearchTab

# (key, action, footer label, palette/help title, what it does): drives the screen's bindings
# and its part of the help screen. Keys of one tab only show (and work) on that tab. The tabs
# themselves open with the app's keys (keys.APP_ACTIONS), shown on the tab labels.
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


class ModelsScreen(Screen):
    CSS_PATH = pathlib.Path(__file__).with_name("model_manager.tcss")
    BINDINGS = [Binding(key, action, label, show=True) for key, action, label, _, _ in
                MODELS_ACTIONS] + footer_bindings("f4")
    TITLE = "Models"

    def __init__(self, tab: str = "local"):
        super().__init__()
        self.initial_tab = tab
        # The tabs, made here so that they outlive the screen's DOM: the app cancels the
        # downloads when it quits, after the screen's widgets are gone.
        self.local_tab = LocalTab(f"Local {manager_tab_key('local')}", id="local")
        self.downloads_tab = DownloadsTab(f"Downloads {manager_tab_key('downloads')}",
                                          id="downloads")
        self.search_tab = SearchTab(f"Search {manager_tab_key('search')}", id="search")
        self.files_tab = FilesTab(f"Files {manager_tab_key('files')}", id="files")

    def compose(self) -> ComposeResult:
        yield Header()
        with TabbedContent(initial=self.initial_tab, id="tabs"):
            yield self.local_tab
            yield self.downloads_tab
            yield self.search_tab
            yield self.files_tab
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.sub_title = "model manager"
        self.local_tab.refresh_models()
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
                  "files": "#files-table" if self.files_tab.listing else "#repo-input",
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
            self.search_tab.search(self.query_one("#search-input", Input).value)
        elif tab == "files" and self.files_tab.listing is not None:
            self.open_repo(self.files_tab.listing.repo)
        else:
            self.local_tab.refresh_models()

    # ---------------------------------------------------------------- local models

    @on(DataTable.RowSelected, "#local-table")
    async def _local_selected(self, event: DataTable.RowSelected) -> None:
        await self.action_open_chat()

    async def action_open_chat(self) -> None:
        model = self.local_tab.selected_model()
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
        model = self.local_tab.selected_model()
        if model is None:
            self.notify("No model selected", severity="warning")
            return

        def answer(yes: bool | None) -> None:
            if yes:
                self.local_tab.delete_model(model.name)

        self.app.push_screen(ConfirmModal(
            "Delete model", f"Delete {model.name} ({fmt_bytes(model.size)}) from the store?"),
            answer)

    # ---------------------------------------------------------------- the Hub

    @on(DataTable.RowSelected, "#search-table")
    def _result_selected(self, event: DataTable.RowSelected) -> None:
        results = self.search_tab.results
        if 0 <= event.cursor_row < len(results):
            self.open_repo(results[event.cursor_row].id)

    @on(Input.Submitted, "#repo-input")
    def _repo_submitted(self, event: Input.Submitted) -> None:
        if event.value.strip():
            self.open_repo(event.value.strip())

    def open_repo(self, repo: str) -> None:
        """Shows the Files tab and lists `repo` there (in a worker)."""
        self.query_one(TabbedContent).active = "files"
        n_ctx = self.app.default_settings().n_ctx if hasattr(self.app, "default_settings") \
            else 4096
        self.files_tab.list_repo(repo, n_ctx)

    # ---------------------------------------------------------------- downloads

    @on(DataTable.RowSelected, "#files-table")
    def _file_selected(self, event: DataTable.RowSelected) -> None:
        self.action_download()

    def action_download(self) -> None:
        files = self.files_tab
        quant = files.selected_quant()
        if files.listing is None or quant is None:
            self.notify("Open a repository and select a quantization first",
                        severity="warning")
            return
        ref = f"{files.listing.repo}:{quant}"
        if any(d.ref == ref and d.active for d in self.downloads_tab.downloads.values()):
            self.notify(f"{ref} is already downloading", severity="warning")
            return
        fit = files.fits.get(quant)
        if fit is not None and fit.supported is False:
            self.notify(f"{quant}: the engine cannot run this file "
                        f"({fit.note or 'unsupported type'}); downloading anyway",
                        severity="warning")
        self.start_download(ref)

    def action_quantize(self) -> None:
        files = self.files_tab
        quant = files.selected_quant()
        if files.listing is None or quant is None:
            self.notify("Open a repository and select its F16 or BF16 file first",
                        severity="warning")
            return
        self.start_download(f"{files.listing.repo}:{quant}", quantize=True)

    def start_download(self, ref: str, quantize: bool = False) -> Download:
        return self.downloads_tab.start(ref, quantize)

    @on(DownloadsTab.Ended)
    def _download_ended(self, msg: DownloadsTab.Ended) -> None:
        """A model downloaded: in the Local tab, and a chat with it offered."""
        if msg.download.state == "done":
            self.local_tab.refresh_models()
            if self.app.screen is self:
                self._offer_chat(msg.download.result.path)
        self.refresh_bindings()

    def _offer_chat(self, path: pathlib.Path) -> None:
        async def answer(yes: bool | None) -> None:
            if yes:
                await self.open_chat(path)

        self.app.push_screen(ConfirmModal("Download finished",
                                          f"Open a new chat with {path.name}?",
                                          yes="Open chat"), answer)

    def action_cancel_download(self) -> None:
        if self.downloads_tab.cancel(self.focused) is None:
            self.notify("No download in progress", severity="warning")

    def cancel_all(self) -> None:
        """The app is quitting: every download stops (their worker threads are joined)."""
        self.downloads_tab.cancel_all()
