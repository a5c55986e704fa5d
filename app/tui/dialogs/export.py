"""The folder to export a chat into, as Markdown (ctrl+g)."""
from __future__ import annotations

import pathlib

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

DIALOG_CSS = pathlib.Path(__file__).with_name("dialogs.tcss")


class ExportModal(ModalScreen[pathlib.Path | None]):
    """The folder to write the chat `title` into, starting from `directory`."""

    CSS_PATH = DIALOG_CSS
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, directory: pathlib.Path, title: str):
        super().__init__()
        self.directory, self.chat_title = directory, title

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="export-dialog"):
            yield Label("Export chat to Markdown", classes="dialog-title")
            yield Static(f"“{self.chat_title}” will be written as a .md file into this folder "
                         "(created if needed):", id="export-text", markup=False)
            yield Input(str(self.directory), id="export-dir")
            with Horizontal(classes="buttons"):
                yield Button("Export", variant="primary", id="export")
                yield Button("Cancel", id="cancel")
            yield Label("Enter: export · Esc: cancel", classes="dialog-hint")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._export()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "export":
            self._export()
        else:
            self.dismiss(None)

    def _export(self) -> None:
        raw = self.query_one(Input).value.strip()
        if not raw:
            self.notify("Give a folder", severity="warning")
            return
        self.dismiss(pathlib.Path(raw).expanduser())
