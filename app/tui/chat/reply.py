"""The reply being written: a thread that runs the engine's generation and posts its events,
and `LiveReply`, which shows them as they arrive (the text streamed into its ChatMessage, the
engine panel's numbers) and saves the text as it grows.

A reply has a generation id: the chat screen hands a `Generated` event to the LiveReply of its
id only, so the late events of a reply that was abandoned (chat switched, stopped) are
ignored. Stopping does not wait for the thread, which may be stuck where no cancel reaches (a
chat template rendering for minutes).
"""
from __future__ import annotations

import threading
import time

from textual.message import Message

from ..widgets.chat_message import FINISH_LABELS, ChatMessage, reply_meta
from .engine_session import start_thread

# The first prompt read in this process compiles the prompt kernels (numba compiles on first
# use): seconds to minutes with nothing to show, so the first reply says so until it is read.
PROMPT_KERNELS_READY = threading.Event()
READING_PROMPT = "reading the prompt…"
READING_FIRST_PROMPT = "reading the prompt (first run compiles kernels, may take a while)…"
# A reply's new text is shown at most this often. Each write re-parses the Markdown's last block
# and lays the screen out again: Python that holds the GIL the engine's thread needs between its
# kernels, so a write per token slows the reply down.
STREAM_INTERVAL_S = 0.1
TICK_S = 0.25  # how often the live numbers are redrawn while a reply runs
SAVE_EVERY_S = 2.0  # a crash loses at most this much of a reply's text


class Generated(Message):
    """One of the engine's GenerationEvents for reply `gen_id`."""

    def __init__(self, gen_id: int, event):
        super().__init__()
        self.gen_id, self.event = gen_id, event


class GenerationFailed(Message):
    """Reply `gen_id` failed (a template that cannot render, a full context, ...)."""

    def __init__(self, gen_id: int, error: BaseException):
        super().__init__()
        self.gen_id, self.error = gen_id, error


def reading_label() -> str:
    """What a new reply says until the engine has read its prompt."""
    return READING_PROMPT if PROMPT_KERNELS_READY.is_set() else READING_FIRST_PROMPT


def generate(post, gen_id: int, session, engine, history: list[dict], settings,
             stop: threading.Event) -> None:
    """In a reply's thread: streams the engine's events as messages, then gives the engine back
    to the session."""
    try:
        # the chat's template (or the model's own), and its output format
        engine.set_chat_template(settings.chat_template or None)
        output = settings.output_constraint()  # reads a schema file: here, not in the UI
        for event in engine.generate(history, **settings.sampling(), **output):
            if stop.is_set():  # a stop that came before the engine's generate began
                engine.cancel()
            post(Generated(gen_id, event))
    except BaseException as e:  # ChatTemplateError, ContextFullError, ...: shown, not raised
        post(GenerationFailed(gen_id, e))
    finally:
        session.give_back(engine)


class LiveReply:
    """The reply being written into `widget` (a ChatMessage), saved as message `message_id` of
    conversation `conversation_id` through `record` (a ChatRecord); `host` (the chat screen)
    runs its timers. Everything here runs on the UI thread."""

    def __init__(self, gen_id: int, conversation_id: int, message_id: int, widget, *,
                 record, session, panel, host, show_timings: bool):
        self.gen_id, self.conversation_id, self.message_id = gen_id, conversation_id, message_id
        self.widget, self.record, self.session = widget, record, session
        self.panel, self.host, self.show_timings = panel, host, show_timings
        self.stop = threading.Event()  # tells the thread to cancel, if it has not begun
        self.stream = widget.markdown.get_stream(widget.markdown)  # textual MarkdownStream
        self.parts: list[str] = []
        self.last_event = None
        self.ended = False  # finished or abandoned: late timers and events do nothing
        self._last_saved = time.monotonic()
        self._unshown: list[str] = []  # text not written to the stream yet
        self._last_shown = 0.0
        self._show_timer = None  # a pending write of `_unshown`
        self._ticker = None

    @classmethod
    async def begin(cls, gen_id: int, author: str, *, log, record, session, panel, host,
                    show_timings: bool) -> LiveReply:
        """A new reply to the chat of `record`, by `author` (the model's name): its row saved,
        its widget added to `log` (a MessageLog), its generation started."""
        history = record.history()
        row = record.add_reply(author)
        widget = ChatMessage("assistant", "", author=author, meta=reading_label(),
                             message_id=row.id)
        await log.add(widget, follow=True)
        reply = cls(gen_id, record.conversation.id, row.id, widget, record=record,
                    session=session, panel=panel, host=host, show_timings=show_timings)
        reply._start(history, record.settings)
        return reply

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def _start(self, history: list[dict], settings) -> None:
        """Starts the engine's generation in a thread, and the live numbers' ticker."""
        self.panel.start_generation()
        self._ticker = self.host.set_interval(TICK_S, self._tick)
        engine = self.session.borrow()
        start_thread(f"generate {self.gen_id}", generate, self.host.post_from_thread,
                     self.gen_id, self.session, engine, history, settings, self.stop)

    def halt(self) -> None:
        """Asks the engine to stop at its next step (the caller ends the reply on screen)."""
        self.stop.set()
        self.session.cancel()

    async def on_event(self, event) -> None:
        """A GenerationEvent of this reply: numbers, the prompt read, new text."""
        self.last_event = event
        self.panel.generation_event(event)
        if event.kind == "prompt":
            PROMPT_KERNELS_READY.set()
            self.widget.set_meta("writing…")
        if event.text:
            self.parts.append(event.text)
            await self._stream_text(event.text)

    async def _stream_text(self, text: str) -> None:
        """Shows new text at once when the last write is STREAM_INTERVAL_S old, else with the
        text that follows it, when that much time has passed."""
        self._unshown.append(text)
        if self._show_timer is not None:
            return
        wait = self._last_shown + STREAM_INTERVAL_S - time.monotonic()
        if wait > 0:
            self._show_timer = self.host.set_timer(wait, self._show_unshown)
        else:
            await self._show_unshown()

    async def _show_unshown(self) -> None:
        self._show_timer = None
        if self.ended or not self._unshown:
            return  # a finished reply shows its whole text another way
        text, self._unshown = "".join(self._unshown), []
        self._last_shown = time.monotonic()
        await self.stream.write(text)

    def _tick(self) -> None:
        """The live numbers between tokens, and the text saved every SAVE_EVERY_S."""
        if self.ended:
            return
        self.panel.tick()
        if self.last_event is not None and self.last_event.kind == "token":
            self.widget.set_meta(reply_meta(self.panel.n_generated, None, self.panel.gen_tps,
                                            self.show_timings) + " · writing…")
        if time.monotonic() - self._last_saved > SAVE_EVERY_S:
            self.record.save_reply(self.message_id, self.text, "generating",
                                   {"model": self.widget.author})
            self._last_saved = time.monotonic()

    def _stats(self, event) -> dict:
        """What is saved with the reply: its model, and the engine's numbers of its last
        event."""
        stats = {"model": self.widget.author}
        if event is not None:
            stats.update(n_prompt=event.n_prompt, n_reused=event.n_reused,
                         n_generated=event.n_generated, prompt_tps=round(event.prompt_tps, 2),
                         gen_tps=round(event.gen_tps, 2),
                         time_to_first_token=round(event.time_to_first_token, 3))
        return stats

    def _stop_timers(self) -> None:
        """The pending text write and the live numbers' ticker."""
        self.ended = True
        if self._show_timer is not None:
            self._show_timer.stop()
        if self._ticker is not None:
            self._ticker.stop()
            self._ticker = None

    async def finish(self, finish: str, event) -> None:
        """Ends the reply on screen (`finish`: how; `event`: its last one, None if none came):
        keeps it, rendered whole once, unless it was stopped or failed before a word."""
        self._stop_timers()
        await self.stream.stop()
        text = self.text
        stats = self._stats(event)
        n_gen = event.n_generated if event is not None else 0
        if text or finish not in ("cancelled", "error"):
            self.record.keep_reply(self.conversation_id, self.message_id, text, finish, stats)
            self.widget.content = text
            await self.widget.markdown.update(text)  # one clean render of the whole reply
            self.widget.set_meta(reply_meta(n_gen, finish, stats.get("gen_tps"),
                                            self.show_timings))
        else:  # stopped or failed before a word: nothing worth keeping
            self.record.discard_reply(self.conversation_id, self.message_id)
            await self.widget.remove()
        if event is not None and event.kind == "done":
            self.panel.set_kv(event.kv_used)
        else:
            self.panel.end_generation(f"Idle ({FINISH_LABELS.get(finish, finish)})")

    def abandon(self) -> None:
        """Stops the reply and saves what it wrote, without waiting (leaving the chat,
        quitting); the caller stops its Markdown `stream`."""
        self.halt()
        self._stop_timers()
        stats = self._stats(self.last_event)
        if self.text:
            self.record.save_reply(self.message_id, self.text, "cancelled", stats)
        else:
            self.record.discard_reply(self.conversation_id, self.message_id)
        if self.host.is_mounted:
            self.panel.end_generation("Idle (stopped)")
