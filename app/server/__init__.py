"""`llamatui serve`: an OpenAI-compatible HTTP server (llama-server's routes, flags and answers)
over the engine's scheduler.

    served = ServedEngine(engine)                 # or ServedEngine() + served.load(loader)
    server = Server(ServerConfig(port=8080), served)
    server.start()  # a thread; server.run() serves in the foreground
    ...
    server.stop()

Modules: config (settings, shared state), errors (llama-server's error objects), schema (the
request-schema checker), requests (request schemas → jobs), served_engine (the server's handle
on the engine: its engine thread and the bridge to the event loop), shapes (response bodies),
sse (streams and disconnects), metrics, openapi, routes (the route table and handlers), app (the
ASGI app and its layers), runner (uvicorn).
"""
from .config import ServerConfig
from .runner import Server, ServerError
from .served_engine import ServedEngine

__all__ = ["ServedEngine", "Server", "ServerConfig", "ServerError"]
