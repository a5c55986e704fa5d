"""The chat's engine: loading one for the chat's model and context size, handing it to the
chat screen, and releasing it.

Loads and releases run in daemon threads (`start_thread`) that do nothing but call the app's
engine loader and post messages to the chat screen: EngineProgress while loading, then
EngineReady or EngineFailed. The screen's handlers, on the UI thread, pass each message back to
the session (`is_current`, `adopt`, `failed`), which owns the state: every load has an id, and
the answer to a load that a later one replaced is dropped (its engine released) when it
arrives. An engine is closed only once no reply uses it (`EngineUsers`), and nothing on the UI
thread waits for an engine thread without a bound.
"""
from __future__ import annotations

import threading

from textual.message import Message

# How long closing an engine waits for its last reply to end (a cancel ends it within one step,
# unless it is stuck where no cancel reaches: then the engine is left to it)
ENGINE_IDLE_WAIT = 1.0


class EngineProgress(Message):
    """A stage of load `load_id`: `done` of `total` steps."""

    def __init__(self, load_id: int, stage: str, done: int, total: int):
        super().__init__()
        self.load_id, self.stage, self.done, self.total = load_id, stage, done, total


class EngineReady(Message):
    """Load `load_id` is done: its engine, for the session to `adopt`."""

    def __init__(self, load_id: int, engine):
        super().__init__()
        self.load_id, self.engine = load_id, engine


class EngineFailed(Message):
    """Load `load_id` of the model at `path` failed with `error`."""

    def __init__(self, load_id: int, path: str, error: BaseException):
        super().__init__()
        self.load_id, self.path, self.error = load_id, path, error


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


class EngineSession:
    """The chat screen's engine: `engine`, loaded for `key` (model path, context size), and the
    load under way, for `wanted`.

        session = EngineSession(app.engine_loader, screen.post_message)
        session.load(path, n_ctx)      # later: EngineProgress..., EngineReady or EngineFailed
        session.adopt(ready_message)   # in the screen's handler: the engine is session.engine
        engine = session.borrow()      # a reply's thread uses it, then session.give_back(engine)
        session.close()                # quitting
    """

    def __init__(self, loader, post):
        self.loader = loader  # load(path, n_ctx, progress) and release(engine): the app's
        self._post = post  # posts a message to the chat screen; callable from any thread
        self.engine = None
        self.key: tuple[str, int] | None = None
        self.wanted: tuple[str, int] | None = None
        self.load_id = 0
        self.users = EngineUsers()  # generation threads using each engine
        self.closing = False

    @property
    def loading(self) -> bool:
        return self.wanted is not None and self.wanted != self.key

    def has(self, path: str, n_ctx: int) -> bool:
        """Whether the engine for this model and context size is loaded or loading."""
        return (path, n_ctx) in (self.key, self.wanted)

    def engine_of(self, path: str | None):
        """The loaded engine if it is the model at `path`'s (not one being replaced), else
        None."""
        if self.engine is not None and self.key and self.key[0] == path:
            return self.engine
        return None

    # ---------------------------------------------------------------- on the UI thread

    def load(self, path: str, n_ctx: int) -> None:
        """Starts loading the model at `path` for `n_ctx` tokens, in a thread that first
        releases the engine it replaces (for its memory)."""
        self.wanted = (path, n_ctx)
        self.load_id += 1
        old = self._detach()
        start_thread("load engine", self._load, self.load_id, self.wanted, old)

    def unload(self) -> None:
        """No engine: a load under way is no longer wanted, and the loaded engine is released
        (in a thread, once its last reply is over)."""
        self.wanted = None
        self.load_id += 1  # a load still running is no longer wanted
        old = self._detach()
        if old is not None:
            start_thread("release engine", self._release_when_idle, old)

    def is_current(self, msg: EngineProgress | EngineReady | EngineFailed) -> bool:
        """Whether `msg` comes from the latest load (not one a later load replaced)."""
        return msg.load_id == self.load_id

    def adopt(self, msg: EngineReady) -> bool:
        """Makes the engine of `msg` the session's, unless a later load replaced it or the app
        is closing: then the engine is released and the answer is False."""
        if not self.is_current(msg) or self.closing:
            self.loader.release(msg.engine)
            return False
        self.engine, self.key, self.wanted = msg.engine, self.wanted, None
        return True

    def failed(self, msg: EngineFailed) -> bool:
        """Ends the failed load; False when it was not the latest one (nothing to do)."""
        if not self.is_current(msg):
            return False
        self.wanted = None
        return True

    def cancel(self) -> None:
        """Stops the engine's reply at its next step (one stuck in a template goes on)."""
        if self.engine is not None:
            self.engine.cancel()

    def borrow(self):
        """The engine, for a reply's thread: it is not closed before `give_back`."""
        self.users.enter(self.engine)
        return self.engine

    def give_back(self, engine) -> None:
        """From the reply's thread, when it is done with `engine`."""
        self.users.leave(engine)

    def close(self) -> None:
        """Quitting: stops the engine and closes it once its reply has ended, waiting a bounded
        time: a thread stuck in it is left behind (closing the engine under it could crash; the
        process ends and frees it). A load still running releases what it loads."""
        self.closing = True
        engine = self._detach()
        if engine is None:
            return
        engine.cancel()
        if self.users.wait_idle(engine, ENGINE_IDLE_WAIT):
            self.loader.release(engine)

    def _detach(self):
        """Takes the engine away from the session; the caller has it released."""
        old, self.engine, self.key = self.engine, None, None
        return old

    # ---------------------------------------------------------------- in engine threads

    def _release_when_idle(self, engine) -> None:
        """Closes the engine once its last reply is over (one stuck in a template keeps it
        open; closing it under that thread could crash)."""
        self.users.wait_idle(engine)
        self.loader.release(engine)

    def _load(self, load_id: int, key: tuple[str, int], old) -> None:
        """Closes the old engine (first, for its memory, unless a stuck reply holds it), loads
        the new one and posts it."""
        path, n_ctx = key
        try:
            if old is not None:
                if self.users.wait_idle(old, ENGINE_IDLE_WAIT):
                    self.loader.release(old)
                else:
                    start_thread("release engine", self._release_when_idle, old)

            def progress(stage: str, done: int, total: int) -> None:
                self._post(EngineProgress(load_id, stage, done, total))

            engine = self.loader.load(path, n_ctx, progress)
        except BaseException as e:  # GGUFError, MemoryError, OSError...: shown, never raised
            self._post(EngineFailed(load_id, path, e))
            return
        if self.closing:  # the app quit while it loaded: nobody will take it
            self.loader.release(engine)
            return
        self._post(EngineReady(load_id, engine))
