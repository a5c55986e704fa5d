"""Answers that watch the client: a server-sent-event stream, and a wait for a non-streamed
answer, both of which notice a client that goes away (the ASGI `http.disconnect` message) while
the answer is still being made, and then run its clean-up at once, which frees the slot.

The stream follows llama-server (`handle_completions_impl`): nothing is sent until the first
chunk, so an error before it is a real HTTP status; later errors are `data: {"error": ...}`
without `data: [DONE]`; `:` comment lines keep a quiet stream alive.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.responses import JSONResponse

from .errors import APIError
from .shapes import dumps

PING = b":\n\n"  # llama-server's keep-alive comment
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
               (b"x-accel-buffering", b"no")]


def sse(data) -> bytes:
    """One event: `data: JSON` and a blank line (RFC 8895)."""
    return b"data: " + dumps(data) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def error_response(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class EventStream:
    """An ASGI answer sending `chunks` (bytes) as text/event-stream. `on_close` runs however it
    ends (finished, failed, client gone, a write stuck past `write_timeout`). Keep-alive
    comments (PING) before the first chunk are dropped: until the stream has begun nothing is
    sent, so that an early error keeps its HTTP status."""

    def __init__(self, chunks: AsyncIterator[bytes], on_close: Callable[[], Awaitable],
                 write_timeout: float):
        self.chunks, self.on_close, self.write_timeout = chunks, on_close, write_timeout
        self._writing_since: float | None = None  # loop time the write under way began

    async def __call__(self, scope, receive, send) -> None:
        watchers = {asyncio.ensure_future(_disconnected(receive)),
                    asyncio.ensure_future(self._stuck_write())}
        producer = asyncio.ensure_future(self._produce(send))
        try:
            await asyncio.wait({*watchers, producer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (*watchers, producer):
                task.cancel()
            try:
                await self.on_close()  # first: the slot is freed before anything else
            finally:
                await asyncio.gather(*watchers, producer, return_exceptions=True)
                await self.chunks.aclose()
        if producer.done() and not producer.cancelled() and producer.exception():
            raise producer.exception()

    async def _stuck_write(self) -> None:
        """Returns once a write has waited longer than write_timeout (the client stopped
        reading): one watchdog per stream rather than a timeout around every chunk's write."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.write_timeout / 4)
            since = self._writing_since
            if since is not None and loop.time() - since > self.write_timeout:
                return

    async def _produce(self, send) -> None:
        started = False
        loop = asyncio.get_running_loop()

        async def write(data: bytes, more: bool = True) -> None:
            self._writing_since = loop.time()
            await send({"type": "http.response.body", "body": data, "more_body": more})
            self._writing_since = None

        try:
            async for chunk in self.chunks:
                if chunk is PING and not started:
                    continue
                if not started:
                    await send({"type": "http.response.start", "status": 200,
                                "headers": SSE_HEADERS})
                    started = True
                await write(chunk)
        except APIError as e:
            if not started:
                body = dumps(e.body())
                await send({"type": "http.response.start", "status": e.status,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode())]})
                await write(body, more=False)
                return
            await write(sse(e.body()))
        await write(b"", more=False)


async def until_disconnect(request, work: Awaitable):
    """`await work`, unless the client goes away first: then `work` is cancelled (its finally
    blocks free what it holds) and None is returned."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)
    return None if task.cancelled() else task.result()
