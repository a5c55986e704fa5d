"""The chat on screen as the database keeps it (app/conversations.py's ConversationStore):
its conversation, messages, model and settings. Every change is saved at once, so that a quit
or a crash loses nothing."""
from __future__ import annotations

import pathlib
import time

from ...conversations import ChatSettings, Conversation, Message, export_to_file, title_from


class ChatRecord:
    """`conversation` is None for a new chat until its first message saves it; `model_path` is
    the chat's model (None: none chosen yet), `settings` its settings."""

    def __init__(self, store):
        self.store = store
        self.conversation: Conversation | None = None
        self.messages: list[Message] = []
        self.model_path: str | None = None
        self.settings = ChatSettings()

    @property
    def title(self) -> str:
        return self.conversation.title if self.conversation else "New chat"

    def start_new(self, model_path: str | None, settings: ChatSettings) -> None:
        """An empty chat, on `model_path` (None: the same model as before)."""
        self.conversation = None
        self.messages = []
        if model_path is not None:
            self.model_path = str(model_path)
        self.settings = settings

    def show(self, conversation: Conversation) -> None:
        """A saved chat, with its messages; a chat saved without a model keeps the current one."""
        self.conversation = conversation
        self.messages = self.store.messages(conversation.id)
        self.model_path = conversation.model_path or self.model_path
        self.settings = conversation.settings

    def last(self, role: str) -> Message | None:
        return next((m for m in reversed(self.messages) if m.role == role), None)

    def history(self) -> list[dict]:
        """The chat as the engine reads it: the system prompt, then every message."""
        history = []
        if self.settings.system_prompt.strip():
            history.append({"role": "system", "content": self.settings.system_prompt})
        history += [{"role": m.role, "content": m.content} for m in self.messages]
        return history

    # ---------------------------------------------------------------- changes, saved at once

    def add_user_message(self, text: str) -> tuple[Message, bool]:
        """Saves a message of the user's, and the chat with it if it is new: (the message,
        whether the chat was created)."""
        created = self.conversation is None
        if created:
            self.conversation = self.store.create(self.model_path, self.settings,
                                                  title_from(text))
        message = self.store.add_message(self.conversation.id, "user", text)
        self.messages.append(message)
        return message, created

    def delete_from(self, message_id: int) -> None:
        """Deletes a message and every later one."""
        self.store.delete_messages_from(self.conversation.id, message_id)
        self.messages = [m for m in self.messages if m.id < message_id]

    def save_settings(self, settings: ChatSettings) -> None:
        """The chat's new settings, which new chats start from too."""
        self.settings = settings
        if self.conversation is not None:
            self.store.update(self.conversation.id, settings=settings)
            self.conversation.settings = settings
        self.store.set_state("default_settings", settings.to_json())

    def save_model(self) -> bool:
        """Saves a switch of the chat's model (once the new model has loaded); whether there
        was one."""
        if self.conversation is None or self.conversation.model_path == self.model_path:
            return False
        self.store.update(self.conversation.id, model_path=self.model_path)
        self.conversation.model_path = self.model_path
        return True

    def delete(self, conversation: Conversation) -> None:
        self.store.delete(conversation.id)

    def export(self, conversation: Conversation, directory: pathlib.Path,
               model_name: str) -> pathlib.Path:
        """Writes `conversation` as saved into `directory`, as Markdown (OSError when it
        cannot); the folder is the next export's default."""
        path = export_to_file(directory, conversation, self.store.messages(conversation.id),
                              model_name)
        self.store.set_state("export_dir", str(directory))
        return path

    # ---------------------------------------------------------------- a reply's row

    def add_reply(self, author: str) -> Message:
        """The row of a reply about to be written (saved as "generating" until it ends)."""
        return self.store.add_message(self.conversation.id, "assistant", "", "generating",
                                      {"model": author})

    def save_reply(self, message_id: int, text: str, finish: str, stats: dict) -> None:
        """A reply's text so far, or as it was stopped."""
        self.store.update_message(message_id, text, finish, stats)

    def keep_reply(self, conversation_id: int, message_id: int, text: str, finish: str,
                   stats: dict) -> None:
        """A finished reply: saved, and one of the chat's messages from now on."""
        self.store.update_message(message_id, text, finish, stats)
        self.messages.append(Message(message_id, conversation_id, "assistant", text,
                                     time.time(), finish, stats))

    def discard_reply(self, conversation_id: int, message_id: int) -> None:
        """A reply stopped or failed before a word: nothing worth keeping."""
        self.store.delete_messages_from(conversation_id, message_id)
