"""The chat screen: the conversation, the prompt, the saved chats and the engine panel.

The screen composes the widgets and wires them to its parts: `EngineSession` loads and releases
the engine in threads, `LiveReply` shows a reply as its thread generates it, `ChatRecord` keeps
the chat in the database, and `ChatActions` (actions.py) holds what its keys do. Threads only
call the engine and post messages; the handlers here, on the UI thread, own all state. Quitting
leaves a thread stuck in the engine behind (daemon threads), because a chat template can render
for minutes where no cancel reaches it.
"""
from __future__ import annotations

import pathlib

from rich.markup import escape
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Header, Input

from ...conversations import ChatSettings
from ..dialogs import ErrorModal
from ..errors import describe_error, fails_every_reply
from ..keys import footer_bindings
from ..local_models import mark_used
from ..model_names import base_model_hint, model_display_name
from ..widgets import chat_message, engine_panel
from ..widgets.chat_message import ChatMessage
from ..widgets.conversation_list import ConversationList
from ..widgets.engine_panel import EnginePanel
from ..widgets.message_log import MessageLog
from .actions import CHAT_ACTIONS, NOT_IN_FOOTER, ChatActions
from .engine_session import EngineFailed, EngineProgress, EngineReady, EngineSession
from .record import ChatRecord
from .reply import Generated, GenerationFailed, LiveReply


def empty_chat_hint(model_path: str | None, author: str, engine) -> str:
    """What an empty chat shows: how to start, and whether its model (with its `engine`, once
    loaded) will chat at all."""
    if model_path is None:
        return "No model yet. Press ctrl+o to choose one."
    base = base_model_hint(model_path, not engine.info.has_chat_template) if engine else None
    return (f"Chat with [b]{escape(author)}[/b]. Type below and press Enter.\n"
            + (f"[yellow]{escape(base)}[/yellow]\n" if base else "")
            + "[dim]F1 keys · ctrl+s settings · ctrl+p commands[/dim]")


class ChatScreen(ChatActions, Screen):
    """The chat: composition and wiring here; its keys' actions in ChatActions (actions.py)."""

    CSS_PATH = [pathlib.Path(__file__).with_name("chat.tcss"), chat_message.STYLESHEET,
                engine_panel.STYLESHEET]
    BINDINGS = [Binding(key, action, label, show=action not in NOT_IN_FOOTER)
                for key, action, label, _, _ in CHAT_ACTIONS] + footer_bindings("f3")

    def __init__(self):
        super().__init__()
        self.session = EngineSession(self.app.engine_loader, self.post_from_thread)
        self.record = ChatRecord(self.app.store)
        self.reply: LiveReply | None = None
        self.gen_id = 0  # the latest reply's id
        self.replies_finished = 0  # counts finished replies (tests wait on it)
        self.auto_layout = True  # side panels follow the terminal's width
        self.fallback_model: str | None = None  # the model to go back to if a switch fails

    # The chat's state, as other screens and tests read it
    engine = property(lambda self: self.session.engine, doc="the loaded Engine, or None")
    conversation = property(lambda self: self.record.conversation)
    messages = property(lambda self: self.record.messages)
    settings = property(lambda self: self.record.settings)
    model_path = property(lambda self: self.record.model_path)

    @property
    def store(self):
        return self.app.store

    @property
    def panel(self) -> EnginePanel:
        return self.query_one(EnginePanel)

    @property
    def log_view(self) -> MessageLog:
        return self.query_one(MessageLog)

    def post_from_thread(self, message: Message) -> None:
        """post_message from an engine thread, which may outlive the app."""
        try:
            self.post_message(message)
        except RuntimeError:  # the app's event loop is closed: nobody is left to tell
            pass

    # ---------------------------------------------------------------- layout

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            yield ConversationList(id="sidebar")
            with Vertical(id="chat-column"):
                yield MessageLog(id="messages")
                yield Input(placeholder="Type a message, Enter to send · F1 for help",
                            id="prompt")
            yield EnginePanel(id="engine")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#messages").anchor()  # follows new text only while at the bottom
        self.refresh_sidebar()
        self._update_hint()
        self.query_one("#prompt").focus()

    def _author(self) -> str:
        """What the chat calls its model."""
        if self.record.model_path is None:
            return "Assistant"
        engine = self.session.engine_of(self.record.model_path)
        return model_display_name(self.record.model_path, engine.info.name if engine else None)

    def _update_hint(self) -> None:
        path = self.record.model_path
        self.log_view.show_hint(not self.record.messages and self.reply is None,
                                empty_chat_hint(path, self._author(),
                                                self.session.engine_of(path)))

    def refresh_sidebar(self) -> None:
        conversation = self.record.conversation
        self.query_one(ConversationList).show(
            self.store.list(), conversation.id if conversation else None)

    def check_action(self, action: str, parameters) -> bool | None:
        if action == "stop":
            return True if self.reply is not None else None
        if action in ("regenerate", "edit_last"):
            return None if self.reply is not None or not self.record.messages else True
        return True

    def _state_changed(self) -> None:
        self.refresh_bindings()
        self._update_hint()

    # ---------------------------------------------------------------- opening chats

    async def open_new_chat(self, model_path: str | None = None,
                            settings: ChatSettings | None = None) -> None:
        """An empty chat with the default settings (the last ones saved) and the same model
        unless told otherwise; it is saved with its first message."""
        await self._leave_reply()
        self.fallback_model = None
        self.record.start_new(model_path, settings or self.app.default_settings())
        await self.log_view.clear()
        self._chat_changed()
        self.query_one("#prompt", Input).focus()

    async def open_conversation(self, conversation_id: int) -> None:
        conversation = self.store.get(conversation_id)
        if conversation is None:
            self.notify("That chat no longer exists", severity="warning")
            self.refresh_sidebar()
            return
        await self._leave_reply()
        self.fallback_model = None
        self.record.show(conversation)
        self.app.remember_conversation(conversation.id)
        await self.log_view.show_saved(self.record.messages, self._author(),
                                       self.app.show_timings)
        self._chat_changed()

    def _chat_changed(self) -> None:
        """Another chat is on screen: its title, the sidebar, the keys, its model."""
        self.sub_title = self.record.title
        self.refresh_sidebar()
        self._state_changed()
        self.ensure_engine()

    @on(ConversationList.Picked)
    async def _picked(self, event: ConversationList.Picked) -> None:
        conversation = self.record.conversation
        if conversation is None or event.conversation_id != conversation.id:
            await self.open_conversation(event.conversation_id)
        self.query_one("#prompt", Input).focus()

    # ---------------------------------------------------------------- the engine

    def ensure_engine(self) -> None:
        """Loads the chat's model at the chat's context size unless it is loaded already."""
        path, n_ctx = self.record.model_path, self.record.settings.n_ctx
        if path is None:
            self.panel.set_unloaded("No model: ctrl+o to choose one")
            return
        if self.session.has(path, n_ctx):
            return
        if not pathlib.Path(path).is_file():
            self.session.unload()
            self.panel.set_unloaded("Model file missing")
            title, msg = describe_error(FileNotFoundError(path), path)
            self.notify(f"{msg} Choose another model with ctrl+o.", title=title,
                        severity="error", timeout=10)
            return
        self.session.load(path, n_ctx)
        self.panel.begin_load(path)

    @on(EngineProgress)
    def _engine_progress(self, msg: EngineProgress) -> None:
        if self.session.is_current(msg):
            self.panel.load_progress(msg.stage, msg.done, msg.total)

    @on(EngineReady)
    def _engine_ready(self, msg: EngineReady) -> None:
        if not self.session.adopt(msg):
            return  # superseded by a later load, or quitting
        self.fallback_model = None
        if self.record.save_model():  # a model switch is saved once the new model has loaded
            self.refresh_sidebar()
        self.panel.set_model(msg.engine.info, self._author())
        mark_used(self.record.model_path)
        self._update_hint()
        self.log_view.name_replies(self._author())

    @on(EngineFailed)
    def _engine_failed(self, msg: EngineFailed) -> None:
        if not self.session.failed(msg):
            return
        self.panel.set_unloaded("Load failed")
        title, text = describe_error(msg.error, msg.path)
        fallback, self.fallback_model = self.fallback_model, None
        if fallback and fallback != self.record.model_path:  # a switch failed: the old model
            self.record.model_path = fallback
            self.app.push_screen(ErrorModal(title, text, "The chat keeps its previous model."))
            self.ensure_engine()
            return
        self.app.push_screen(ErrorModal(title, text, "Choose another model with ctrl+o."))

    # ---------------------------------------------------------------- sending and replies

    @on(Input.Submitted, "#prompt")
    async def _submit(self, event: Input.Submitted) -> None:
        text = event.value
        if not text.strip():
            return
        if await self.send(text):
            event.input.value = ""

    def _can_generate(self) -> bool:
        if self.reply is not None:
            self.notify("Still writing: Esc stops it", severity="warning")
            return False
        if self.session.engine is None:
            if self.session.loading:
                self.notify("The model is still loading", severity="warning")
            else:
                self.notify("No model loaded: choose one with ctrl+o", severity="warning")
            return False
        return True

    async def send(self, text: str) -> bool:
        """Saves the message at once, shows it, and starts the reply. False if it can't."""
        if not self._can_generate():
            return False
        message, created = self.record.add_user_message(text)
        if created:
            self.app.remember_conversation(self.record.conversation.id)
            self.sub_title = self.record.title
        self.refresh_sidebar()
        await self.log_view.add(ChatMessage("user", text, message_id=message.id))
        await self._start_reply()
        return True

    async def _start_reply(self) -> None:
        self.gen_id += 1
        self.reply = await LiveReply.begin(
            self.gen_id, self._author(), log=self.log_view, record=self.record,
            session=self.session, panel=self.panel, host=self,
            show_timings=self.app.show_timings)
        self._state_changed()

    @on(Generated)
    async def _generated(self, msg: Generated) -> None:
        reply = self.reply
        if reply is None or msg.gen_id != reply.gen_id:
            return  # a reply that was abandoned
        await reply.on_event(msg.event)
        if msg.event.kind == "done":
            await self._finish_reply(msg.event.finish_reason, msg.event)

    @on(GenerationFailed)
    async def _generation_failed(self, msg: GenerationFailed) -> None:
        """Shown even for a reply already stopped: a template that failed after the user gave
        up waiting on it explains the wait, and will fail again."""
        if self.session.closing:
            return
        title, text = describe_error(msg.error, self.record.model_path)
        if fails_every_reply(msg.error):  # a dialog, not a notification
            self.app.push_screen(ErrorModal(title, text, "Choose another model with ctrl+o."))
        else:
            self.notify(text, title=title, severity="error", timeout=10)
        reply = self.reply
        if reply is not None and msg.gen_id == reply.gen_id:
            await self._finish_reply("error", reply.last_event)

    async def _finish_reply(self, finish: str, event) -> None:
        reply, self.reply = self.reply, None
        await reply.finish(finish, event)
        self._state_changed()
        self.replies_finished += 1
        if not self.session.closing:
            self.ensure_engine()  # settings changed during the reply (a new context size)

    async def _leave_reply(self) -> None:
        """Stops the running reply and saves what it wrote; used when leaving the chat."""
        reply, self.reply = self.reply, None
        if reply is not None:
            reply.abandon()
            await reply.stream.stop()

    def shutdown(self) -> None:
        """Quitting: saves the partial reply, stops the engine and closes it (see
        EngineSession.close)."""
        if self.session.closing:
            return
        reply, self.reply = self.reply, None
        if reply is not None:
            reply.abandon()
        self.session.close()

    def on_unmount(self) -> None:
        self.shutdown()

    def on_resize(self, event) -> None:
        """Narrow terminals give the chat the room, until the user shows a panel (F9/F10)."""
        if self.auto_layout:
            self.query_one("#sidebar").display = event.size.width >= 110
            self.query_one("#engine").display = event.size.width >= 90
