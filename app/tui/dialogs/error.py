"""An error the user must read: what failed, why, and what to do about it."""
from __future__ import annotations

import pathlib

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static

DIALOG_CSS = pathlib.Path(__file__).with_name("dialogs.tcss")


class ErrorModal(ModalScreen[None]):
    """The error's title, what happened, and a hint of what to do next."""

    CSS_PATH = DIALOG_CSS
    BINDINGS = [Binding("escape,enter", "dismiss(None)", "Close")]

    def __init__(self, title: str, message: str, hint: str = ""):
        super().__init__()
        self.title_text, self.message, self.hint = title, message, hint

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="error-dialog"):
            yield Label(self.title_text, classes="dialog-title", markup=False)
            yield Static(self.message, id="error-message", markup=False)
            if self.hint:
                yield Static(self.hint, id="error-hint", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("OK", variant="primary", id="ok")
            yield Label("Enter/Esc: close", classes="dialog-hint")

    def on_mount(self) -> None:
        self.query_one(Button).focus()

    @on(Button.Pressed)
    def _pressed(self) -> None:
        self.dismiss(None)
