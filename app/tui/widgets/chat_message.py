"""One message of a chat: who wrote it, its Markdown, and (for a reply) how it ended."""
from __future__ import annotations

import pathlib

from markdown_it import MarkdownIt
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Input, Label, Markdown

STYLESHEET = pathlib.Path(__file__).with_suffix(".tcss")

# How a reply ended (the engine's finish reasons, and the app's own), as a reply's line says it
FINISH_LABELS = {"eog": "done", "length": "max tokens", "stop": "stop string",
                 "cancelled": "stopped", "context_full": "context full", "error": "error",
                 "generating": "interrupted"}


def _soft_breaks_to_hard(state) -> None:
    for token in state.tokens:
        for child in token.children or ():
            if child.type == "softbreak":
                child.type = "hardbreak"


def chat_markdown() -> MarkdownIt:
    """The parser of messages: Textual's default ("gfm-like") keeping every line break. Chat
    apps show a reply's single newlines as breaks (a poem, an address), where CommonMark joins
    the lines into one paragraph; code blocks are not inline text and keep theirs anyway."""
    parser = MarkdownIt("gfm-like")
    parser.core.ruler.push("soft_breaks_to_hard", _soft_breaks_to_hard)
    return parser


def reply_meta(n_generated: int, finish: str | None, gen_tps: float | None,
               show_timings: bool) -> str:
    """A reply's line under its text: tokens, speed (unless timings are hidden), how it ended."""
    parts = [f"{n_generated} token{'s' if n_generated != 1 else ''}"]
    if show_timings and gen_tps:
        parts.append(f"{gen_tps:.1f} tok/s")
    if finish:
        parts.append(FINISH_LABELS.get(finish, finish))
    return " · ".join(parts)


class ChatMessage(Vertical, can_focus=True):
    """One message: who, the Markdown body and (for replies) how it ended."""

    BINDINGS = [("up", "neighbour(-1)", "Previous"), ("down", "neighbour(1)", "Next")]

    def __init__(self, role: str, content: str = "", *, author: str = "",
                 meta: str = "", message_id: int | None = None):
        super().__init__(classes=f"message {role}")
        self.role = role
        self.content = content
        self.author = author or ("You" if role == "user" else "Assistant")
        self.message_id = message_id
        self._meta = meta

    @classmethod
    def saved(cls, message, author: str, show_timings: bool) -> ChatMessage:
        """The widget of a saved message (conversations.Message); `author`: the chat's model,
        for a reply that did not record its own."""
        meta = ""
        if message.role == "assistant":
            stats = message.stats
            meta = reply_meta(stats.get("n_generated", 0), message.finish_reason,
                              stats.get("gen_tps"), show_timings)
        return cls(message.role, message.content, meta=meta, message_id=message.id,
                   author="You" if message.role == "user" else
                   message.stats.get("model") or author)

    def compose(self) -> ComposeResult:
        yield Label(self.author, classes="author", markup=False)
        yield Markdown(self.content, classes="body", parser_factory=chat_markdown)
        if self.role == "assistant":
            yield Label(self._meta, classes="meta", markup=False)

    @property
    def markdown(self) -> Markdown:
        return self.query_one(".body", Markdown)

    def set_meta(self, text: str) -> None:
        self._meta = text
        if self.role == "assistant" and self.is_mounted:
            self.query_one(".meta", Label).update(text)

    @property
    def meta(self) -> str:
        return self._meta

    def action_neighbour(self, step: int) -> None:
        siblings = [w for w in self.parent.children if isinstance(w, ChatMessage)]
        i = siblings.index(self) + step
        if 0 <= i < len(siblings):
            siblings[i].focus()
            siblings[i].scroll_visible()
        elif step > 0:
            self.screen.focus_next(Input)
