"""The model manager's Files tab: a repository's quantizations, each with whether it fits this
machine (the recommended one starred), and the memory estimate of the one highlighted."""
from __future__ import annotations

from rich.markup import escape
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.message import Message
from textual.widgets import DataTable, Input, Static, TabPane

from llamatui.models import hardware as model_hardware
from llamatui.models import hub as model_hub
from llamatui.models import recommend as model_recommend

from ..errors import describe_hub_error
from ..formatting import ENGINE_LABELS, FIT_STYLES, fit_badge, fmt_bytes, fmt_count
from ..keys import manager_tab_key
from .work_failed import WorkFailed


class RepoListed(Message):
    def __init__(self, req: int, repo: str, listing, rec, hw):
        super().__init__()
        self.req, self.repo, self.listing, self.rec, self.hw = req, repo, listing, rec, hw


def repo_summary(listing, rec) -> str:
    """The lines above the table (markup): the repository's facts and the recommendation."""
    best = rec.best.quant if rec.best else None
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
    return (" · ".join(facts) + "\n" + rec_text + f" at context {rec.n_ctx}"
            + (f" · also {', '.join(extra)}" if extra else "")
            + " · Enter or d downloads the selected row")


def fit_detail(quant: str, fit) -> Text:
    """What a quantization needs on this machine, item by item."""
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
    return lines


class FilesTab(TabPane):
    """The open repository (listed, with this machine's hardware and the recommendation, in a
    worker); Enter or d downloads the highlighted quantization, q quantizes it here (the
    screen's actions). A listing since replaced by another is dropped when it arrives."""

    def __init__(self, title: str, **kwargs):
        super().__init__(title, **kwargs)
        self.listing = None
        self.recommendation = None
        self.fits: dict[str, object] = {}  # quant -> Fit
        self.row_quants: list[str] = []
        self.hw = None  # detected once, for every listing
        self.req = 0
        self.loads = 0  # listings shown (tests wait on it)

    def compose(self) -> ComposeResult:
        yield Input(placeholder="owner/repo, Enter to list its files", id="repo-input")
        yield Static(f"No repository open: search the Hub ({manager_tab_key('search')})"
                     " or type one above.", id="repo-info")
        yield DataTable(id="files-table", cursor_type="row")
        yield Static("", id="fit-detail")

    def on_mount(self) -> None:
        self.query_one("#files-table", DataTable).add_columns(
            " ", "Quant", "Files", "Size", "Fit", "Engine", "Needs")
        self.query_one("#fit-detail").display = False

    def list_repo(self, repo: str, n_ctx: int) -> None:
        """Lists `repo`'s files (in a worker), judged at context size `n_ctx`."""
        self.req += 1
        self.query_one("#repo-input", Input).value = repo
        self.query_one("#repo-info", Static).update(f"Listing {escape(repo)}…")
        self._list_repo(self.req, repo, n_ctx)

    @work(thread=True, exclusive=True, exit_on_error=False, group="repo")
    def _list_repo(self, req: int, repo: str, n_ctx: int) -> None:
        try:
            listing = model_hub.list_files(repo)
            hw = self.hw or model_hardware.detect()
            rec = model_recommend.recommend(listing, hw, n_ctx=n_ctx)
        except BaseException as e:  # noqa: BLE001
            self.post_message(WorkFailed(repo, e, req))
            return
        self.post_message(RepoListed(req, repo, listing, rec, hw))

    @on(RepoListed)
    def _repo_listed(self, msg: RepoListed) -> None:
        if msg.req != self.req:
            return
        self.hw = msg.hw
        self.listing, self.recommendation = msg.listing, msg.rec
        self.fits = {f.quant: f for f in msg.rec.fits}
        best = msg.rec.best.quant if msg.rec.best else None
        table = self.query_one("#files-table", DataTable)
        table.clear()
        self.row_quants = []
        for g in msg.listing.groups:
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
        self.query_one("#repo-info", Static).update(repo_summary(msg.listing, msg.rec))
        if best in self.row_quants:
            table.move_cursor(row=self.row_quants.index(best))
        table.focus()
        self._show_detail()
        self.loads += 1

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
        detail.update(fit_detail(quant, fit))
        detail.display = True

    @on(WorkFailed)
    def _listing_failed(self, msg: WorkFailed) -> None:
        msg.stop()
        if msg.req != self.req:
            return
        self.query_one("#repo-info", Static).update(escape(
            f"Could not list {msg.what}" if self.listing is None else
            f"Could not list {msg.what}; showing {self.listing.repo}"))
        title, text, severity = describe_hub_error(msg.error, msg.what)
        self.notify(text, title=title, severity=severity, timeout=10)
