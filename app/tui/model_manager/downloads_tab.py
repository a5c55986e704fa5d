"""The model manager's Downloads tab: downloads in progress and done, each a row with its
progress. A download (or a download and a quantization: one_click) runs in a thread worker that
only reports progress as messages; the handlers here own each download's state."""
from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Static, TabPane

from llamatui.models import download as model_download

from ..errors import describe_hub_error
from ..keys import manager_tab_key
from .download_row import Download, DownloadRow


class DownloadUpdate(Message):
    def __init__(self, dl_id: int, progress):
        super().__init__()
        self.dl_id, self.progress = dl_id, progress


class DownloadFinished(Message):
    def __init__(self, dl_id: int, result=None, error: BaseException | None = None):
        super().__init__()
        self.dl_id, self.result, self.error = dl_id, result, error


class DownloadsTab(TabPane):
    """Every download of this session, in `downloads` (by id)."""

    class Ended(Message):
        """A download ended (done, failed or cancelled): for the screen to follow up."""

        def __init__(self, download: Download):
            super().__init__()
            self.download = download

    def __init__(self, title: str, **kwargs):
        super().__init__(title, **kwargs)
        self.downloads: dict[int, Download] = {}
        self._ids = 0

    def compose(self) -> ComposeResult:
        yield Static("No downloads yet: Enter or d on a quantization starts one.",
                     id="downloads-empty", markup=False)
        yield VerticalScroll(id="downloads-list")

    def start(self, ref: str, quantize: bool = False) -> Download:
        """Downloads `ref` (`owner/repo:QUANT`), quantizing it here when `quantize`."""
        self._ids += 1
        dl = Download(self._ids, ref, quantize)
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
        from ... import one_click  # the quantizer's kernels load only when asked for
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

    def row(self, dl_id: int) -> DownloadRow | None:
        rows = self.query(f"#dl-{dl_id}")
        return rows.first() if rows else None

    @on(DownloadUpdate)
    def _download_update(self, msg: DownloadUpdate) -> None:
        dl = self.downloads.get(msg.dl_id)
        row = self.row(msg.dl_id)
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
        self.post_message(self.Ended(dl))
        row = self.row(msg.dl_id)
        if row is not None:
            row.show()

    def cancel(self, focused) -> Download | None:
        """Cancels the focused download, else the latest one still running; None if none
        is."""
        dl = focused.dl if isinstance(focused, DownloadRow) else None
        if dl is None or not dl.active:
            dl = next((d for d in reversed(self.downloads.values()) if d.active), None)
        if dl is None or not dl.active:
            return None
        dl.cancel.set()
        row = self.row(dl.dl_id)
        if row is not None:
            row.query_one(".dl-stats", Static).update("cancelling…")
        return dl

    def cancel_all(self) -> None:
        for dl in self.downloads.values():
            dl.cancel.set()
