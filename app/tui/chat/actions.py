"""The chat screen's actions: one table of its keys (`CHAT_ACTIONS`), and `ChatActions`, the
methods they run, which ChatScreen inherits. An action that needs an answer opens a dialog and
applies what it returns; the screen's parts do the work (its `record`, `session`, `reply`,
`log_view`), and the screen's own methods open chats and send messages."""
from __future__ import annotations

import pathlib

from ...conversations import ChatSettings, code_blocks
from ..dialogs import (CodePickerModal, ConfirmModal, EditModal, ExportModal, ModelsModal,
                       SettingsModal)
from ..widgets.chat_message import ChatMessage

# (key, action, footer label, palette title, what it does): one table drives the bindings, the
# command palette and the help screen, so the three cannot disagree. The footer shows all but
# NOT_IN_FOOTER (every key does not fit in 120 columns); F1 and ctrl+p list them all. The keys
# that open other screens (F3 models, F4 hardware, F5 downloads...) are the app's: keys.py.
CHAT_ACTIONS = [
    ("escape", "stop", "Stop", "Stop generating",
     "stop the reply being written (keeps what was written)"),
    ("ctrl+r", "regenerate", "Retry", "Regenerate reply", "write the last reply again"),
    ("f2", "edit_last", "Edit", "Edit and resend last message",
     "edit your last message and send it again"),
    ("ctrl+n", "new_chat", "New", "New chat", "start a new conversation"),
    ("f8", "delete_chat", "Delete", "Delete chat", "delete this conversation"),
    ("ctrl+y", "copy_message", "Copy", "Copy message",
     "copy the focused message, or the last reply"),
    ("ctrl+b", "copy_code", "Copy code", "Copy code block",
     "copy a code block of the focused message or the last reply"),
    ("ctrl+s", "settings", "Settings", "Chat settings",
     "system prompt, sampling, context size of this chat"),
    ("ctrl+g", "export", "Export", "Export chat to Markdown", "write this chat to a .md file"),
    ("ctrl+o", "models", "Switch model", "Switch model", "open another model for this chat"),
    ("ctrl+l", "focus_chats", "Chats", "Go to the chat list",
     "move to the saved chats (Enter opens one)"),
    ("f9", "toggle_sidebar", "Chat list", "Toggle chat list", "show or hide the saved chats"),
    ("f10", "toggle_engine", "Engine panel", "Toggle engine panel",
     "show or hide the engine panel"),
]
NOT_IN_FOOTER = {"copy_code", "focus_chats", "toggle_sidebar", "toggle_engine"}


def copy_target(focused, reply, messages) -> tuple[str, str] | None:
    """(role, content) of the message to copy: the focused one, else the reply being written,
    else the last reply (or message)."""
    if isinstance(focused, ChatMessage):
        return focused.role, (reply.text if reply and focused is reply.widget
                              else focused.content)
    if reply is not None and reply.text:
        return "assistant", reply.text
    m = next((m for m in reversed(messages) if m.role == "assistant"),
             messages[-1] if messages else None)
    return (m.role, m.content) if m else None


class ChatActions:
    """The chat screen's actions, mixed into ChatScreen: they use its parts (`record`,
    `session`, `reply`, `log_view`), its way of opening chats and sending (`open_new_chat`,
    `open_conversation`, `send`, `ensure_engine`) and its reply handling (`_can_generate`,
    `_start_reply`, `_finish_reply`, `_leave_reply`)."""

    async def action_stop(self) -> None:
        """Ends the reply at once, keeping what it wrote; the engine stops at its next step.
        Nothing waits for the generation thread, which may be stuck where no cancel reaches
        (a chat template rendering for minutes): its late events are ignored."""
        reply = self.reply
        if reply is None:
            return
        reply.halt()
        await self._finish_reply("cancelled", reply.last_event)

    async def action_regenerate(self) -> None:
        if not self.record.messages:
            self.notify("Nothing to regenerate yet", severity="warning")
            return
        if not self._can_generate():
            return
        last = self.record.messages[-1]
        if last.role == "assistant":
            self.record.delete_from(last.id)
            await self.log_view.remove_from(last.id)
        await self._start_reply()

    async def action_edit_last(self) -> None:
        last = self.record.last("user")
        if last is None:
            self.notify("No message to edit yet", severity="warning")
            return
        if self.reply is not None:
            self.notify("Still writing: Esc stops it", severity="warning")
            return

        async def resend(text: str | None) -> None:
            if text is None or self.record.conversation is None:
                return
            if not self._can_generate():
                return
            self.record.delete_from(last.id)
            await self.log_view.remove_from(last.id)
            await self.send(text)

        self.app.push_screen(EditModal(last.content), resend)

    async def action_new_chat(self) -> None:
        await self.open_new_chat()

    def action_delete_chat(self) -> None:
        conversation = self.record.conversation
        if conversation is None:
            self.notify("This chat is not saved yet: nothing to delete", severity="warning")
            return

        async def confirmed(yes: bool | None) -> None:
            if not yes:
                return
            current = self.record.conversation
            if current is not None and current.id == conversation.id:
                await self._leave_reply()
            self.record.delete(conversation)
            self.notify(f"Deleted “{conversation.title}”")
            remaining = self.store.list()
            if remaining:
                await self.open_conversation(remaining[0].id)
            else:
                await self.open_new_chat()

        self.app.push_screen(ConfirmModal(
            "Delete chat", f"Delete “{conversation.title}” and its "
            f"{len(self.record.messages)} messages? This cannot be undone."), confirmed)

    def action_copy_message(self) -> None:
        target = copy_target(self.focused, self.reply, self.record.messages)
        if target is None or not target[1]:
            self.notify("No message to copy", severity="warning")
            return
        role, text = target
        self.app.copy_to_clipboard(text)
        self.notify(f"Copied {'your message' if role == 'user' else 'the reply'} "
                    f"({len(text)} characters)", title="Copied")

    def action_copy_code(self) -> None:
        target = copy_target(self.focused, self.reply, self.record.messages)
        blocks = code_blocks(target[1]) if target else []
        if not blocks:
            self.notify("No code block in this message", severity="warning")
            return

        def copy(code: str | None) -> None:
            if code is not None:
                self.app.copy_to_clipboard(code)
                self.notify(f"Copied a code block ({len(code.splitlines())} lines)",
                            title="Copied")

        if len(blocks) == 1:
            copy(blocks[0][1])
        else:
            self.app.push_screen(CodePickerModal(blocks), copy)

    def action_settings(self) -> None:
        def apply(settings: ChatSettings | None) -> None:
            if settings is None or settings == self.record.settings:
                return
            self.record.save_settings(settings)
            self.notify("Settings saved" + (" for this chat" if self.record.conversation
                                            else ""))
            if self.reply is None:
                self.ensure_engine()  # a new context size reloads the model
            else:
                self.notify("The new context size applies after this reply",
                            severity="information")

        conversation = self.record.conversation
        title = f"Settings: {conversation.title}" if conversation else "Settings"
        self.app.push_screen(SettingsModal(self.record.settings, title), apply)

    def action_export(self) -> None:
        conversation = self.record.conversation
        if conversation is None or not self.record.messages:
            self.notify("Nothing to export yet", severity="warning")
            return

        def export(directory: pathlib.Path | None) -> None:
            if directory is None:
                return
            try:
                path = self.record.export(conversation, directory, self._author())
            except OSError as e:
                self.notify(str(e), title="Export failed", severity="error", timeout=10)
                return
            self.app.last_export = path
            self.notify(str(path), title="Exported", timeout=10)

        self.app.push_screen(ExportModal(self.app.export_dir, conversation.title), export)

    def action_models(self) -> None:
        async def chosen(path: pathlib.Path | None) -> None:
            if path is None:
                return
            await self.action_stop()
            if self.session.engine is not None and self.record.model_path != str(path):
                self.fallback_model = self.record.model_path
            self.record.model_path = str(path)
            self.ensure_engine()
            self._update_hint()

        self.app.push_screen(ModelsModal(), chosen)

    def action_focus_chats(self) -> None:
        self.auto_layout = False
        self.query_one("#sidebar").display = True
        self.query_one("#chat-list").focus()

    def action_toggle_sidebar(self) -> None:
        self.auto_layout = False
        bar = self.query_one("#sidebar")
        bar.display = not bar.display

    def action_toggle_engine(self) -> None:
        self.auto_layout = False
        panel = self.query_one("#engine")
        panel.display = not panel.display
