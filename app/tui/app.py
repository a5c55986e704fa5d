"""`llamatui` with no arguments: the chat app.

    LlamaTUI(model=None).run()

First run (no model in the store, no saved chat) shows the welcome screen, which fetches a starter
model; otherwise the app reopens the last chat, or starts one with `-m MODEL` or the store's first
model. The engine is used through its public API only (llamatui.inference.Engine).
"""
from __future__ import annotations

import pathlib
from functools import partial

from textual.app import App, SystemCommand
from textual.binding import Binding

from llamatui.models.store import StoreError, resolve_model

from ..conversations import ChatSettings, ConversationStore, default_export_dir
from .chat import CHAT_ACTIONS, ChatScreen
from .dialogs import ErrorModal, HelpScreen, ModelsModal
from .errors import describe_error
from .hardware import HARDWARE_ACTIONS, HardwareScreen
from .keys import APP_ACTIONS, app_bindings, key_label
from .local_models import store_models
from .model_manager import MODELS_ACTIONS, ModelsScreen
from .server import ServerScreen
from .welcome import WelcomeScreen

APP_KEYS = [
    ("enter", "Send", "send the message typed in the prompt"),
    ("tab / shift+tab", "Move focus", "between the chat list, messages and the prompt"),
    ("↑ / ↓", "Previous / next message", "when a message has the focus"),
    ("f1", "Help", "this screen"),
    ("ctrl+p", "Command palette", "every action by name, and themes"),
    ("ctrl+q", "Quit", "save and leave (a reply being written is kept)"),
]


class EngineLoader:
    """How the app gets an engine: Engine.load with the chat app's options. Tests replace it to
    share one loaded engine between app instances."""

    context_policy = "shift"  # a long chat drops its oldest turns instead of failing
    # llama.cpp's default: as many layers on the GPU as fit (the Hardware screen's plan); the
    # CPU when there is no usable GPU
    n_gpu_layers = "auto"

    def load(self, path: str, n_ctx: int, progress):
        """The engine for a chat's model and context size, with the app's LoadConfig."""
        from llamatui.inference import Engine, LoadConfig, OffloadOptions
        config = LoadConfig(n_ctx=n_ctx, context_policy=self.context_policy,
                            offload=OffloadOptions(n_gpu_layers=self.n_gpu_layers))
        return Engine.load(path, config, progress=progress)

    def release(self, engine) -> None:
        engine.close()


class LlamaTUI(App):
    TITLE = "llamatui"
    BINDINGS = [Binding("f1", "help", "Help", priority=True)] + app_bindings()
    ENABLE_COMMAND_PALETTE = True

    def __init__(self, model: str | None = None, *, engine_loader: EngineLoader | None = None,
                 show_timings: bool = True, export_dir: str | pathlib.Path | None = None,
                 data_dir: str | pathlib.Path | None = None):
        super().__init__()
        self.model_arg = model
        self.engine_loader = engine_loader or EngineLoader()
        self.show_timings = show_timings  # off in snapshot tests: timings differ per run
        self._export_dir = pathlib.Path(export_dir) if export_dir else None
        self._data_dir = data_dir
        self.store: ConversationStore | None = None
        self.chat: ChatScreen | None = None
        self.last_export: pathlib.Path | None = None
        self.notifications_log: list[tuple[str, str, str]] = []
        self.models_screen: ModelsScreen | None = None  # kept while the app runs (downloads)

    def notify(self, message: str, *, title: str = "", severity="information",
               timeout: float | None = None, markup: bool = False) -> None:
        """Notifications carry model output, paths and error text: always plain text (widgets
        pass markup=True by default). Each is also kept in `notifications_log`."""
        self.notifications_log.append((severity, title, message))
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=False)

    # ---------------------------------------------------------------- start and stop

    async def on_mount(self) -> None:
        try:
            self.store = ConversationStore.open(self._data_dir)
            startup_error = None
        except Exception as e:  # unreadable or newer database: keep working, in memory
            self.store = ConversationStore(":memory:")
            startup_error = e
        theme = self.store.get_state("theme")
        if theme and theme in self.available_themes:
            self.theme = theme
        self.chat = ChatScreen()
        await self.push_screen(self.chat)
        if startup_error is not None:
            self.push_screen(ErrorModal(
                "Saved chats unavailable", f"{startup_error}",
                "Chats of this session will not be saved."))
        await self._open_first()

    async def _open_first(self) -> None:
        chat = self.chat
        if self.model_arg:
            try:
                path = resolve_model(self.model_arg)
            except StoreError as e:
                await chat.open_new_chat(None, self.default_settings())
                self.push_screen(ErrorModal("Model not found", str(e)))
                return
            await chat.open_new_chat(str(path.resolve()), self.default_settings())
            return
        conversations = self.store.list()
        if conversations:
            last = self.store.get_state("last_conversation")
            ids = {c.id for c in conversations}
            target = int(last) if last and last.isdigit() and int(last) in ids \
                else conversations[0].id
            await chat.open_conversation(target)
            return
        models = store_models()
        if models:
            await chat.open_new_chat(str(models[0][0]), self.default_settings())
            return
        await chat.open_new_chat(None, self.default_settings())

        async def chosen(path: pathlib.Path | None) -> None:
            if path is not None:
                await chat.open_new_chat(str(path), self.default_settings())

        self.push_screen(WelcomeScreen(), chosen)

    def default_settings(self) -> ChatSettings:
        return ChatSettings.from_json(self.store.get_state("default_settings"))

    def remember_conversation(self, conversation_id: int) -> None:
        self.store.set_state("last_conversation", str(conversation_id))

    def watch_theme(self, theme: str) -> None:
        if self.store is not None:
            self.store.set_state("theme", theme)

    @property
    def export_dir(self) -> pathlib.Path:
        if self._export_dir is not None:
            return self._export_dir
        saved = self.store.get_state("export_dir") if self.store else None
        return pathlib.Path(saved) if saved else default_export_dir()

    async def action_quit(self) -> None:
        if self.chat is not None:
            self.chat.shutdown()  # saves a reply being written before anything closes
        self.exit()

    def on_unmount(self) -> None:
        if self.models_screen is not None:
            self.models_screen.cancel_all()  # worker threads are joined on exit
        if self.chat is not None:
            self.chat.shutdown()
        if self.store is not None:
            self.store.close()
            self.store = None

    # ---------------------------------------------------------------- help and commands

    def help_keys(self) -> list[tuple[str, str, str]]:
        keys = [(key_label(k), title, what) for k, _, _, title, what in CHAT_ACTIONS]
        keys += [(key_label(k), title, what) for k, _, _, title, what in APP_ACTIONS]
        keys += [(key_label(k), name, what) for k, name, what in APP_KEYS]
        keys += [(key_label(k), f"Models: {title}", what)
                 for k, _, _, title, what in MODELS_ACTIONS]
        keys += [(key_label(k), f"Hardware: {title}", what)
                 for k, _, _, title, what in HARDWARE_ACTIONS if k != "escape"]
        return keys

    # ---------------------------------------------------------------- manager screens

    def _bring_forward(self, screen) -> bool:
        """If `screen` is on the stack, closes the screens above it; False if it is not there.
        (Pushing a screen that is already on the stack would put it there twice.)"""
        if screen not in self.screen_stack:
            return False
        while self.screen is not screen:
            self.pop_screen()
        return True

    def open_model_manager(self, tab: str = "local") -> ModelsScreen:
        """The model manager at `tab`: one instance for the app's life, so downloads outlive
        it."""
        if self.models_screen is None:
            self.models_screen = ModelsScreen(tab)
            self.install_screen(self.models_screen, name="models")
        if not self._bring_forward(self.models_screen):
            self.push_screen("models")
        if self.models_screen.is_mounted:
            self.models_screen.action_show_tab(tab)
        return self.models_screen

    def open_hardware(self) -> None:
        hardware = next((s for s in self.screen_stack if isinstance(s, HardwareScreen)), None)
        if hardware is None or not self._bring_forward(hardware):
            self.push_screen(HardwareScreen())

    def action_model_manager(self, tab: str = "local") -> None:
        self.open_model_manager(tab)

    def action_hardware(self) -> None:
        self.open_hardware()

    def action_server(self) -> None:
        """The Server screen: one for the app's life, so serving goes on behind the chat."""
        if not self.is_screen_installed("server"):
            self.install_screen(ServerScreen(), name="server")
        server = self.get_screen("server")
        if not self._bring_forward(server):
            self.push_screen("server")

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.screen.dismiss(None)
            return
        self.push_screen(HelpScreen(self.help_keys()))

    def get_system_commands(self, screen):
        yield from super().get_system_commands(screen)
        yield SystemCommand("Help", "Show every key (F1)", self.action_help)
        for key, action, _, title, what in APP_ACTIONS:
            yield SystemCommand(title, f"{what} ({key_label(key)})",
                                partial(self.run_action, action))
        if self.chat is None:
            return
        for key, action, _, title, what in CHAT_ACTIONS:
            yield SystemCommand(title, f"{what} ({key_label(key)})",
                                partial(self._chat_action, action))

    async def _chat_action(self, action: str) -> None:
        if self.screen is not self.chat:
            self.notify("Close this screen first", severity="warning")
            return
        await self.chat.run_action(action)

    def show_error(self, error: BaseException, path: str | None = None) -> None:
        title, text = describe_error(error, path)
        self.push_screen(ErrorModal(title, text))


def run_app(model: str | None = None) -> int:
    app = LlamaTUI(model)
    app.run()
    return app.return_code or 0


__all__ = ["LlamaTUI", "EngineLoader", "ModelsModal", "run_app"]
