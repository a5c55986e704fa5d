"""The ASGI app: Starlette's router over routes.ROUTES, wrapped in pure-ASGI layers (outermost
first): the request log, CORS (only for the --cors-origin origins), the API-key check, and the
loading gate (503 "Loading model" until the engine is ready, as llama-server).

Starlette rather than FastAPI: the request schemas are ours (one table that both checks bodies
and feeds /openapi.json), errors must be llama-server's 400/`{"error": ...}` shapes rather than
FastAPI's 422 validation bodies, and a stream must watch the client itself; what remains
(routing, requests, responses) is Starlette's, without pydantic models in the way.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import time

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse
from starlette.routing import Route as StarletteRoute

from .config import LogEntry, ServerConfig, ServerState
from .errors import INVALID_KEY, APIError
from .routes import PUBLIC_PATHS, ROUTES
from .served_engine import READY
from .sse import dumps, error_response

_STATUS_TYPES = {404: "not_found_error", 405: "invalid_request_error"}


def create_app(config: ServerConfig, served) -> Starlette:
    state = ServerState(config, served)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        monitor = asyncio.ensure_future(state.lag.run())
        try:
            yield
        finally:
            monitor.cancel()

    middleware = [Middleware(RequestLog, state=state)]
    if config.cors_origins:
        middleware.append(Middleware(
            CORSMiddleware, allow_origins=list(config.cors_origins),
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type", "X-Api-Key"]))
    middleware += [Middleware(APIKeyCheck, keys=config.api_keys),
                   Middleware(LoadingGate, served=served)]
    routes = [StarletteRoute(path, r.handler, methods=[r.method])
              for r in ROUTES for path in r.paths]
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan,
                    exception_handlers={APIError: _api_error, HTTPException: _http_error,
                                        Exception: _server_error})
    app.state.llamatui = state
    return app


async def _api_error(request, exc: APIError):
    return error_response(exc)


async def _http_error(request, exc: HTTPException):
    kind = _STATUS_TYPES.get(exc.status_code, "invalid_request_error")
    message = "File Not Found" if exc.status_code == 404 else exc.detail
    return JSONResponse({"error": {"code": exc.status_code, "message": message, "type": kind}},
                        status_code=exc.status_code)


async def _server_error(request, exc: Exception):
    return error_response(APIError(f"internal error: {type(exc).__name__}: {exc}",
                                   "server_error"))


async def _send_error(send, error: APIError) -> None:
    body = dumps(error.body())
    await send({"type": "http.response.start", "status": error.status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class APIKeyCheck:
    """With API keys, every path but the public routes' (PUBLIC_PATHS, from the route table)
    needs `Authorization: Bearer KEY` or `X-Api-Key: KEY`. Keys are compared as SHA-256 digests
    with hmac.compare_digest, each of them, so the time taken tells nothing about a key."""

    def __init__(self, app, keys: tuple[str, ...]):
        self.app = app
        self.digests = [_key_digest(k) for k in keys]

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self.digests or scope["path"] in PUBLIC_PATHS:
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        given = headers.get(b"authorization", b"").decode("latin-1")
        if given.startswith("Bearer "):
            given = given[len("Bearer "):]
        elif not given:
            given = headers.get(b"x-api-key", b"").decode("latin-1")
        digest = _key_digest(given)
        if not any([hmac.compare_digest(digest, d) for d in self.digests]):
            return await _send_error(send, APIError(INVALID_KEY, "authentication_error"))
        return await self.app(scope, receive, send)


class LoadingGate:
    """503 "Loading model" for every route until the engine is ready (llama-server's
    middleware_server_state); the reason when loading failed."""

    def __init__(self, app, served):
        self.app, self.served = app, served

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.served.state != READY:
            try:
                self.served.check_ready()
            except APIError as e:
                return await _send_error(send, e)
        return await self.app(scope, receive, send)


class RequestLog:
    """Counts requests and keeps the last ones (method, path, status, time, tokens) for the
    app's Server screen."""

    def __init__(self, app, state: ServerState):
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0, status = time.perf_counter(), [0]

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        self.state.n_requests += 1
        try:
            await self.app(scope, receive, send_status)
        finally:
            choices = scope.get("llamatui.choices") or []
            client = scope.get("client") or ("", 0)
            self.state.log.append(LogEntry(
                time.time(), f"{client[0]}:{client[1]}", scope["method"], scope["path"],
                status[0] or 499, time.perf_counter() - t0,
                sum(c.n_prompt for c in choices), sum(c.n_generated for c in choices)))
