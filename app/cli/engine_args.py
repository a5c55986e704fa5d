"""The model-loading flags shared by run, perplexity, embed, bench and serve (llama.cpp's names),
and the one place they become the engine's LoadConfig (`load_config`)."""
import os
import sys

from rich.console import Console

from llamatui.models.store import mark_used, resolve_model

from .flags import (add_cache_types, add_ctx_size, add_offload, add_threads, int_at_least,
                    offload_options)


def add_model_arguments(p, default_ctx: int = 4096, model_ctx: bool = True):
    """model_ctx: whether -c 0 (the model's training context) is allowed."""
    p.add_argument("-m", "--model", required=True, help="GGUF file, or a model name in the store")
    add_ctx_size(p, default_ctx, model_default=model_ctx)
    add_threads(p)
    add_cache_types(p)
    add_offload(p)
    p.add_argument("--no-mmap", action="store_true", help="read the model into memory")
    p.add_argument("--mlock", action="store_true", help="keep the model in RAM")
    p.add_argument("--no-context-shift", action="store_true",
                   help="stop with an error when the context is full instead of shifting it")
    p.add_argument("--keep", type=int_at_least(-1, "must be at least 0 (-1 = all)"), default=0,
                   metavar="N", help="number of tokens to keep from the initial prompt when the "
                                     "context shifts (default: 0, -1 = all)")


def add_chat_template_arguments(p):
    """llama.cpp's --chat-template / --chat-template-file (for run and serve)."""
    from llamatui.inference import CHAT_TEMPLATE_NAMES

    group = p.add_mutually_exclusive_group()
    group.add_argument("--chat-template", default=None, metavar="NAME|FILE|JINJA",
                       help="the chat template: a built-in one by name "
                            f"({', '.join(CHAT_TEMPLATE_NAMES)}), a Jinja file, or Jinja source "
                            "(default: the model's own)")
    group.add_argument("--chat-template-file", default=None, metavar="FILE",
                       help="the chat template from a Jinja file")


def chat_template_from_args(args) -> str | None:
    """The --chat-template value as LoadConfig takes it (a built-in name or Jinja source)."""
    from llamatui.inference import CHAT_TEMPLATE_NAMES

    value = getattr(args, "chat_template", None)
    path = getattr(args, "chat_template_file", None)
    if path is None and value is not None and value.strip() not in CHAT_TEMPLATE_NAMES:
        if os.path.isfile(value):
            path = value
        elif "{{" not in value and "{%" not in value:
            raise ValueError(f"--chat-template {value!r} is not a built-in template "
                             f"({', '.join(CHAT_TEMPLATE_NAMES)}), a file, or Jinja source")
    if path is None:
        return value
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read the chat template file {path}: {e}") from None


def load_config(args, **changes):
    """The engine's LoadConfig from the model flags (add_model_arguments, and
    add_chat_template_arguments where the command has them), built once here and passed whole
    to Engine.load; `changes` are a command's own values (serve's slots and context policy)."""
    from llamatui.inference import LoadConfig

    return LoadConfig(**{
        "n_ctx": args.ctx_size, "threads": args.threads, "cache_type_k": args.cache_type_k,
        "cache_type_v": args.cache_type_v, "use_mmap": not args.no_mmap, "mlock": args.mlock,
        "context_policy": "error" if args.no_context_shift else "shift",
        "n_keep": max(args.keep, 0),  # --keep -1 needs the prompt: the command sets it
        "chat_template": chat_template_from_args(args), "offload": offload_options(args),
        **changes})


def load_engine(args, config=None):
    """Loads the engine with a status line on stderr: args.model as `config` says (None: as
    the model flags say, load_config)."""
    from llamatui.inference import Engine

    path = resolve_model(args.model)
    config = config if config is not None else load_config(args)
    console = Console(stderr=True)
    with console.status("Loading model…") as status:
        def progress(stage, done, total):
            status.update(f"{stage}…")

        engine = Engine.load(path, config, progress=progress if sys.stderr.isatty() else None)
    mark_used(path)
    info = engine.info
    gpu = (f", {info.n_gpu_layers}/{info.n_layer + 1} layers on the GPU "
           f"({info.vram_bytes / 2**20:.0f} MiB of VRAM)" if info.n_gpu_layers else "")
    console.print(f"[dim]{info.name}: {info.architecture} {info.quantization}, "
                  f"{info.n_params / 1e6:.0f}M parameters, n_ctx {info.n_ctx}, "
                  f"{engine.threads} threads{gpu}[/]")
    note = gpu_note_to_show(info, getattr(args, "n_gpu_layers", None))
    if note:
        console.print(f"[yellow]{note}[/]")
    if info.n_ctx > info.n_ctx_train:  # llama.cpp warns the same when a context is created
        console.print(f"[yellow]warning: n_ctx ({info.n_ctx}) > n_ctx_train "
                      f"({info.n_ctx_train}) -- possible training context overflow[/]")
    return engine


def gpu_note_to_show(info, requested) -> str:
    """The engine's reason for not using the GPU, when the user should see it: always when -ngl
    was given; with the default (auto) only when a GPU library is installed (a CPU-only install
    has nothing to be told)."""
    from llamatui.inference import CUPY_MISSING
    if not info.gpu_note or requested == 0:
        return ""
    if requested is None and CUPY_MISSING in info.gpu_note:
        return ""
    return info.gpu_note
