"""The server's handle on the engine (`ServedEngine`): one engine thread runs the scheduler (llama-server's
`update_slots` loop: `Scheduler.serve_forever`), and handlers talk to it without blocking the
event loop.

- Blocking calls (chat templates render in a worker process, tokenizing, queueing a request,
  which takes the scheduler's lock) run in a small thread pool: `await served.call(fn, ...)`.
- A `Run` is the scheduler requests of one HTTP request (its n choices); the engine thread hands
  their events to the event loop through the loop's `Mailbox`, into one asyncio queue per run,
  once the step is over: a step that emits a token for each of eight streams wakes the loop
  once, not eight times (`benchmarks/serve_load.py` measures what that saves).
- Cancelling a run (the client went away) cancels its requests and reaps them at once: queued,
  prefilling or generating, their slots are idle again before the next step (llama-server leaves
  them running: its issues #11720, #13262).
"""
from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import ClassVar

from llamatui.inference import (ConstraintError, ConstraintSpec, ContextFullError,
                                QueueFullError, SamplingParams)

from .errors import LOADING as LOADING_MESSAGE
from .errors import APIError, exceed_context, invalid, unavailable
from .requests import Limits

LOADING, READY, FAILED, STOPPED = "loading", "ready", "failed", "stopped"
POOL_THREADS = 4  # templating and tokenizing of concurrent requests


class ServedEngine:
    """The server's handle on the engine: the engine (loaded by `load`, or one handed over: the
    app's), the engine thread that steps its scheduler, the pool for blocking calls and the runs
    in progress; `state` says whether requests can be served (LOADING, READY, FAILED, STOPPED)."""

    def __init__(self, engine=None, owns_engine: bool = True, max_queue: int | None = None):
        self.engine = None
        self.owns_engine = owns_engine
        self.max_queue = max_queue
        self.state, self.error = LOADING, None
        self.runs: set[Run] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="llamatui-serve")
        if engine is not None:
            self._ready(engine)

    def load(self, loader: Callable[[], object]) -> None:
        """Loads the engine with `loader` (in the caller's thread), then starts serving it; a
        failure leaves the server answering 503 with the reason."""
        try:
            engine = loader()
        except Exception as e:  # noqa: BLE001 - shown by /health and the CLI
            self.state, self.error = FAILED, e
            return
        self._ready(engine)

    def _ready(self, engine) -> None:
        self.engine = engine
        sched = engine.scheduler
        if self.max_queue is not None:
            sched.max_queue = self.max_queue
        self._thread = threading.Thread(target=self._serve, args=(sched,),
                                        name="llamatui-engine", daemon=True)
        self._thread.start()
        self.state = READY

    def _serve(self, sched) -> None:
        """The engine thread: the events it posts wait for the end of their step (Mailbox)."""
        Mailbox.defer_on_this_thread()
        sched.serve_forever(self._stop, after_step=Mailbox.hand_over_deferred)

    @property
    def scheduler(self):
        return self.engine.scheduler

    @property
    def limits(self) -> Limits:
        sched = self.engine.scheduler
        return Limits(n_slots=len(sched.slots), n_ctx_slot=sched.n_ctx_slot,
                      n_vocab=self.engine.info.n_vocab)

    def check_ready(self) -> None:
        if self.state == LOADING:
            raise unavailable(LOADING_MESSAGE)
        if self.state != READY:
            raise unavailable(f"the model is not available: {self.error or self.state}")

    async def call(self, fn, *args, **kwargs):
        """fn(*args, **kwargs) in the pool, awaited."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, partial(fn, *args, **kwargs))

    def close(self) -> None:
        """Cancels every run, stops the engine thread, and closes the engine if it is ours."""
        for run in list(self.runs):
            run.cancel_requests()
        self._stop.set()
        if self.engine is not None:
            self.engine.scheduler.wake()
            self.engine.scheduler.reap()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.engine is not None and self.owns_engine:
            self.engine.close()
        self.state = STOPPED


_TICK = (None, None)  # a keep-alive tick in a run's queue


class Mailbox:
    """Events from the engine thread to one event loop's queues, handed over in one loop
    callback (`call_soon_threadsafe`: a write to the loop's wake-up pipe) per burst. On the
    engine thread (`defer_on_this_thread`) a step's events wait until the step is over
    (`hand_over_deferred`): a step that samples eight slots then wakes the loop once, and the
    loop's Python does not take the GIL from the sampling of the slots still to come."""

    _by_loop: ClassVar[weakref.WeakKeyDictionary] = weakref.WeakKeyDictionary()
    _deferring: ClassVar[threading.local] = threading.local()

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._lock = threading.Lock()
        self._items: list = []
        self._scheduled = False

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> Mailbox:
        box = cls._by_loop.get(loop)
        if box is None:
            box = cls._by_loop[loop] = cls(loop)
        return box

    @classmethod
    def defer_on_this_thread(cls) -> None:
        """From now on, what this thread posts is handed over by its `hand_over_deferred`."""
        cls._deferring.boxes = set()

    @classmethod
    def hand_over_deferred(cls) -> None:
        """On a deferring thread: schedules the delivery of what it posted since the last call."""
        boxes, cls._deferring.boxes = cls._deferring.boxes, set()
        for box in boxes:
            box._schedule()

    def post(self, queue: asyncio.Queue, item) -> None:
        """From any thread: `queue.put_nowait(item)` on the loop, soon."""
        with self._lock:
            self._items.append((queue, item))
        deferred = getattr(self._deferring, "boxes", None)
        if deferred is not None:
            deferred.add(self)
        else:
            self._schedule()

    def _schedule(self) -> None:
        with self._lock:
            if self._scheduled or not self._items:
                return  # a delivery is already on its way
            self._scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:
            pass  # the event loop is closed: the server is stopping

    def _deliver(self) -> None:
        with self._lock:
            items, self._items, self._scheduled = self._items, [], False
        for queue, item in items:
            queue.put_nowait(item)


class _KeepAlive:
    """Puts a tick into `queue` whenever `interval` seconds pass with no event (`last`: the
    loop time of the latest one, which the consumer sets)."""

    def __init__(self, queue: asyncio.Queue, interval: float):
        self.queue, self.interval = queue, interval
        self.loop = asyncio.get_running_loop()
        self.last = self.loop.time()
        self._timer = self.loop.call_later(interval, self._fire)

    def _fire(self) -> None:
        now = self.loop.time()
        if now - self.last >= self.interval:
            self.queue.put_nowait(_TICK)
            self.last = now
        self._timer = self.loop.call_at(self.last + self.interval, self._fire)

    def cancel(self) -> None:
        self._timer.cancel()


class Run:
    """The scheduler requests of one HTTP request; `events()` yields (choice index, event)."""

    def __init__(self, served: ServedEngine):
        self.served = served
        self.queue: asyncio.Queue = asyncio.Queue()
        self.requests: list = []
        self._mailbox = Mailbox.of(asyncio.get_running_loop())
        self._open = 0

    def _poster(self, index: int) -> Callable:
        post, queue = self._mailbox.post, self.queue

        def emit(event) -> None:  # on the engine thread
            post(queue, (index, event))
        return emit

    async def start(self, choices: list[tuple[list[int], SamplingParams]], n_probs: int,
                    cache_prompt: bool, constraint: ConstraintSpec | None = None,
                    constraint_param: str = "response_format",
                    reasoning_budgets: list | None = None,
                    preserved_tokens: list[int] = ()) -> None:
        """Queues one request per choice (prompt ids, params), each with its own grammar state
        when there is a `constraint`; maps the scheduler's refusals to API errors (an oversized
        prompt: 400 exceed_context_size_error; a full queue: 503; a schema or grammar that
        cannot be used: 400 naming `constraint_param` and what is unsupported).
        reasoning_budgets: one chat.reasoning.ReasoningBudget per choice, or None;
        preserved_tokens: ids the replies show although special (the chat format's markers)."""
        self.served.runs.add(self)
        sched = self.served.scheduler
        try:
            for index, (ids, params) in enumerate(choices):
                req = await self.served.call(
                    sched.add_request, ids, params, self._poster(index), n_probs=n_probs,
                    cache_prompt=cache_prompt, truncate=False, constraint=constraint,
                    reasoning_budget=reasoning_budgets[index] if reasoning_budgets else None,
                    preserved_tokens=preserved_tokens)
                self.requests.append(req)
                self._open += 1
        except ContextFullError as e:
            await self.cancel()
            raise exceed_context(e.n_prompt, e.n_ctx) from None
        except ConstraintError as e:
            await self.cancel()
            raise invalid(constraint_param, str(e)) from None
        except QueueFullError as e:
            await self.cancel()
            raise unavailable(f"the server is busy: {e}") from None
        except ValueError as e:  # token ids outside the vocabulary, an empty prompt
            await self.cancel()
            raise invalid("prompt", str(e)) from None

    async def events(self, ping_interval: float | None = None
                     ) -> AsyncIterator[tuple[int | None, object]]:
        """Every request's events until all are done; with `ping_interval`, also (None, None)
        after each ping_interval seconds without an event (a keep-alive tick: one timer per
        run that re-arms itself, not a timer per event)."""
        keep_alive = _KeepAlive(self.queue, ping_interval) if ping_interval else None
        try:
            while self._open:
                item = await self.queue.get()
                if item is _TICK:
                    yield None, None
                    continue
                if keep_alive is not None:
                    keep_alive.last = keep_alive.loop.time()
                index, event = item
                if event.kind == "done":
                    self._open -= 1
                yield index, event
        finally:
            if keep_alive is not None:
                keep_alive.cancel()

    def cancel_requests(self) -> None:
        for req in self.requests:
            req.cancel()

    async def cancel(self) -> None:
        """Ends the requests that are not done and frees their slots now."""
        self.served.runs.discard(self)
        if any(not r.done.is_set() for r in self.requests):
            self.cancel_requests()
            await self.served.call(self.served.scheduler.reap)


def choice_params(sampling: dict, n: int) -> list[SamplingParams]:
    """The sampling parameters of n choices: with a seed, choice i uses seed + i, so that a
    request's choices differ but the same request gives the same choices again."""
    seed = sampling.get("seed")
    return [SamplingParams(**{**sampling, "seed": seed + i} if seed is not None else sampling)
            for i in range(n)]


__all__ = ["ServedEngine", "Run", "APIError", "choice_params", "LOADING", "READY", "FAILED"]
