"""Edit the last message of a chat before sending it again (F2)."""
from __future__ import annotations

import pathlib

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, TextArea

DIALOG_CSS = pathlib.Path(__file__).with_name("dialogs.tcss")


class EditModal(ModalScreen[str | None]):
    """Edit the last message before sending it again."""

    CSS_PATH = DIALOG_CSS
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel"),
                Binding("ctrl+s", "resend", "Resend", priority=True)]

    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="edit-dialog"):
            yield Label("Edit and resend", classes="dialog-title")
            yield TextArea(self.text, id="edit-text", soft_wrap=True)
            with Horizontal(classes="buttons"):
                yield Button("Resend", variant="primary", id="resend")
                yield Button("Cancel", id="cancel")
            yield Label("ctrl+s: resend · Esc: cancel", classes="dialog-hint")

    def on_mount(self) -> None:
        area = self.query_one(TextArea)
        area.focus()
        area.move_cursor(area.document.end)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "resend":
            self.action_resend()
        else:
            self.dismiss(None)

    def action_resend(self) -> None:
        text = self.query_one(TextArea).text
        if not text.strip():
            self.notify("The message is empty", severity="warning")
            return
        self.dismiss(text)
