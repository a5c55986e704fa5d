"""A yes/no question before something that cannot be undone (deleting a chat or a model)."""
from __future__ import annotations

import pathlib

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static

DIALOG_CSS = pathlib.Path(__file__).with_name("dialogs.tcss")


class ConfirmModal(ModalScreen[bool]):
    """A question answered yes (`yes` is its button's label) or no (the default)."""

    CSS_PATH = DIALOG_CSS
    BINDINGS = [Binding("escape,n", "dismiss(False)", "No"),
                Binding("y", "dismiss(True)", "Yes")]

    def __init__(self, title: str, question: str, yes: str = "Delete"):
        super().__init__()
        self.title_text, self.question, self.yes = title, question, yes

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="confirm-dialog"):
            yield Label(self.title_text, classes="dialog-title", markup=False)
            yield Static(self.question, id="question", markup=False)
            with Horizontal(classes="buttons"):
                yield Button(self.yes, variant="error", id="yes")
                yield Button("Cancel", id="no")
            yield Label("y: yes · n/Esc: no", classes="dialog-hint")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")
