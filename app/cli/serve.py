"""`llamatui serve -m MODEL`: an OpenAI-compatible server with llama-server's flags and
defaults (tools/server/README.md), on the engine's scheduler (app/server/).

It listens at once and answers 503 "Loading model" until the model is loaded, as llama-server.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading

from llamatui.models.store import mark_used, resolve_model

from . import CommandError, UsageError
from .engine_args import (add_chat_template_arguments, add_model_arguments, gpu_note_to_show,
                          load_config)
from .flags import checked, int_at_least


# The event loop's Python and the engine thread's share the GIL: when the engine comes back
# from a kernel while the loop writes a step's tokens to its streams, it waits at most this long
# for the GIL (Python's default is 5 ms), instead of leaving the cores idle until the loop is
# done (benchmarks/serve_load.py measures the difference with many streams).
GIL_SWITCH_S = 0.0002


def add_arguments(p):
    add_model_arguments(p, default_ctx=4096)
    add_chat_template_arguments(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="IP address to listen on (default: 127.0.0.1; 0.0.0.0 serves the "
                        "network, which only --api-key protects)")
    p.add_argument("--port", type=checked(int, lambda v: 0 <= v <= 65535,
                                          "must be a port between 0 and 65535"),
                   default=8080, help="port to listen on (default: 8080, 0 = any free one)")
    p.add_argument("-np", "--parallel", type=int_at_least(1), default=4, metavar="N",
                   help="number of slots: requests generated at once, each with "
                        "ctx-size / N of the context (default: 4)")
    p.add_argument("-cb", "--cont-batching", action="store_true",
                   help="continuous batching (always on; accepted for llama-server's "
                        "command lines)")
    p.add_argument("--ctx-shift", "--context-shift", action="store_true",
                   help="shift the context when a slot's fills instead of ending the reply "
                        "(default: off, as llama-server)")
    p.add_argument("--no-ctx-shift", dest="no_context_shift", action="store_true",
                   help="end a reply when its slot's context is full (the default)")
    p.add_argument("--alias", default=None, help="the model's name in answers and /v1/models "
                                                 "(default: the file's name)")
    p.add_argument("--api-key", action="append", default=[], metavar="KEY",
                   help="API key(s), comma-separated or repeated; then every route but "
                        "/health and /v1/models needs one (default: none)")
    p.add_argument("--api-key-file", default=None, metavar="FNAME",
                   help="a file of API keys, one per line (# starts a comment)")
    p.add_argument("--embeddings", "--embedding", action="store_true",
                   help="enable /v1/embeddings")
    p.add_argument("--pooling", choices=("mean", "cls", "last"), default=None,
                   help="pooling of embeddings (default: the model's own; mean when it sets "
                        "none)")
    p.add_argument("--metrics", action="store_true",
                   help="enable the Prometheus /metrics endpoint")
    p.add_argument("--no-slots", action="store_true", help="disable the /slots endpoint")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="allow browser pages from ORIGIN (scheme://host[:port]; "
                        "comma-separated or repeated; default: none, CORS off)")
    p.add_argument("-to", "--timeout", type=int_at_least(1), default=600, metavar="N",
                   help="read/write timeout in seconds (default: 600)")
    p.add_argument("--max-queue", type=int_at_least(0), default=64, metavar="N",
                   help="requests that may wait for a slot; past it, 503 (default: 64)")
    p.add_argument("--sse-ping-interval", type=int_at_least(1), default=30, metavar="N",
                   help="seconds between keep-alive comments of a quiet stream (default: 30)")
    add_reasoning_arguments(p)


# ----------------------------------------------------------------------------- reasoning

def add_reasoning_arguments(p):
    """llama-server's reasoning defaults (common/arg.cpp). --chat-template-kwargs, --reasoning
    and --reasoning-effort all edit one dict of template variables (default_template_kwargs),
    in command-line order as llama.cpp applies them, so the last flag to set a key wins."""
    from llamatui.inference import REASONING_FORMATS

    p.add_argument("--reasoning-format", choices=REASONING_FORMATS, default="auto",
                   help="where replies put their thinking: none leaves it in the content, the "
                        "others put it in reasoning_content (deepseek-legacy as deepseek, as "
                        "llama.cpp's parsers do) (default: auto)")
    p.add_argument("-rea", "--reasoning", dest="template_kwargs", type=reasoning_switch,
                   action=template_kwargs_action(_set_thinking), metavar="on|off|auto",
                   help="think in chats: sets the template's enable_thinking (default: auto, "
                        "thinking where the template can)")
    p.add_argument("--reasoning-effort", dest="template_kwargs",
                   action=template_kwargs_action(_set_effort), metavar="LEVEL",
                   help="reasoning_effort given to the template, e.g. low, medium, high; "
                        "'default' keeps the template's (default: default)")
    p.add_argument("--chat-template-kwargs", dest="template_kwargs", type=json_object,
                   action=template_kwargs_action(dict.update), metavar="JSON",
                   help="more template variables, a JSON object such as "
                        "'{\"key\": \"value\"}'; a request's own override them")
    p.add_argument("--reasoning-budget", type=int_at_least(-1, "must be -1 (unlimited), 0 (end "
                                                               "thinking at once) or more"),
                   default=-1, metavar="N",
                   help="token budget for thinking: -1 unlimited, 0 immediate end, N > 0 "
                        "(default: -1)")
    p.add_argument("--reasoning-budget-message", default="", metavar="MESSAGE",
                   help="text put before the end-of-thinking tag when the budget runs out "
                        "(default: none)")


def template_kwargs_action(update):
    """An argparse action that applies update(kwargs, value) to a copy of the namespace's
    template variables (so the parser's default is never changed in place)."""
    class TemplateKwargs(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            kwargs = dict(getattr(namespace, self.dest) or {})
            update(kwargs, values)
            setattr(namespace, self.dest, kwargs)
    return TemplateKwargs


def reasoning_switch(text: str) -> bool | None:
    """-rea's value as llama.cpp reads it (is_truthy / is_falsey / is_autoy): True, False, or
    None for auto (which leaves enable_thinking as it is)."""
    for value, words in ((True, ("on", "enabled", "true", "1")),
                         (False, ("off", "disabled", "false", "0")), (None, ("auto", "-1"))):
        if text in words:
            return value
    raise argparse.ArgumentTypeError(f"must be on, off or auto, got {text}")


reasoning_switch.__name__ = "value"


def _set_thinking(kwargs: dict, switch: bool | None) -> None:
    if switch is not None:
        kwargs["enable_thinking"] = switch


def _set_effort(kwargs: dict, level: str) -> None:
    if level == "default":
        kwargs.pop("reasoning_effort", None)
    else:
        kwargs["reasoning_effort"] = level


def json_object(text: str) -> dict:
    """--chat-template-kwargs: a JSON object (llama.cpp takes its items as template variables)."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise argparse.ArgumentTypeError(f"must be a JSON object ({e}), got {text}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object such as "
                                         f"'{{\"key\": \"value\"}}', got {text}")
    return value


json_object.__name__ = "JSON"


def api_keys(args) -> tuple[str, ...]:
    keys = [k.strip() for value in args.api_key for k in value.split(",") if k.strip()]
    if args.api_key_file:
        try:
            with open(args.api_key_file, encoding="utf-8") as f:
                keys += [line.strip() for line in f
                         if line.strip() and not line.lstrip().startswith("#")]
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"cannot read --api-key-file {args.api_key_file}: {e}") from None
        if not keys:
            raise UsageError(f"--api-key-file {args.api_key_file} holds no key")
    return tuple(keys)


def server_config(args):
    from ..server import ServerConfig

    origins = tuple(o.strip() for value in args.cors_origin for o in value.split(",")
                    if o.strip())
    try:
        return ServerConfig(
            host=args.host, port=args.port, api_keys=api_keys(args), cors_origins=origins,
            alias=args.alias, embeddings=args.embeddings, pooling=args.pooling,
            metrics=args.metrics, slots=not args.no_slots, timeout=float(args.timeout),
            ping_interval=float(args.sse_ping_interval), reasoning_format=args.reasoning_format,
            template_kwargs=args.template_kwargs or {}, reasoning_budget=args.reasoning_budget,
            reasoning_budget_message=args.reasoning_budget_message)
    except ValueError as e:
        raise UsageError(str(e)) from None


def run(args):
    from ..server import ServedEngine, Server, ServerError

    config = server_config(args)
    if args.ctx_shift and args.no_context_shift:
        raise UsageError("--ctx-shift and --no-ctx-shift contradict each other")
    path = resolve_model(args.model)
    # llama-server's defaults: no context shift unless --ctx-shift, -np slots
    engine_config = load_config(args, context_policy="shift" if args.ctx_shift else "error",
                                n_parallel=args.parallel)
    served = ServedEngine(max_queue=args.max_queue)
    server = Server(config, served)
    try:
        server.bind()
    except ServerError as e:
        raise CommandError(str(e)) from None

    def load():
        from llamatui.inference import Engine
        return Engine.load(path, engine_config)

    def load_then_report():
        served.load(load)
        if served.error is not None:
            server.request_stop()
            return
        mark_used(path)
        info = served.engine.info
        print(f"llamatui serve: {info.name} loaded ({info.architecture} {info.quantization}, "
              f"n_ctx {info.n_ctx}, {args.parallel} slots of {served.limits.n_ctx_slot}, "
              f"{served.engine.threads} threads); serving {server.url}", file=sys.stderr,
              flush=True)
        note = gpu_note_to_show(info, args.n_gpu_layers)
        if note:
            print(f"llamatui serve: {note}", file=sys.stderr, flush=True)

    print(f"llamatui serve: listening on {server.url}, loading {path}", file=sys.stderr,
          flush=True)
    sys.setswitchinterval(GIL_SWITCH_S)
    threading.Thread(target=load_then_report, name="llamatui-load", daemon=True).start()
    server.run()
    if served.error is not None:
        raise CommandError(f"cannot load {path}: {served.error}")
