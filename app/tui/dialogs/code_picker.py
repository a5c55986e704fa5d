"""Which code block of a message to copy, when it has several (ctrl+b)."""
from __future__ import annotations

import pathlib

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

DIALOG_CSS = pathlib.Path(__file__).with_name("dialogs.tcss")


class CodePickerModal(ModalScreen[str | None]):
    """Choose which code block of a message to copy."""

    CSS_PATH = DIALOG_CSS
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, blocks: list[tuple[str, str]]):
        super().__init__()
        self.blocks = blocks

    def compose(self) -> ComposeResult:
        options = []
        for i, (lang, code) in enumerate(self.blocks):
            lines = code.splitlines() or [""]
            t = Text(f"{i + 1}. ", style="bold")
            t.append(lang or "text", style="bold")
            t.append(f"  {len(lines)} line{'s' if len(lines) != 1 else ''}\n", style="dim")
            t.append(lines[0][:70])
            options.append(Option(t, id=str(i)))
        with Vertical(classes="dialog wide", id="code-dialog"):
            yield Label("Copy a code block", classes="dialog-title")
            yield OptionList(*options, id="code-options")
            yield Label("Enter: copy · Esc: cancel", classes="dialog-hint")

    def on_mount(self) -> None:
        self.query_one(OptionList).focus()

    @on(OptionList.OptionSelected)
    def _selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.blocks[int(event.option.id)][1])
