"""Numeric flags shared by the subcommands, range-checked while argparse reads them.

The names, defaults, meanings and (where llama.cpp has one) error wording follow llama.cpp's
`common/arg.cpp`. A value is checked as the command line is parsed, so a bad one is reported
before anything is opened or loaded; argparse names the flag ("argument -t/--threads: ...").
Where llama.cpp accepts a value and gives it a meaning (a negative --temp is greedy, -s -1 a
random seed) it is accepted here too; where a value means nothing (-t 0, --top-p 2) it is an error.
"""
from __future__ import annotations

import argparse
import math
from typing import Callable

# llama-completion's floor for -c (it raises smaller values to this with a warning).
MIN_CTX = 8


def checked(parse: Callable, ok: Callable, rule: str) -> Callable[[str], object]:
    """An argparse type: `parse` the text, then reject a value for which `ok` is false with
    "RULE, got TEXT". The returned function carries parse's name, so a value that does not parse
    at all keeps argparse's own message ("invalid int value: 'x'")."""
    def convert(text: str):
        value = parse(text)
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{rule}, got {text}")
        return value
    convert.__name__ = parse.__name__
    return convert


def int_at_least(low: int, rule: str | None = None) -> Callable[[str], int]:
    return checked(int, lambda v: v >= low, rule or f"must be at least {low}")


def finite_float(rule: str) -> Callable[[str], float]:
    return checked(float, math.isfinite, rule)


def probability(name: str, off: str) -> Callable[[str], float]:
    """--top-p, --min-p, --typical: a probability in [0, 1]; `off` is the value that disables."""
    return checked(float, lambda v: 0.0 <= v <= 1.0,
                   f"{name} must be between 0.0 and 1.0 ({off} = disabled)")


def max_threads() -> int:
    """The most threads the engine can run: numba starts at most NUMBA_NUM_THREADS (by default
    the CPUs this process may use), and Engine.load caps -t there."""
    from numba.core import config  # imported only when -t is given: numba is slow to import
    return int(config.NUMBA_NUM_THREADS)


def threads(text: str) -> int:
    n = int(text)
    limit = max_threads()
    if not 1 <= n <= limit:
        raise argparse.ArgumentTypeError(
            f"must be between 1 and {limit} (the CPUs numba may use; NUMBA_NUM_THREADS sets "
            f"it), got {text}")
    return n


threads.__name__ = "int"


def ctx_size(model_default: bool, minimum: int = MIN_CTX) -> Callable[[str], int]:
    """-c: at least `minimum` tokens; 0 means the model's training context where model_default."""
    if model_default:
        return checked(int, lambda v: v == 0 or v >= minimum,
                       f"minimum context size is {minimum} (0 = loaded from model)")
    return int_at_least(minimum, f"minimum context size is {minimum}")


def add_threads(p) -> None:
    p.add_argument("-t", "--threads", type=threads, default=None, metavar="N",
                   help="number of CPU threads to use (default: the physical cores)")


def add_ctx_size(p, default: int, model_default: bool = True, what: str | None = None,
                 minimum: int = MIN_CTX) -> None:
    zero = ", 0 = loaded from model" if model_default else ""
    p.add_argument("-c", "--ctx-size", type=ctx_size(model_default, minimum), default=default,
                   metavar="N", help=f"{what or 'size of the prompt context'} "
                                     f"(default: {default}{zero})")


def add_cache_types(p) -> None:
    for short, long, which in (("-ctk", "--cache-type-k", "K"), ("-ctv", "--cache-type-v", "V")):
        p.add_argument(short, long, default="f16", choices=("f16", "f32", "q8_0"),
                       help=f"KV cache data type for {which} (default: f16)")


def add_chunks(p) -> None:
    p.add_argument("--chunks", type=checked(int, lambda v: v == -1 or v >= 1,
                                            "must be at least 1 (-1 = all)"),
                   default=-1, metavar="N",
                   help="max number of chunks to process (default: -1, -1 = all)")


def chunk_limit(n_chunks: int) -> int | None:
    """--chunks as the scoring code takes it: None for all."""
    return None if n_chunks < 0 else n_chunks


# ----------------------------------------------------------------------------- GPU offload


def gpu_layers(text: str):
    """-ngl: a layer count, 'auto' or 'all' (a negative count means all, as in llama.cpp), read
    by the engine's one reader of the value (parse_n_gpu_layers); only the error is worded here,
    as argparse words the other flags'."""
    from llamatui.inference import OffloadError, parse_n_gpu_layers
    try:
        return parse_n_gpu_layers(text)
    except OffloadError:
        raise argparse.ArgumentTypeError(
            f"must be a number of layers, 'auto' or 'all', got {text}") from None


gpu_layers.__name__ = "int"


def tensor_split(text: str) -> list[float]:
    """-ts: proportions per GPU, 'N0,N1,...' (or 'N0/N1/...', as llama.cpp also reads)."""
    parts = text.replace("/", ",").split(",")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be comma-separated proportions such as 3,1, got {text}") from None
    if any(not math.isfinite(v) or v < 0 for v in values) or not any(values):
        raise argparse.ArgumentTypeError(
            f"proportions must be non-negative and not all 0, got {text}")
    return values


tensor_split.__name__ = "list"


def add_offload(p, default_ngl=None) -> None:
    """llama.cpp's GPU offload flags. default_ngl None: 'auto', quietly (a machine without a
    GPU says nothing about it unless -ngl is given)."""
    shown = "auto" if default_ngl is None else default_ngl
    p.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="n_gpu_layers",
                   type=gpu_layers, default=default_ngl, metavar="N",
                   help="max. number of layers to store in VRAM: a number, 'auto' (as many as "
                        f"fit) or 'all' (default: {shown})")
    p.add_argument("-mg", "--main-gpu", type=int_at_least(0, "must be a GPU index (0 or more)"),
                   default=0, metavar="INDEX",
                   help="the GPU to use with --split-mode none (default: 0)")
    p.add_argument("-ts", "--tensor-split", type=tensor_split, default=None, metavar="N0,N1,...",
                   help="fraction of the model to offload to each GPU, e.g. 3,1 (default: in "
                        "proportion to free memory)")
    p.add_argument("-sm", "--split-mode", choices=("none", "layer"), default="layer",
                   help="how to split the model across GPUs: none (all on --main-gpu) or "
                        "layer (default: layer)")
    p.add_argument("-nkvo", "--no-kv-offload", action="store_true",
                   help="keep the KV cache in host memory (attention runs on the CPU)")


def offload_options(args):
    """The offload flags (add_offload) as the engine's OffloadOptions; an -ngl not given is
    'auto' (args.n_gpu_layers stays None, so that a command can tell it was not given)."""
    from llamatui.inference import OffloadOptions
    ngl = getattr(args, "n_gpu_layers", None)
    return OffloadOptions(n_gpu_layers="auto" if ngl is None else ngl,
                          main_gpu=getattr(args, "main_gpu", 0),
                          tensor_split=getattr(args, "tensor_split", None),
                          offload_kv=not getattr(args, "no_kv_offload", False),
                          split_mode=getattr(args, "split_mode", "layer"))
