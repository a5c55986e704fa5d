"""The sidebar of saved chats, most recent first; picking one posts `Picked`."""
from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from ...conversations import Conversation
from ..model_names import model_display_name


class ConversationList(Vertical):
    """The sidebar: saved chats, most recent first."""

    class Picked(Message):
        def __init__(self, conversation_id: int):
            super().__init__()
            self.conversation_id = conversation_id

    def compose(self) -> ComposeResult:
        yield Label("Chats", classes="panel-title")
        yield OptionList(id="chat-list")

    def show(self, conversations: list[Conversation], current: int | None) -> None:
        options = self.query_one("#chat-list", OptionList)
        options.clear_options()
        items = []
        for c in conversations:
            label = Text(c.title or "New chat", overflow="ellipsis", no_wrap=True)
            label.append("\n")
            label.append(model_display_name(c.model_path) if c.model_path else "?", style="dim")
            items.append(Option(label, id=f"c{c.id}"))
        options.add_options(items)
        if current is not None:
            try:
                options.highlighted = options.get_option_index(f"c{current}")
            except Exception:
                pass

    @on(OptionList.OptionSelected, "#chat-list")
    def _picked(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.post_message(self.Picked(int(event.option.id[1:])))
