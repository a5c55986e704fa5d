"""The conversation on the chat screen: its messages as ChatMessage widgets, oldest first, and a
hint in their place while there are none."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from .chat_message import ChatMessage


class MessageLog(VerticalScroll):
    """Scrolls with new text while it is at the bottom (once the screen anchors it)."""

    def compose(self) -> ComposeResult:
        yield Static("", id="empty-hint")

    def show_hint(self, visible: bool, text: str) -> None:
        hint = self.query_one("#empty-hint", Static)
        hint.display = visible
        hint.update(text)

    async def clear(self) -> None:
        await self.remove_children(ChatMessage)

    async def show_saved(self, messages, author: str, show_timings: bool) -> None:
        """The messages of a saved chat (conversations.Message) in place of those shown,
        scrolled to the last; `author`: the chat's model, for replies that did not record
        theirs."""
        await self.clear()
        await self.mount_all([ChatMessage.saved(m, author, show_timings) for m in messages])
        self.scroll_end(animate=False)

    async def add(self, message: ChatMessage, follow: bool = False) -> None:
        """Adds a message at the bottom; `follow`: scroll with its text from now on (a new
        reply), even if the user had scrolled up."""
        await self.mount(message)
        if follow:
            self.anchor()

    async def remove_from(self, message_id: int) -> None:
        """Removes a message and every later one."""
        for w in list(self.query(ChatMessage)):
            if w.message_id is not None and w.message_id >= message_id:
                await w.remove()

    def name_replies(self, author: str) -> None:
        """Gives `author` to the replies shown without a model's name."""
        for w in self.query(ChatMessage):
            if w.role == "assistant" and w.author == "Assistant":
                w.author = author
