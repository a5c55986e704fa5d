"""Every key of the app, with what it does (F1)."""
from __future__ import annotations

import pathlib

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

DIALOG_CSS = pathlib.Path(__file__).with_name("dialogs.tcss")


class HelpScreen(ModalScreen[None]):
    """Every key of the app, in a table."""

    CSS_PATH = DIALOG_CSS
    BINDINGS = [Binding("escape,f1,q", "dismiss(None)", "Close")]

    def __init__(self, keys: list[tuple[str, str, str]]):
        """keys: (key, action name, what it does)."""
        super().__init__()
        self.keys = keys

    def compose(self) -> ComposeResult:
        table = Table(box=None, padding=(0, 2), show_header=True, header_style="bold")
        table.add_column("Key", style="bold", no_wrap=True)
        table.add_column("Action", no_wrap=True)
        table.add_column("")
        for key, name, what in self.keys:
            table.add_row(key, name, Text(what, style="dim"))
        with Vertical(classes="dialog wide", id="help-dialog"):
            yield Label("Keys", classes="dialog-title")
            with VerticalScroll():
                yield Static(table, id="help-table")
            yield Label("Every action is also in the command palette (ctrl+p). "
                        "Esc closes this.", classes="dialog-hint")
