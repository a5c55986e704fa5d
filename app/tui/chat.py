"""The chat screen: conversation, prompt, saved chats and the engine panel.

Threads: the engine runs in threads (`_load_engine`, `_generate`, `_release_engine`) that do
nothing but call the engine and post messages; the handlers here, on the UI thread, own all
state (the engine reference, the running reply, the database). A reply is identified by a
generation id, so events of a reply that was abandoned (chat switched, stopped) are ignored when
they arrive late. Nothing on the UI thread waits for an engine thread without a bound: Esc ends
the reply on screen at once, and quitting leaves a thread stuck in the engine behind (daemon
threads), because a chat template can render for minutes where no cancel reaches it.
"""
from __future__ import annotations

import pathlib
import threading
import time
from dataclasses import dataclass, field
from functools import partial

from rich.markup import escape
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message as TMessage
from textual.screen import Screen
from textual.widgets import Footer, Header, Input, Static

from ..conversations import (ChatSettings, Conversation, Message, OutputFormatError, code_blocks,
                             export_to_file, title_from)
from .keys import footer_bindings
from .modals import (CodePickerModal, ConfirmModal, EditModal, ErrorModal, ExportModal, ModelsModal,
                     SettingsModal)
from .widgets import (FINISH_LABELS, ChatMessage, ConversationList, EnginePanel, base_model_hint,
                      mark_used, model_display_name, reply_meta)

CSS_DIR = pathlib.Path(__file__).parent

# (key, action, footer label, palette title, what it does): one table drives the bindings, the
# command palette and the help screen, so the three cannot disagree. The footer shows all but
# NOT_IN_FOOTER (every key does not fit in 120 columns); F1 and ctrl+p list them all. The keys
# that open other screens (F3 models, F4 hardware, F5 downloads...) are the app's: tui_keys.
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


# messages from the workers ------------------------------------------------------------------

class EngineProgress(TMessage):
    def __init__(self, load_id: int, stage: str, done: int, total: int):
        super().__init__()
        self.load_id, self.stage, self.done, self.total = load_id, stage, done, total


class EngineReady(TMessage):
    def __init__(self, load_id: int, engine):
        super().__init__()
        self.load_id, self.engine = load_id, engine


class EngineFailed(TMessage):
    def __init__(self, load_id: int, path: str, error: BaseException):
        super().__init__()
        self.load_id, self.path, self.error = load_id, path, error


class Generated(TMessage):
    def __init__(self, gen_id: int, event):
        super().__init__()
        self.gen_id, self.event = gen_id, event


class GenerationFailed(TMessage):
    def __init__(self, gen_id: int, error: BaseException):
        super().__init__()
        self.gen_id, self.error = gen_id, error


# The first prompt read in this process compiles the prompt kernels (numba compiles on first
# use): seconds to minutes with nothing to show, so the first reply says so until it is read.
PROMPT_KERNELS_READY = threading.Event()
READING_PROMPT = "reading the prompt…"
READING_FIRST_PROMPT = "reading the prompt (first run compiles kernels, may take a while)…"
# How long closing an engine waits for its last reply to end (a cancel ends it within one step,
# unless it is stuck where no cancel reaches: then the engine is left to it)
ENGINE_IDLE_WAIT = 1.0
# A reply's new text is shown at most this often. Each write re-parses the Markdown's last block
# and lays the screen out again: Python that holds the GIL the engine's thread needs between its
# kernels. Written per token, SmolLM2 made ~50 tokens/s in the app against ~100 alone (2 cores,
# 300-token replies); ten writes a second, 60-80.
STREAM_INTERVAL_S = 0.1


def start_thread(name: str, target, *args) -> threading.Thread:
    """Runs engine work in a daemon thread rather than a Textual thread worker: Textual waits
    for its workers when the app exits, and Python for its non-daemon threads, while a call into
    the engine can be stuck for minutes (a hostile chat template) and must not keep the app from
    quitting."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    thread.start()
    return thread


class EngineUsers:
    """How many generation threads use each engine: one is closed only once none does (one
    finishing late after a new one started must not make the engine look idle)."""

    def __init__(self):
        self._n: dict[int, int] = {}
        self._cond = threading.Condition()

    def enter(self, engine) -> None:
        with self._cond:
            self._n[id(engine)] = self._n.get(id(engine), 0) + 1

    def leave(self, engine) -> None:
        with self._cond:
            self._n[id(engine)] -= 1
            if not self._n[id(engine)]:
                del self._n[id(engine)]
            self._cond.notify_all()

    def wait_idle(self, engine, timeout: float | None = None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: id(engine) not in self._n, timeout)


@dataclass
class Reply:
    """The reply being generated."""
    gen_id: int
    conversation_id: int
    message_id: int
    widget: ChatMessage
    stop: threading.Event
    stream: object = None  # textual MarkdownStream
    parts: list[str] = field(default_factory=list)
    last_event: object = None
    last_saved: float = 0.0
    unshown: list[str] = field(default_factory=list)  # text not written to the stream yet
    last_shown: float = 0.0
    show_timer: object = None  # a pending write of `unshown`

    @property
    def text(self) -> str:
        return "".join(self.parts)


def describe_error(error: BaseException, path: str | None = None) -> tuple[str, str]:
    """(title, message) for an error the user should see."""
    from llamatui.inference import ChatTemplateError, ConstraintError, ContextFullError, GGUFError
    name = pathlib.Path(path).name if path else "the model"
    if isinstance(error, FileNotFoundError):
        return "Model file missing", f"{path or error.filename}: no such file."
    if isinstance(error, GGUFError):
        text = str(error)
        return "Not a usable GGUF model", text if name in text else f"{name}: {text}"
    if isinstance(error, MemoryError):
        return "Out of memory", (f"{name} does not fit in memory with this context size. "
                                 "Lower the context size (ctrl+s) or pick a smaller model.")
    if isinstance(error, ContextFullError):
        return "Context full", (f"{error}. Start a new chat (ctrl+n) or raise the context "
                                "size in the settings (ctrl+s).")
    if isinstance(error, PermissionError):
        return "Permission denied", str(error)
    if isinstance(error, ChatTemplateError):
        return "Chat template failed", (f"{name}: {error}. The model's own chat template "
                                        "could not turn this chat into a prompt.")
    if isinstance(error, (OutputFormatError, ConstraintError)):
        return "JSON output setting", (f"{error}. Change or clear JSON output in the chat "
                                       "settings (ctrl+s).")
    return type(error).__name__, str(error) or type(error).__name__


class ChatScreen(Screen):
    CSS_PATH = CSS_DIR / "chat.tcss"
    BINDINGS = [Binding(key, action, label, show=action not in NOT_IN_FOOTER)
                for key, action, label, _, _ in CHAT_ACTIONS] + footer_bindings("f3")

    def __init__(self):
        super().__init__()
        self.engine = None  # the loaded Engine, owned by this screen
        self.engine_key: tuple[str, int] | None = None  # (model path, n_ctx) of self.engine
        self.wanted_key: tuple[str, int] | None = None  # what is loading
        self.load_id = 0
        self.gen_id = 0
        self.engine_users = EngineUsers()  # generation threads using each engine
        self.conversation: Conversation | None = None
        self.messages: list[Message] = []
        self.model_path: str | None = None  # the model of the chat on screen
        self.settings = ChatSettings()  # of the chat on screen (or the new chat)
        self.reply: Reply | None = None
        self.closing = False
        self._ticker = None
        self.replies_finished = 0  # counts finished replies (tests wait on it)
        self.auto_layout = True  # side panels follow the terminal's width
        self.fallback_model: str | None = None  # the model to go back to if a switch fails

    @property
    def store(self):
        return self.app.store

    @property
    def loading(self) -> bool:
        return self.wanted_key is not None and self.wanted_key != self.engine_key

    # ---------------------------------------------------------------- layout

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            yield ConversationList(id="sidebar")
            with Vertical(id="chat-column"):
                with VerticalScroll(id="messages"):
                    yield Static("", id="empty-hint")
                yield Input(placeholder="Type a message, Enter to send · F1 for help",
                            id="prompt")
            yield EnginePanel(id="engine")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#messages").anchor()  # follows new text only while at the bottom
        self.refresh_sidebar()
        self._update_hint()
        self.query_one("#prompt").focus()

    @property
    def panel(self) -> EnginePanel:
        return self.query_one(EnginePanel)

    @property
    def log_view(self) -> VerticalScroll:
        return self.query_one("#messages", VerticalScroll)

    @property
    def _engine_on_screen(self):
        """The loaded engine if it is the chat's model (not one being replaced)."""
        if self.engine is not None and self.engine_key and self.engine_key[0] == self.model_path:
            return self.engine
        return None

    def _author(self) -> str:
        if self.model_path is None:
            return "Assistant"
        engine = self._engine_on_screen
        return model_display_name(self.model_path, engine.info.name if engine else None)

    def _update_hint(self) -> None:
        hint = self.query_one("#empty-hint", Static)
        hint.display = not self.messages and self.reply is None
        if self.model_path is None:
            hint.update("No model yet. Press ctrl+o to choose one.")
            return
        engine = self._engine_on_screen
        base = base_model_hint(self.model_path, not engine.info.has_chat_template) \
            if engine else None
        hint.update(f"Chat with [b]{escape(self._author())}[/b]. "
                    "Type below and press Enter.\n"
                    + (f"[yellow]{escape(base)}[/yellow]\n" if base else "")
                    + "[dim]F1 keys · ctrl+s settings · ctrl+p commands[/dim]")

    def _set_title(self) -> None:
        self.sub_title = (self.conversation.title if self.conversation else "New chat")

    def refresh_sidebar(self) -> None:
        self.query_one(ConversationList).show(
            self.store.list(), self.conversation.id if self.conversation else None)

    def check_action(self, action: str, parameters) -> bool | None:
        if action == "stop":
            return True if self.reply is not None else None
        if action in ("regenerate", "edit_last"):
            return None if self.reply is not None or not self.messages else True
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
        self.conversation = None
        self.messages = []
        if model_path is not None:
            self.model_path = str(model_path)
        self.settings = settings or self.app.default_settings()
        await self.log_view.remove_children(ChatMessage)
        self._set_title()
        self.refresh_sidebar()
        self._state_changed()
        self.ensure_engine()
        self.query_one("#prompt", Input).focus()

    async def open_conversation(self, conversation_id: int) -> None:
        conv = self.store.get(conversation_id)
        if conv is None:
            self.notify("That chat no longer exists", severity="warning")
            self.refresh_sidebar()
            return
        await self._leave_reply()
        self.fallback_model = None
        self.conversation = conv
        self.messages = self.store.messages(conv.id)
        self.model_path = conv.model_path or self.model_path
        self.settings = conv.settings
        self.app.remember_conversation(conv.id)
        await self.log_view.remove_children(ChatMessage)
        author = self._author()
        widgets = []
        for m in self.messages:
            meta = ""
            if m.role == "assistant":
                meta = reply_meta(m.stats.get("n_generated", 0), m.finish_reason,
                                  m.stats.get("gen_tps"), self.app.show_timings)
            widgets.append(ChatMessage(m.role, m.content, meta=meta, message_id=m.id,
                                       author="You" if m.role == "user" else
                                       m.stats.get("model") or author))
        await self.log_view.mount_all(widgets)
        self.log_view.scroll_end(animate=False)
        self._set_title()
        self.refresh_sidebar()
        self._state_changed()
        self.ensure_engine()

    @on(ConversationList.Picked)
    async def _picked(self, event: ConversationList.Picked) -> None:
        if self.conversation is None or event.conversation_id != self.conversation.id:
            await self.open_conversation(event.conversation_id)
        self.query_one("#prompt", Input).focus()

    # ---------------------------------------------------------------- engine

    def ensure_engine(self) -> None:
        """Loads the chat's model at the chat's context size unless it is loaded already."""
        if self.model_path is None:
            self.panel.set_unloaded("No model: ctrl+o to choose one")
            return
        key = (self.model_path, self.settings.n_ctx)
        if key == self.engine_key or key == self.wanted_key:
            return
        if not pathlib.Path(self.model_path).is_file():
            self.wanted_key = None
            self.load_id += 1  # a load still running is no longer wanted
            old = self._drop_engine()
            if old is not None:
                self._release_engine(old)
            self.panel.set_unloaded("Model file missing")
            title, msg = describe_error(FileNotFoundError(self.model_path), self.model_path)
            self.notify(f"{msg} Choose another model with ctrl+o.", title=title,
                        severity="error", timeout=10)
            return
        self.wanted_key = key
        self.load_id += 1
        old = self._drop_engine()
        self.panel.begin_load(self.model_path)
        self._load_engine(self.load_id, key, old)

    def _drop_engine(self):
        """Detaches the engine from the screen; the caller hands it to a worker to release."""
        old, self.engine, self.engine_key = self.engine, None, None
        return old

    def _post(self, message: TMessage) -> None:
        """post_message from an engine thread, which may outlive the app."""
        try:
            self.post_message(message)
        except RuntimeError:  # the app's event loop is closed: nobody is left to tell
            pass

    def _release_engine(self, engine) -> None:
        """From the UI thread: closes the engine in a thread, once its last reply is over."""
        start_thread("release engine", self._release_when_idle, engine, self.app.engine_loader)

    def _release_when_idle(self, engine, loader) -> None:
        """Thread: closes the engine once its last reply is over (one stuck in a template
        keeps it open; closing it under that thread could crash)."""
        self.engine_users.wait_idle(engine)
        loader.release(engine)

    def _load_engine(self, load_id: int, key: tuple[str, int], old) -> None:
        start_thread("load engine", self._load, load_id, key, old, self.app.engine_loader)

    def _load(self, load_id: int, key: tuple[str, int], old, loader) -> None:
        """Thread: closes the old engine (first, for its memory, unless a stuck reply holds
        it), loads the new one and posts it."""
        try:
            if old is not None:
                if self.engine_users.wait_idle(old, ENGINE_IDLE_WAIT):
                    loader.release(old)
                else:
                    start_thread("release engine", self._release_when_idle, old, loader)

            def progress(stage: str, done: int, total: int) -> None:
                self._post(EngineProgress(load_id, stage, done, total))

            engine = loader.load(key[0], key[1], progress)
        except BaseException as e:  # GGUFError, MemoryError, OSError...: shown, never raised
            self._post(EngineFailed(load_id, key[0], e))
            return
        if self.closing:  # the app quit while it loaded: nobody will take it
            loader.release(engine)
            return
        self._post(EngineReady(load_id, engine))

    @on(EngineProgress)
    def _engine_progress(self, msg: EngineProgress) -> None:
        if msg.load_id == self.load_id:
            self.panel.load_progress(msg.stage, msg.done, msg.total)

    @on(EngineReady)
    def _engine_ready(self, msg: EngineReady) -> None:
        if msg.load_id != self.load_id or self.closing:
            self.app.engine_loader.release(msg.engine)  # superseded by a later load
            return
        self.engine, self.engine_key, self.wanted_key = msg.engine, self.wanted_key, None
        self.fallback_model = None
        if self.conversation is not None and self.conversation.model_path != self.model_path:
            # a model switch is saved once the new model has loaded
            self.store.update(self.conversation.id, model_path=self.model_path)
            self.conversation.model_path = self.model_path
            self.refresh_sidebar()
        self.panel.set_model(msg.engine.info, self._author())
        mark_used(self.model_path)
        self._update_hint()
        for w in self.log_view.query(ChatMessage):
            if w.role == "assistant" and w.author == "Assistant":
                w.author = self._author()

    @on(EngineFailed)
    def _engine_failed(self, msg: EngineFailed) -> None:
        if msg.load_id != self.load_id:
            return
        self.wanted_key = None
        self.panel.set_unloaded("Load failed")
        title, text = describe_error(msg.error, msg.path)
        fallback, self.fallback_model = self.fallback_model, None
        if fallback and fallback != self.model_path:  # a switch failed: back to the old model
            self.model_path = fallback
            self.app.push_screen(ErrorModal(title, text, "The chat keeps its previous model."))
            self.ensure_engine()
            return
        self.app.push_screen(ErrorModal(title, text, "Choose another model with ctrl+o."))

    # ---------------------------------------------------------------- sending

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
        if self.engine is None:
            if self.loading:
                self.notify("The model is still loading", severity="warning")
            else:
                self.notify("No model loaded: choose one with ctrl+o", severity="warning")
            return False
        return True

    async def send(self, text: str) -> bool:
        """Saves the message at once, shows it, and starts the reply. False if it can't."""
        if not self._can_generate():
            return False
        if self.conversation is None:
            self.conversation = self.store.create(self.model_path, self.settings,
                                                  title_from(text))
            self.app.remember_conversation(self.conversation.id)
            self._set_title()
        msg = self.store.add_message(self.conversation.id, "user", text)
        self.messages.append(msg)
        self.refresh_sidebar()
        await self.log_view.mount(ChatMessage("user", text, message_id=msg.id))
        await self._start_reply()
        return True

    def _history(self) -> list[dict]:
        history = []
        if self.settings.system_prompt.strip():
            history.append({"role": "system", "content": self.settings.system_prompt})
        history += [{"role": m.role, "content": m.content} for m in self.messages]
        return history

    async def _start_reply(self) -> None:
        self.gen_id += 1
        history = self._history()
        author = self._author()
        row = self.store.add_message(self.conversation.id, "assistant", "", "generating",
                                     {"model": author})
        reading = READING_PROMPT if PROMPT_KERNELS_READY.is_set() else READING_FIRST_PROMPT
        widget = ChatMessage("assistant", "", author=author, meta=reading, message_id=row.id)
        await self.log_view.mount(widget)
        self.log_view.anchor()  # a new reply follows the text again
        self.reply = Reply(self.gen_id, self.conversation.id, row.id, widget, threading.Event(),
                           last_saved=time.monotonic())
        self.reply.stream = widget.markdown.get_stream(widget.markdown)
        self.panel.start_generation()
        self._ticker = self.set_interval(0.25, self._tick)
        self._state_changed()
        self.engine_users.enter(self.engine)
        start_thread(f"generate {self.gen_id}", self._generate, self.gen_id, self.engine,
                     history, self.settings, self.reply.stop)

    def _generate(self, gen_id: int, engine, history, settings, stop: threading.Event) -> None:
        """Thread: streams the engine's events as messages."""
        try:
            # the chat's template (or the model's own), and its output format
            engine.set_chat_template(settings.chat_template or None)
            output = settings.output_constraint()  # reads a schema file: here, not in the UI
            for event in engine.generate(history, **settings.sampling(), **output):
                if stop.is_set():  # a stop that came before the engine's generate began
                    engine.cancel()
                self._post(Generated(gen_id, event))
        except BaseException as e:  # ChatTemplateError, ContextFullError, ...: shown, not raised
            self._post(GenerationFailed(gen_id, e))
        finally:
            self.engine_users.leave(engine)

    @on(Generated)
    async def _generated(self, msg: Generated) -> None:
        reply = self.reply
        if reply is None or msg.gen_id != reply.gen_id:
            return  # a reply that was abandoned
        event = msg.event
        reply.last_event = event
        self.panel.generation_event(event)
        if event.kind == "prompt":
            PROMPT_KERNELS_READY.set()
            reply.widget.set_meta("writing…")
        if event.text:
            reply.parts.append(event.text)
            await self._stream_text(reply, event.text)
        if event.kind == "done":
            await self._finish_reply(event.finish_reason, event)

    async def _stream_text(self, reply: Reply, text: str) -> None:
        """Shows new text at once when the last write is STREAM_INTERVAL_S old, else with the
        text that follows it, when that much time has passed."""
        reply.unshown.append(text)
        if reply.show_timer is not None:
            return
        wait = reply.last_shown + STREAM_INTERVAL_S - time.monotonic()
        if wait > 0:
            reply.show_timer = self.set_timer(wait, partial(self._show_unshown, reply))
        else:
            await self._show_unshown(reply)

    async def _show_unshown(self, reply: Reply) -> None:
        reply.show_timer = None
        if self.reply is not reply or not reply.unshown:
            return  # a finished reply shows its whole text another way
        text, reply.unshown = "".join(reply.unshown), []
        reply.last_shown = time.monotonic()
        await reply.stream.write(text)

    @on(GenerationFailed)
    async def _generation_failed(self, msg: GenerationFailed) -> None:
        """Shown even for a reply already stopped: a template that failed after the user gave
        up waiting on it explains the wait, and will fail again."""
        from llamatui.inference import ChatTemplateError
        if self.closing:
            return
        title, text = describe_error(msg.error, self.model_path)
        if isinstance(msg.error, ChatTemplateError):  # every reply would fail: a dialog
            self.app.push_screen(ErrorModal(title, text, "Choose another model with ctrl+o."))
        else:
            self.notify(text, title=title, severity="error", timeout=10)
        reply = self.reply
        if reply is not None and msg.gen_id == reply.gen_id:
            await self._finish_reply("error", reply.last_event)

    def _tick(self) -> None:
        reply = self.reply
        if reply is None:
            return
        self.panel.tick()
        if reply.last_event is not None and reply.last_event.kind == "token":
            reply.widget.set_meta(reply_meta(self.panel.n_generated, None, self.panel.gen_tps,
                                             self.app.show_timings) + " · writing…")
        if time.monotonic() - reply.last_saved > 2.0:  # a crash loses at most 2 s of text
            self.store.update_message(reply.message_id, reply.text, "generating",
                                      {"model": reply.widget.author})
            reply.last_saved = time.monotonic()

    def _stats(self, event) -> dict:
        stats = {"model": self.reply.widget.author if self.reply else self._author()}
        if event is not None:
            stats.update(n_prompt=event.n_prompt, n_reused=event.n_reused,
                         n_generated=event.n_generated, prompt_tps=round(event.prompt_tps, 2),
                         gen_tps=round(event.gen_tps, 2),
                         time_to_first_token=round(event.time_to_first_token, 3))
        return stats

    def _stop_timers(self, reply: Reply) -> None:
        """The ended reply's pending text write and the live numbers' ticker."""
        if reply.show_timer is not None:
            reply.show_timer.stop()
        if self._ticker is not None:
            self._ticker.stop()
            self._ticker = None

    async def _finish_reply(self, finish: str, event) -> None:
        reply, self.reply = self.reply, None
        self._stop_timers(reply)  # the whole text is rendered below
        await reply.stream.stop()
        text = reply.text
        stats = self._stats(event)
        n_gen = event.n_generated if event is not None else 0
        if text or finish not in ("cancelled", "error"):
            self.store.update_message(reply.message_id, text, finish, stats)
            self.messages.append(Message(reply.message_id, reply.conversation_id, "assistant",
                                         text, time.time(), finish, stats))
            reply.widget.content = text
            await reply.widget.markdown.update(text)  # one clean render of the whole reply
            reply.widget.set_meta(reply_meta(n_gen, finish, stats.get("gen_tps"),
                                             self.app.show_timings))
        else:  # stopped or failed before a word: nothing worth keeping
            self.store.delete_messages_from(reply.conversation_id, reply.message_id)
            await reply.widget.remove()
        if event is not None and event.kind == "done":
            self.panel.set_kv(event.kv_used)
        else:
            self.panel.end_generation(f"Idle ({FINISH_LABELS.get(finish, finish)})")
        self._state_changed()
        self.replies_finished += 1
        if not self.closing:
            self.ensure_engine()  # settings changed during the reply (a new context size)

    async def _leave_reply(self) -> None:
        stream = self._abandon_reply()
        if stream is not None:
            await stream.stop()

    def _abandon_reply(self):
        """Stops the running reply and saves what it wrote; used when leaving the chat.
        Returns the reply's Markdown stream, for the caller to stop."""
        reply, self.reply = self.reply, None
        if reply is None:
            return None
        reply.stop.set()
        if self.engine is not None:
            self.engine.cancel()
        self._stop_timers(reply)
        stats = self._stats(reply.last_event)
        if reply.text:
            self.store.update_message(reply.message_id, reply.text, "cancelled", stats)
        else:
            self.store.delete_messages_from(reply.conversation_id, reply.message_id)
        if self.is_mounted:
            self.panel.end_generation("Idle (stopped)")
        return reply.stream

    def shutdown(self) -> None:
        """Quitting: save the partial reply, stop the engine, and close it once its reply has
        ended, waiting a bounded time: a thread stuck in it is left behind (closing the engine
        under it could crash; the process ends and frees it)."""
        if self.closing:
            return
        self.closing = True
        self._abandon_reply()
        engine = self._drop_engine()
        if engine is None:
            return
        engine.cancel()
        if self.engine_users.wait_idle(engine, ENGINE_IDLE_WAIT):
            self.app.engine_loader.release(engine)

    def on_unmount(self) -> None:
        self.shutdown()

    # ---------------------------------------------------------------- actions

    async def action_stop(self) -> None:
        """Ends the reply at once, keeping what it wrote; the engine stops at its next step.
        Nothing waits for the generation thread, which may be stuck where no cancel reaches
        (a chat template rendering for minutes): its late events are ignored."""
        reply = self.reply
        if reply is None:
            return
        reply.stop.set()
        if self.engine is not None:
            self.engine.cancel()
        await self._finish_reply("cancelled", reply.last_event)

    def _last(self, role: str) -> Message | None:
        return next((m for m in reversed(self.messages) if m.role == role), None)

    async def action_regenerate(self) -> None:
        if not self.messages:
            self.notify("Nothing to regenerate yet", severity="warning")
            return
        if not self._can_generate():
            return
        last = self.messages[-1]
        if last.role == "assistant":
            self.store.delete_messages_from(self.conversation.id, last.id)
            self.messages.pop()
            widgets = [w for w in self.log_view.query(ChatMessage) if w.message_id == last.id]
            for w in widgets:
                await w.remove()
        await self._start_reply()

    async def action_edit_last(self) -> None:
        last = self._last("user")
        if last is None:
            self.notify("No message to edit yet", severity="warning")
            return
        if self.reply is not None:
            self.notify("Still writing: Esc stops it", severity="warning")
            return

        async def resend(text: str | None) -> None:
            if text is None or self.conversation is None:
                return
            if not self._can_generate():
                return
            self.store.delete_messages_from(self.conversation.id, last.id)
            self.messages = [m for m in self.messages if m.id < last.id]
            for w in list(self.log_view.query(ChatMessage)):
                if w.message_id is not None and w.message_id >= last.id:
                    await w.remove()
            await self.send(text)

        self.app.push_screen(EditModal(last.content), resend)

    async def action_new_chat(self) -> None:
        await self.open_new_chat()

    def action_delete_chat(self) -> None:
        if self.conversation is None:
            self.notify("This chat is not saved yet: nothing to delete", severity="warning")
            return
        conv = self.conversation

        async def confirmed(yes: bool | None) -> None:
            if not yes:
                return
            if self.conversation is not None and self.conversation.id == conv.id:
                await self._leave_reply()
            self.store.delete(conv.id)
            self.notify(f"Deleted “{conv.title}”")
            remaining = self.store.list()
            if remaining:
                await self.open_conversation(remaining[0].id)
            else:
                await self.open_new_chat()

        self.app.push_screen(ConfirmModal(
            "Delete chat", f"Delete “{conv.title}” and its {len(self.messages)} messages? "
            "This cannot be undone."), confirmed)

    def _target_message(self) -> tuple[str, str] | None:
        """(role, content) of the focused message, else of the last reply (or message)."""
        focused = self.focused
        if isinstance(focused, ChatMessage):
            return focused.role, (self.reply.text if self.reply and
                                  focused is self.reply.widget else focused.content)
        if self.reply is not None and self.reply.text:
            return "assistant", self.reply.text
        m = self._last("assistant") or (self.messages[-1] if self.messages else None)
        return (m.role, m.content) if m else None

    def action_copy_message(self) -> None:
        target = self._target_message()
        if target is None or not target[1]:
            self.notify("No message to copy", severity="warning")
            return
        role, text = target
        self.app.copy_to_clipboard(text)
        self.notify(f"Copied {'your message' if role == 'user' else 'the reply'} "
                    f"({len(text)} characters)", title="Copied")

    def action_copy_code(self) -> None:
        target = self._target_message()
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
            if settings is None or settings == self.settings:
                return
            self.settings = settings
            if self.conversation is not None:
                self.store.update(self.conversation.id, settings=settings)
                self.conversation.settings = settings
            self.store.set_state("default_settings", settings.to_json())  # for new chats
            self.notify("Settings saved" + (" for this chat" if self.conversation else ""))
            if self.reply is None:
                self.ensure_engine()  # a new context size reloads the model
            else:
                self.notify("The new context size applies after this reply",
                            severity="information")

        title = f"Settings: {self.conversation.title}" if self.conversation else "Settings"
        self.app.push_screen(SettingsModal(self.settings, title), apply)

    def action_export(self) -> None:
        if self.conversation is None or not self.messages:
            self.notify("Nothing to export yet", severity="warning")
            return
        conv = self.conversation

        def export(directory: pathlib.Path | None) -> None:
            if directory is None:
                return
            messages = self.store.messages(conv.id)
            try:
                path = export_to_file(directory, conv, messages, self._author())
            except OSError as e:
                self.notify(str(e), title="Export failed", severity="error", timeout=10)
                return
            self.app.last_export = path
            self.store.set_state("export_dir", str(directory))  # the next export's default
            self.notify(str(path), title="Exported", timeout=10)

        self.app.push_screen(ExportModal(self.app.export_dir, conv.title), export)

    def action_models(self) -> None:
        async def chosen(path: pathlib.Path | None) -> None:
            if path is None:
                return
            await self.action_stop()
            if self.engine is not None and self.model_path != str(path):
                self.fallback_model = self.model_path
            self.model_path = str(path)
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

    def on_resize(self, event) -> None:
        """Narrow terminals give the chat the room, until the user shows a panel (F9/F10)."""
        if self.auto_layout:
            self.query_one("#sidebar").display = event.size.width >= 110
            self.query_one("#engine").display = event.size.width >= 90
