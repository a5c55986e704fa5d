"""The server's settings (llama-server's flags: tools/server/README.md) and its running state."""
from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field

from llamatui.inference import POOLINGS, REASONING_FORMATS

from .metrics import LoopLagMonitor


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"  # loopback unless asked: a model server is not a public service
    port: int = 8080
    api_keys: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()  # exact origins; never "*"
    alias: str | None = None
    embeddings: bool = False
    pooling: str | None = None  # None: the model's own, mean when it sets none
    metrics: bool = False
    slots: bool = True
    timeout: float = 600.0  # llama-server's read/write timeout (s)
    ping_interval: float = 30.0  # llama-server's --sse-ping-interval (s)
    # Reasoning defaults (llama-server's --reasoning-format, --reasoning-budget[-message], and
    # default_template_kwargs from --chat-template-kwargs, --reasoning, --reasoning-effort): a
    # request's own fields override them (requests.reasoning_options).
    reasoning_format: str = "auto"
    template_kwargs: dict = field(default_factory=dict, hash=False)
    reasoning_budget: int = -1  # thinking tokens before the end is forced; -1: unlimited
    reasoning_budget_message: str = ""

    def __post_init__(self):
        if "*" in self.cors_origins:
            raise ValueError("--cors-origin '*' would let every web page use this server; name "
                             "the origins (e.g. http://localhost:3000)")
        for origin in self.cors_origins:
            if "://" not in origin:
                raise ValueError(f"--cors-origin {origin!r} is not an origin; expected "
                                 "scheme://host[:port], e.g. http://localhost:3000")
        if any(not k for k in self.api_keys):
            raise ValueError("an API key is empty")
        if self.pooling is not None and self.pooling not in POOLINGS:
            raise ValueError(f"--pooling must be one of {', '.join(POOLINGS)}, "
                             f"not {self.pooling!r}")
        self._check_reasoning()

    def _check_reasoning(self):
        if self.reasoning_format not in REASONING_FORMATS:
            raise ValueError(f"--reasoning-format must be one of {', '.join(REASONING_FORMATS)}, "
                             f"not {self.reasoning_format!r}")
        if self.reasoning_budget < -1:
            raise ValueError(f"--reasoning-budget must be -1 (unlimited), 0 or more, not "
                             f"{self.reasoning_budget}")
        # llama-server would refuse every chat request instead ("invalid type for
        # enable_thinking"): refused once, at the start
        thinking = self.template_kwargs.get("enable_thinking", True)
        if not isinstance(thinking, bool):
            raise ValueError("--chat-template-kwargs: enable_thinking must be true or false, not "
                             f"{thinking!r} (or use --reasoning on|off)")


@dataclass
class LogEntry:
    """One answered request, for the app's request log."""
    time: float
    client: str
    method: str
    path: str
    status: int
    seconds: float
    n_prompt: int = 0
    n_generated: int = 0


@dataclass
class ServerState:
    """What the handlers share: the settings, the served engine, the request log and the
    event-loop lag monitor."""
    config: ServerConfig
    served: object  # served_engine.ServedEngine
    log: deque = field(default_factory=lambda: deque(maxlen=500))
    lag: LoopLagMonitor = field(default_factory=LoopLagMonitor)
    started: float = field(default_factory=time.time)
    n_requests: int = 0

    @property
    def model_name(self) -> str:
        """The model's id in answers: --alias, else the file's name (as llama-server)."""
        if self.config.alias:
            return self.config.alias
        engine = self.served.engine
        return os.path.basename(engine.info.path) if engine is not None else ""
