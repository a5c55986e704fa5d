"""Switch the chat's model (ctrl+o): from the store, a starter model or any path."""
from __future__ import annotations

import pathlib

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label

from ..widgets import model_chooser
from ..widgets.model_chooser import ModelChooser

DIALOG_CSS = pathlib.Path(__file__).with_name("dialogs.tcss")


class ModelsModal(ModalScreen[pathlib.Path | None]):
    """ctrl+o: switch the chat's model (from the store, a starter model or any path)."""

    CSS_PATH = [DIALOG_CSS, model_chooser.STYLESHEET]
    BINDINGS = [Binding("escape", "dismiss(None)", "Close")]

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="models-dialog"):
            yield Label("Models", classes="dialog-title")
            yield ModelChooser(id="chooser")
            yield Label("Enter: open · Esc: close", classes="dialog-hint")

    def on_mount(self) -> None:
        self.query_one("#model-options").focus()

    @on(ModelChooser.Chosen)
    def _chosen(self, event: ModelChooser.Chosen) -> None:
        event.stop()
        self.dismiss(event.path)
