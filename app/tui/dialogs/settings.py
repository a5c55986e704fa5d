"""The chat's settings (ctrl+s): system prompt, sampling options, context size, chat template
and JSON output, each field checked as it is typed."""
from __future__ import annotations

import pathlib

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.validation import ValidationResult, Validator
from textual.widgets import Button, Input, Label, TextArea

from ...conversations import ChatSettings, SettingsError

DIALOG_CSS = pathlib.Path(__file__).with_name("dialogs.tcss")


class _FieldValidator(Validator):
    """Checks one field of the form as it is typed (the others at their defaults), so that its
    help line turns into what is wrong with it."""

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

    CSS_PATH = DIALOG_CSS
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
