"""The model manager (F3, F5-F7) and hardware (F4) screens, driven through Pilot against the
stand-in Hub (tests/hub_server.py), with LLAMATUI_HOME in a temporary folder and
hardware.detect fixed. No model is run: the app's engine loader is a stand-in that returns a
fake engine at once (or, for snapshots, never), so these tests take seconds."""
import asyncio
import pathlib
import threading
import types

import pytest
from hub_server import hub_server, make_gguf, populate  # noqa: F401 (fixture)

from textual.binding import Binding

from llamatui.app.tui.app import EngineLoader, LlamaTUI
from llamatui.app.tui.chat import CHAT_ACTIONS, ChatScreen
from llamatui.app.tui.hardware import HardwareScreen
from llamatui.app.tui.dialogs import (ConfirmModal, ErrorModal, HelpScreen, ModelsModal,
                                      SettingsModal)
from llamatui.app.tui.keys import APP_ACTIONS, key_label
from llamatui.app.tui.model_manager import ModelsScreen
from llamatui.app.tui.welcome import WelcomeScreen
from llamatui.models import hardware as model_hardware
from llamatui.models import store as model_store
from llamatui.models.hardware import GPUInfo, HardwareInfo

from tui_helpers import SIZE, wait_for

GB = 10 ** 9

FIXED_HW = HardwareInfo(
    os="Linux 6.8.0", machine="x86_64", python="3.12.3", cpu_model="Example Core i7-12700",
    physical_cores=12, logical_cores=20, simd=["SSE4.2", "AVX", "AVX2", "FMA", "F16C"],
    ram_total=32 * GB, ram_available=24 * GB,
    gpus=[GPUInfo(0, "NVIDIA GeForce RTX 4060", 8 * GB, 7 * GB, "nvml", "8.9", "550.54")],
    disk_path="~/.local/share/llamatui/models", disk_free=210 * GB, disk_total=500 * GB)

CPU_ONLY_HW = HardwareInfo(
    os="Linux 6.8.0", machine="x86_64", python="3.12.3", cpu_model="Example Ryzen 7 5800U",
    physical_cores=8, logical_cores=16, simd=["SSE4.2", "AVX", "AVX2", "FMA"],
    ram_total=16 * GB, ram_available=11 * GB, gpus=[],
    disk_path="~/.local/share/llamatui/models", disk_free=120 * GB, disk_total=256 * GB)


def run(coro):
    return asyncio.run(coro)


class FakeLoader(EngineLoader):
    """An engine that is 'loaded' at once: enough for the chat panel, nothing generates."""

    def __init__(self, chat_template: bool = True):
        self.loaded = []
        self.chat_template = chat_template

    def load(self, path, n_ctx, progress):
        self.loaded.append(path)
        info = types.SimpleNamespace(name=pathlib.Path(path).stem, path=path,
                                     architecture="llama", n_layer=2, quantization="Q4_K_M",
                                     file_bytes=1, n_params=1, n_ctx=n_ctx, n_ctx_train=4096,
                                     kv_bytes=1 << 20, cache_type_k="f16", cache_type_v="f16",
                                     has_chat_template=self.chat_template)
        return types.SimpleNamespace(info=info, close=lambda: None, cancel=lambda: None)

    def release(self, engine):
        pass


class FailLoader(FakeLoader):
    """Fails at once (snapshots: nothing may mark a store model used, which would show)."""

    def load(self, path, n_ctx, progress):
        raise RuntimeError("no engine in these tests")


@pytest.fixture
def home(hub_server, tmp_path, monkeypatch):
    populate(hub_server)
    home = tmp_path / "home"
    monkeypatch.setenv("LLAMATUI_HOME", str(home))
    monkeypatch.setattr(model_hardware, "detect", lambda *a, **k: FIXED_HW)
    return home


def add_store_model(home, name="Local-Q4_K_M.gguf", mix="Q4_K_M"):
    store = home / "models"
    store.mkdir(parents=True, exist_ok=True)
    path = store / name
    path.write_bytes(make_gguf(mix, name="Local"))
    return path


def make(loader=None):
    return LlamaTUI(engine_loader=loader or FakeLoader(), show_timings=False)


async def open_models(pilot) -> ModelsScreen:
    await pilot.press("f3")
    await wait_for(lambda: isinstance(pilot.app.screen, ModelsScreen), 10, "the models screen")
    screen = pilot.app.screen
    await wait_for(lambda: screen.local_tab.loads >= 1, 20, "the local list")
    await pilot.pause()
    return screen


def notified(app, title):
    return [n for n in app.notifications_log if n[1] == title]


# ------------------------------------------------------------------------------------------


def test_local_list_shows_the_store_and_deletes_with_confirm(home):
    path = add_store_model(home)

    async def go():
        app = make()
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot)
            table = screen.query_one("#local-table")
            assert table.row_count == 1
            row = [str(c) for c in table.get_row_at(0)]
            assert row[0] == "Local-Q4_K_M.gguf" and row[1] == "llama" and row[3] == "Q4_K_M"
            assert row[4] == "4096" and row[6] == "local"
            assert "1 model," in str(screen.query_one("#disk-usage").render())
            await pilot.press("delete")
            await wait_for(lambda: isinstance(app.screen, ConfirmModal), 10, "the confirm")
            await pilot.press("y")
            await wait_for(lambda: screen.local_tab.loads >= 2, 20, "the list after deleting")
            await pilot.pause()
            assert table.row_count == 0 and not path.exists()
            assert notified(app, "Deleted")
            await pilot.press("escape")
            await pilot.pause()
            assert app.screen is app.chat
    run(go())


def test_search_and_open_a_repo_with_fit_badges(home):
    async def go():
        app = make()
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot)
            await pilot.press("f6")  # the Search tab
            await pilot.pause()
            assert screen.tab == "search" and screen.focused.id == "search-input"
            await pilot.press(*"gguf", "enter")
            await wait_for(lambda: screen.search_tab.searches >= 1, 20, "the search")
            ids = [m.id for m in screen.search_tab.results]
            assert ids[0] == "other/Popular-GGUF" and "acme/Tiny-GGUF" in ids
            assert "acme/Private-GGUF" not in ids
            table = screen.query_one("#search-table")
            assert str(table.get_row_at(0)[0]) == "other/Popular-GGUF"
            table.move_cursor(row=ids.index("acme/Tiny-GGUF"))
            table.focus()
            await pilot.press("enter")
            await wait_for(lambda: screen.files_tab.loads >= 1, 30, "the repository's files")
            await pilot.pause()
            assert screen.tab == "files"
            assert set(screen.files_tab.row_quants) >= {"IQ2_XS", "Q2_K", "Q4_K_M", "Q8_0", "Q6_K"}
            best = screen.files_tab.recommendation.best.quant
            assert best == "Q8_0"
            files = screen.query_one("#files-table")
            rows = {q: [str(c) for c in files.get_row_at(i)]
                    for i, q in enumerate(screen.files_tab.row_quants)}
            assert rows[best][0] == "★" and "recommended" in rows[best][4]
            assert all(r[0] == "" for q, r in rows.items() if q != best)
            assert rows["Q8_0"][4].startswith("fits in GPU")
            assert rows["Q6_K"][2] == "2 files (split)" and rows["Q6_K"][5] == "runs"
            assert screen.files_tab.selected_quant() == best  # the cursor starts on it
            detail = str(screen.query_one("#fit-detail").render())
            assert "weights" in detail and "KV cache" in detail
            files.move_cursor(row=screen.files_tab.row_quants.index("Q2_K"))
            await pilot.pause()
            assert str(screen.query_one("#fit-detail").render()).startswith("Q2_K")
    run(go())


def test_download_with_progress_then_open_a_chat(home):
    loader = FakeLoader()

    async def go():
        app = make(loader)
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot)
            screen.open_repo("acme/Tiny-GGUF")
            await wait_for(lambda: screen.files_tab.loads >= 1, 30, "the repository's files")
            await pilot.pause()
            screen.query_one("#files-table").move_cursor(row=screen.files_tab.row_quants.index("Q2_K"))
            await pilot.pause()
            await pilot.press("d")
            await pilot.pause()
            assert len(screen.downloads_tab.downloads) == 1
            dl = next(iter(screen.downloads_tab.downloads.values()))
            assert dl.ref == "acme/Tiny-GGUF:Q2_K"
            await wait_for(lambda: not dl.active, 60, "the download")
            assert dl.state == "done" and dl.updates >= 1, (dl.state, app.notifications_log)
            assert dl.done == dl.total and dl.total > 0
            path = dl.result.path
            assert path.is_file() and path.name == "Tiny-Q2_K.gguf"
            assert notified(app, "Downloaded")
            row = screen.query_one("#dl-1")
            assert "done" in str(row.query_one(".dl-stats").render())
            # offered a chat with it
            await wait_for(lambda: isinstance(app.screen, ConfirmModal), 10, "the offer")
            await wait_for(lambda: screen.local_tab.loads >= 2, 20, "the refreshed list")
            assert "Tiny-Q2_K.gguf" in [m.path.name for m in screen.local_tab.models]
            await pilot.press("y")
            await wait_for(lambda: app.screen is app.chat, 10, "the chat")
            await wait_for(lambda: app.chat.engine is not None, 10, "the (fake) engine")
            assert app.chat.model_path == str(path)
            assert loader.loaded[-1] == str(path)
            # the manager keeps its state (and its downloads) when opened again
            await pilot.press("f3")
            await pilot.pause()
            assert app.screen is screen and len(screen.downloads_tab.downloads) == 1
    run(go())


def test_cancel_a_download(home, monkeypatch):
    from llamatui.models import download as model_download
    started = threading.Event()

    def slow_pull(ref, progress=None, cancel=None, **kw):
        progress(model_download.DownloadProgress("acme/Tiny-GGUF", "x.gguf", "downloading",
                                                 10, 100, rate=5.0, eta=18.0))
        started.set()
        assert cancel.wait(20)
        raise model_download.DownloadCancelled("download cancelled")
    monkeypatch.setattr(model_download, "pull", slow_pull)

    async def go():
        app = make()
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot)
            dl = screen.start_download("acme/Tiny-GGUF:Q2_K")
            await wait_for(lambda: dl.updates >= 1, 10, "progress")
            await pilot.press("f5")
            await pilot.pause()
            stats = str(screen.query_one("#dl-1 .dl-stats").render())
            assert "10 B / 100 B" in stats and "ETA 0m18s" in stats
            await pilot.press("x")
            await wait_for(lambda: not dl.active, 10, "the cancel")
            assert dl.state == "cancelled"
            assert [n for n in app.notifications_log if n[1].startswith("Cancelled")]
    run(go())


def test_hub_errors_become_notifications(home, monkeypatch):
    async def go():
        app = make()
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot)
            screen.open_repo("acme/Missing-GGUF")
            await wait_for(lambda: notified(app, "Not found"), 20, "the not-found note")
            assert screen.files_tab.listing is None
            screen.open_repo("acme/Gated-GGUF")
            await wait_for(lambda: screen.files_tab.loads >= 1 or app.notifications_log[-1][0]
                           == "error", 20, "the gated repository")
            if screen.files_tab.loads:  # listing a gated repo works; downloading it does not
                dl = screen.start_download("acme/Gated-GGUF:Q4_K_M")
                await wait_for(lambda: not dl.active, 20, "the gated download")
                assert dl.state == "failed"
            monkeypatch.setenv("HF_HUB_OFFLINE", "1")
            screen.search_tab.search("tiny")
            await wait_for(lambda: notified(app, "Hub unreachable (offline?)"), 20,
                           "the offline note")
            assert all(sev in ("error", "warning", "information")
                       for sev, _, _ in app.notifications_log)
    run(go())


def test_hardware_screen_and_keys_in_help_and_palette(home):
    add_store_model(home)

    async def go():
        app = make()
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("f4")
            await wait_for(lambda: isinstance(app.screen, HardwareScreen), 10, "the screen")
            screen = app.screen
            await wait_for(lambda: screen.loads >= 1, 30, "detection")
            rows = dict(screen.rows)
            assert rows["RAM"] == "24.0 GB available of 32.0 GB"
            assert rows["CPU"] == "Example Core i7-12700"
            assert "12 physical" in rows["Cores"] and "AVX2" in rows["SIMD"]
            assert rows["GPU 0"].startswith("NVIDIA GeForce RTX 4060: 7.0 GB free of 8.0 GB")
            table = screen.query_one("#hw-runs")
            names = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
            assert "SmolLM2 135M Instruct (Q4_1)" in names and "Local-Q4_K_M.gguf" in names
            fit = str(table.get_row_at(names.index("Local-Q4_K_M.gguf"))[3])
            assert fit.startswith("fits in GPU")
            await pilot.press("escape")
            await pilot.pause()
            assert app.screen is app.chat
            keys = {name: key for key, name, _ in app.help_keys()}
            assert keys["Model manager"] == "F3" and keys["Hardware"] == "F4"
            assert keys["Models: Download the quantization"] == "d"
            titles = [c.title for c in app.get_system_commands(app.screen)]
            assert "Model manager" in titles and "Hardware" in titles
            await pilot.press("f1")
            await pilot.pause()
            assert isinstance(app.screen, HelpScreen)
    run(go())


def test_manager_and_hardware_reach_each_other(home):
    async def go():
        app = make()
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("f4")
            await wait_for(lambda: isinstance(app.screen, HardwareScreen), 10, "hardware")
            await pilot.press("f3")
            await pilot.pause()
            assert isinstance(app.screen, ModelsScreen) and app.screen.tab == "local"
            await pilot.press("f4")  # back to the hardware screen, not a second one on top
            await pilot.pause()
            assert isinstance(app.screen, HardwareScreen)
            assert sum(isinstance(s, (HardwareScreen, ModelsScreen))
                       for s in app.screen_stack) == 1
    run(go())


async def press_f5_opens_downloads(pilot, where: str) -> None:
    app = pilot.app
    await pilot.press("f5")
    await pilot.pause()
    manager = app.models_screen
    assert app.screen is manager and manager.tab == "downloads", where
    assert app.focused is not None and manager in app.focused.ancestors_with_self, where
    assert app.screen_stack.count(manager) == 1, where


def test_f5_opens_downloads_from_every_screen_and_tab(home):
    add_store_model(home)  # the app opens on the chat screen

    async def go():
        app = make()
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(lambda: app.chat.engine is not None, 10, "the (fake) engine")
            await press_f5_opens_downloads(pilot, "the chat")
            for key, tab in (("f3", "local"), ("f6", "search"), ("f7", "files")):
                await pilot.press(key)
                await pilot.pause()
                assert app.screen.tab == tab
                await press_f5_opens_downloads(pilot, f"the {tab} tab")
            await pilot.press("f4")
            await wait_for(lambda: isinstance(app.screen, HardwareScreen), 10, "hardware")
            await press_f5_opens_downloads(pilot, "the hardware screen")
            await pilot.press("escape")
            await pilot.pause()
            assert app.screen is app.chat
            for key, dialog in (("f1", HelpScreen), ("ctrl+s", SettingsModal)):
                await pilot.press(key)
                await pilot.pause()
                assert isinstance(app.screen, dialog)
                await press_f5_opens_downloads(pilot, dialog.__name__)
                await pilot.press("escape")  # back to the dialog, then to the chat
                await pilot.pause()
                assert isinstance(app.screen, dialog)
                await pilot.press("escape")
                await pilot.pause()
    run(go())

    async def first_run():  # no model yet: the welcome screen
        app = make()
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(lambda: isinstance(app.screen, WelcomeScreen), 10, "the welcome")
            await press_f5_opens_downloads(pilot, "the welcome screen")
            await pilot.press("escape")
            await pilot.pause()
            assert isinstance(app.screen, WelcomeScreen)
    for path in (home / "models").iterdir():
        path.unlink()
    run(first_run())


def test_screen_keys_mean_the_same_everywhere(home):
    """One table (tui/keys.APP_ACTIONS) drives the app's F-keys, the footers that show them,
    the command palette and the help screen; no screen binds those keys to anything else."""
    screens = [ChatScreen, ModelsScreen, HardwareScreen, WelcomeScreen, HelpScreen,
               SettingsModal, ModelsModal, ConfirmModal, ErrorModal]
    app_keys = {key: action for key, action, _, _, _ in APP_ACTIONS}
    assert {b.key: b.action for b in LlamaTUI.BINDINGS if b.key in app_keys} == app_keys
    for screen in screens:
        for b in screen.BINDINGS:
            b = b if isinstance(b, Binding) else Binding(*b)
            for key in b.key.split(","):
                if key in app_keys:
                    assert b.action == f"app.{app_keys[key]}", (screen.__name__, key)
    chat_keys = {key for key, _, _, _, _ in CHAT_ACTIONS}
    assert not chat_keys & set(app_keys)

    async def go():
        app = make()
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            help_rows = {(key, title) for key, title, _ in app.help_keys()}
            palette = {c.title: c.help for c in app.get_system_commands(app.screen)}
            for key, _, _, title, _ in APP_ACTIONS:
                assert (key_label(key), title) in help_rows
                assert palette[title].endswith(f"({key_label(key)})")
            assert [(k, t) for k, t, _ in app.help_keys() if k == "F5"] == [("F5", "Downloads")]
    run(go())


def test_the_chat_warns_about_base_models(home):
    async def hint(model_file, loader):
        add_store_model(home, name=model_file)
        app = make(loader)
        async with app.run_test(size=SIZE):
            await wait_for(lambda: app.chat.engine is not None, 10, "the (fake) engine")
            text = str(app.chat.query_one("#empty-hint").render())
        (home / "models" / model_file).unlink()
        return text

    gemma = model_store.STARTER_MODELS["gemma3-270m"].filename  # the catalogue says it
    assert "Gemma 3 270M is a base model: it continues your text" in run(hint(gemma, FakeLoader()))
    assert "has no chat template, so it may be a base model" in run(
        hint("Local-Q4_K_M.gguf", FakeLoader(chat_template=False)))
    assert "base model" not in run(hint("Local-Q4_K_M.gguf", FakeLoader()))


# ------------------------------------------------------------------------------------------
# snapshots


def fixed_usage(store=None):
    return model_store.DiskUsage(pathlib.Path("~/.local/share/llamatui/models"), 1_443_072, 1,
                                 0, 0, 210 * GB, 500 * GB)


def snap_app():
    return make(FailLoader())


async def close_load_error(pilot):
    """A store model is opened at start and fails to load (FailLoader): close the dialog."""
    await wait_for(lambda: isinstance(pilot.app.screen, ErrorModal), 20, "the load error")
    await pilot.press("escape")
    await pilot.pause()


def steady(app):
    for w in app.screen.query("Input"):
        w.cursor_blink = False


def test_snapshot_models_local(snap_compare, home, monkeypatch):
    add_store_model(home)
    monkeypatch.setattr(model_store, "disk_usage", fixed_usage)

    async def before(pilot):
        await close_load_error(pilot)
        await open_models(pilot)
        await pilot.pause()
        steady(pilot.app)

    assert snap_compare(snap_app(), terminal_size=SIZE, run_before=before)


def test_snapshot_models_repo_files(snap_compare, home, monkeypatch):
    monkeypatch.setattr(model_hardware, "detect", lambda *a, **k: CPU_ONLY_HW)
    monkeypatch.setattr(model_store, "disk_usage", fixed_usage)

    async def before(pilot):
        screen = await open_models(pilot)
        screen.open_repo("acme/Tiny-GGUF")
        await wait_for(lambda: screen.files_tab.loads >= 1, 30, "the repository's files")
        await pilot.pause()
        steady(pilot.app)

    assert snap_compare(snap_app(), terminal_size=SIZE, run_before=before)


def test_snapshot_hardware_detecting(snap_compare, home, monkeypatch):
    """The first display, while detection runs: no header-only table whose columns would jump
    when the rows come."""
    gate = threading.Event()

    def slow_detect(*args, **kwargs):
        gate.wait(20)
        return FIXED_HW
    monkeypatch.setattr(model_hardware, "detect", slow_detect)
    app = snap_app()
    exit_app = app.exit

    def exit(*args, **kwargs):  # the detection worker is joined on exit: let it finish
        gate.set()
        return exit_app(*args, **kwargs)
    app.exit = exit

    async def before(pilot):
        await pilot.press("f4")
        await wait_for(lambda: isinstance(pilot.app.screen, HardwareScreen), 10, "hardware")
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=before)


def test_snapshot_hardware(snap_compare, home):
    async def before(pilot):
        await pilot.press("f4")
        await wait_for(lambda: isinstance(pilot.app.screen, HardwareScreen), 10, "hardware")
        await wait_for(lambda: pilot.app.screen.loads >= 1, 30, "detection")
        await pilot.pause()

    assert snap_compare(snap_app(), terminal_size=SIZE, run_before=before)


def test_quantize_an_f16_from_the_files_tab(home, hub_server):
    """One key: the F16 is fetched, quantized here to the type that fits, and a chat offered."""
    hub_server.add_repo("acme/Tiny-F16", downloads=3).add("Tiny-F16.gguf", make_gguf("F16"))
    loader = FakeLoader()

    async def go():
        app = make(loader)
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot)
            screen.open_repo("acme/Tiny-F16")
            await wait_for(lambda: screen.files_tab.loads >= 1, 30, "the repository's files")
            await pilot.pause()
            screen.query_one("#files-table").move_cursor(row=screen.files_tab.row_quants.index("F16"))
            await pilot.pause()
            await pilot.press("q")
            await pilot.pause()
            (dl,) = screen.downloads_tab.downloads.values()
            assert dl.quantize and dl.ref == "acme/Tiny-F16:F16"
            await wait_for(lambda: not dl.active, 120, "the download and quantization")
            assert dl.state == "done", (dl.state, app.notifications_log)
            path = dl.result.path
            assert path.is_file() and path.name == "Tiny-Q4_K_M.gguf"
            assert not list(path.parent.glob("Tiny-F16.gguf"))  # the F16 was removed
            await wait_for(lambda: isinstance(app.screen, ConfirmModal), 10, "the offer")
            await pilot.press("y")
            await wait_for(lambda: app.chat.engine is not None, 10, "the (fake) engine")
            assert loader.loaded[-1] == str(path)
    run(go())
