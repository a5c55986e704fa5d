"""How to load a model: one `LoadConfig`, built once where the options come in (the CLI's flags,
the chat app's settings, the server's flags) and passed whole to `Engine.load`, `Model.load` and
`cuda.offload.place`, as vLLM's EngineArgs or llama.cpp's common_params.

    config = LoadConfig(n_ctx=4096, offload=OffloadOptions(n_gpu_layers="auto"))
    engine = Engine.load("model.gguf", config)

Every value is checked once, when the config is made, with a message that names the option
(the ValueErrors the engine has always given); nothing downstream checks or re-reads a value
again. What can only be checked against the machine (does GPU `main_gpu` exist, one `-ts` share
per device) is checked when the offload is planned (placement.plan_offload).

`parse_n_gpu_layers` is the one reader of an `-ngl` value: the CLI's argparse type calls it,
and OffloadOptions calls it on whatever it is given.

Pure Python: importing this module loads neither numba nor a GPU library, so a front-end builds
a config without paying for the engine.
"""
from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass, field

MIN_CTX = 8  # as llama.cpp raises a smaller n_ctx to (per slot)
CONTEXT_POLICIES = ("error", "shift")  # what happens when a sequence fills its context
CACHE_TYPES = ("f32", "f16", "q8_0")  # the KV cache's storage types (kv_cache.py)
SPLIT_MODES = ("layer", "none")  # llama.cpp's -sm values that a machine of GPUs here can honour


class OffloadError(ValueError):
    """Offload options that cannot be honoured (bad -ngl / -mg / -ts / -sm values)."""


def default_threads() -> int:
    """Physical cores, as llama.cpp defaults to."""
    try:
        import psutil
        n = psutil.cpu_count(logical=False)
    except ImportError:
        n = None
    return max(1, n or os.cpu_count() or 1)


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def parse_n_gpu_layers(value) -> int | str:
    """An -ngl value (llama.cpp's --n-gpu-layers): a layer count (negative = all), 'all' or
    'auto', given as text or a number; returns the int, 'all' or 'auto'. The only reader of
    the value: the CLI's argparse type and OffloadOptions both call it."""
    if _is_int(value):
        return int(value)
    text = str(value).strip().lower()
    if text in ("auto", "all"):
        return text
    try:
        return int(text)
    except ValueError:
        raise OffloadError(f"-ngl: {value!r} is not a layer count, 'all' or 'auto'") from None


def check_cache_type(name: str) -> str:
    """A KV cache type (llama.cpp's -ctk / -ctv) in lower case; ValueError for an unknown one."""
    t = str(name).lower()
    if t not in CACHE_TYPES:
        raise ValueError(f"unsupported KV cache type {name!r}; supported: {', '.join(CACHE_TYPES)}")
    return t


@dataclass(frozen=True, kw_only=True)
class OffloadOptions:
    """llama.cpp's GPU offload options (common_params): which layers go to which GPU.

    n_gpu_layers: -ngl: a layer count with the output layer counted (0: the CPU only, without
                  looking for a GPU; negative: all), 'all', or 'auto' (the most that fit)
    main_gpu:     -mg: the GPU of split mode 'none'
    tensor_split: -ts: each GPU's share of the offloaded layers (None: in proportion to each
                  GPU's free memory); a tuple of numbers
    offload_kv:   the negation of --no-kv-offload: a layer's KV cache lives with the layer
    split_mode:   -sm: 'layer' (spread the layers over the GPUs) or 'none' (all on main_gpu)

    Without a usable GPU a model runs on the CPU whatever these say (Engine.info.gpu_note says
    why).
    """
    n_gpu_layers: int | str = 0
    main_gpu: int = 0
    tensor_split: tuple[float, ...] | None = None
    offload_kv: bool = True
    split_mode: str = "layer"

    def __post_init__(self):
        _normalize(self, "n_gpu_layers", parse_n_gpu_layers(self.n_gpu_layers))
        if not _is_int(self.main_gpu) or self.main_gpu < 0:
            raise OffloadError(f"-mg: {self.main_gpu!r} is not a GPU index (0 or more)")
        _normalize(self, "main_gpu", int(self.main_gpu))
        if self.tensor_split is not None:
            _normalize(self, "tensor_split", _shares(self.tensor_split))
        _normalize(self, "offload_kv", bool(self.offload_kv))
        if self.split_mode not in SPLIT_MODES:
            raise OffloadError(f"-sm: {self.split_mode!r} is not one of {', '.join(SPLIT_MODES)}")

    @property
    def uses_gpu(self) -> bool:
        """Whether to look for a GPU at all (-ngl 0 never does)."""
        return self.n_gpu_layers != 0


def _normalize(config, name: str, value) -> None:
    """Stores a checked value in its normal form (an int, a tuple, a lower-case name) on a frozen
    config, as its __post_init__ finishes."""
    object.__setattr__(config, name, value)


def _shares(value) -> tuple[float, ...]:
    """-ts as a tuple of floats. Their count and signs are checked against the devices found
    (placement.plan_offload), where the message can say how many are expected."""
    try:
        shares = tuple(float(s) for s in value)
    except (TypeError, ValueError):
        raise OffloadError(f"-ts: {value!r} is not a list of proportions") from None
    if not all(math.isfinite(s) for s in shares):
        raise OffloadError(f"-ts: proportions must be finite numbers, got {list(shares)!r}")
    return shares


@dataclass(frozen=True, kw_only=True)
class LoadConfig:
    """Everything that says how a model is loaded and run, but the file and the progress
    callback (Engine.load's arguments), with llama.cpp's meanings and defaults where it has them.

    n_ctx:          context size in tokens, all slots together (-c); 0: the model's training
                    context. At least MIN_CTX per slot.
    threads:        CPU threads (-t); None: the physical cores
    cache_type_k/v: KV cache storage, 'f16', 'f32' or 'q8_0' (-ctk / -ctv)
    use_mmap:       map the file instead of reading it into memory (--no-mmap negated)
    mlock:          keep the model's pages in RAM (--mlock)
    context_policy: when a sequence fills its context: 'shift' (llama.cpp's context shift: keep
                    the first n_keep tokens, drop half of the rest) or 'error'
    n_keep:         tokens a context shift keeps (--keep; -1: the whole prompt)
    warmup:         run one decode while loading, as llama.cpp's warm-up (compiles the kernels
                    on a first run)
    chat_template:  a built-in template's name (CHAT_TEMPLATE_NAMES) or Jinja source; None: the
                    model's own, or one chosen from its vocabulary (--chat-template)
    n_parallel:     slots: sequences generated at once, each with n_ctx / n_parallel of the
                    context (llama-server's -np; the KV cache's n_seq_max)
    n_ubatch:       tokens per forward pass (-ub)
    offload:        the GPU offload options (OffloadOptions; the default runs on the CPU)
    """
    n_ctx: int = 4096
    threads: int | None = None
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    use_mmap: bool = True
    mlock: bool = False
    context_policy: str = "shift"
    n_keep: int = 0
    warmup: bool = True
    chat_template: str | None = None
    n_parallel: int = 1
    n_ubatch: int = 512
    offload: OffloadOptions = field(default_factory=OffloadOptions)

    def __post_init__(self):
        if not _is_int(self.n_parallel) or self.n_parallel < 1:
            raise ValueError(f"n_parallel must be a positive number of slots, "
                             f"not {self.n_parallel!r}")
        if not _is_int(self.n_ctx) or 0 < self.n_ctx < MIN_CTX * self.n_parallel \
                or self.n_ctx < 0:
            raise ValueError(f"the context size must be 0 (the model's own) or at least "
                             f"{MIN_CTX} tokens per slot, not {self.n_ctx!r}")
        if self.threads is not None and (not _is_int(self.threads) or self.threads < 1):
            raise ValueError(f"threads must be a positive number (None: the physical cores), "
                             f"not {self.threads!r}")
        if self.context_policy not in CONTEXT_POLICIES:
            raise ValueError(f"context_policy must be one of {CONTEXT_POLICIES}, "
                             f"not {self.context_policy!r}")
        if not _is_int(self.n_keep) or self.n_keep < -1:
            raise ValueError(f"n_keep must be a number of tokens (-1: the whole prompt), "
                             f"not {self.n_keep!r}")
        if not _is_int(self.n_ubatch) or self.n_ubatch < 1:
            raise ValueError(f"n_ubatch must be a positive number of tokens, "
                             f"not {self.n_ubatch!r}")
        if self.chat_template is not None and not isinstance(self.chat_template, str):
            raise ValueError(f"chat_template must be a template's name or Jinja source (a str), "
                             f"not {self.chat_template!r}")
        if not isinstance(self.offload, OffloadOptions):
            raise ValueError(f"offload must be an OffloadOptions, "
                             f"not {type(self.offload).__name__} {self.offload!r}")
        for name in ("n_ctx", "n_parallel", "n_keep", "n_ubatch"):
            _normalize(self, name, int(getattr(self, name)))
        _normalize(self, "cache_type_k", check_cache_type(self.cache_type_k))
        _normalize(self, "cache_type_v", check_cache_type(self.cache_type_v))
        for name in ("use_mmap", "mlock", "warmup"):
            _normalize(self, name, bool(getattr(self, name)))

    @property
    def n_threads(self) -> int:
        """The threads to run: `threads`, or the physical cores when it is None."""
        return self.threads if self.threads is not None else default_threads()


def config_or_defaults(config: LoadConfig | None) -> LoadConfig:
    """`config`, or the defaults for None; a TypeError that names the expected type for anything
    else (a context size given where the config goes, say)."""
    if config is None:
        return LoadConfig()
    if not isinstance(config, LoadConfig):
        raise TypeError(f"expected a LoadConfig (such as LoadConfig(n_ctx=4096)), "
                        f"not {type(config).__name__} {config!r}")
    return config
