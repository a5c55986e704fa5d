"""The engine's public API: load a GGUF model, tokenize, template, generate.

    engine = Engine.load("model.gguf", n_ctx=4096)
    for event in engine.generate([{"role": "user", "content": "Hi"}], temperature=0.7):
        print(event.text, end="")

The UI and the server use only this module. `generate` is a generator meant to run in a worker
thread; `cancel()` from any other thread stops it at the next token.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields

import numpy as np

from .catalog import mix_name
from .chat_template import ChatTemplate
from .gguf import GGUFFile
from .kv_cache import KVCacheFullError
from .model import Batch, Model
from .sampling import Sampler, SamplingParams, StopStringMatcher
from .tokenizer import Tokenizer

Progress = Callable[[str, int, int], None]
CONTEXT_POLICIES = ("error", "shift")


class ContextFullError(ValueError):
    """The prompt (or the conversation) does not fit in the context window."""


@dataclass(frozen=True)
class ModelInfo:
    path: str
    name: str
    architecture: str
    quantization: str
    n_params: int
    n_layer: int
    n_embd: int
    n_vocab: int
    n_ctx_train: int
    n_ctx: int
    file_bytes: int
    kv_bytes: int
    cache_type_k: str
    cache_type_v: str


@dataclass
class GenerationEvent:
    """One step of a generation.

    kind: "prompt" (the prompt was processed: n_prompt, n_reused, prompt_tps are set),
          "token" (text is the new piece, may be "" while a multi-byte character or a possible
          stop string is held back), or "done" (finish_reason is set; text is any held-back rest).
    """
    kind: str
    text: str = ""
    token_id: int | None = None
    n_prompt: int = 0
    n_reused: int = 0  # prompt tokens found already in the KV cache
    n_generated: int = 0
    prompt_tps: float = 0.0
    gen_tps: float = 0.0
    time_to_first_token: float = 0.0
    kv_used: int = 0
    kv_total: int = 0
    finish_reason: str | None = None  # "stop", "eog", "length", "cancelled", "context_full"
    n_prompt_dropped: int = 0  # prompt tokens cut to fit the context (see Engine.fit_prompt)


def default_threads() -> int:
    """Physical cores, as llama.cpp defaults to."""
    try:
        import psutil
        n = psutil.cpu_count(logical=False)
    except ImportError:
        n = None
    return max(1, n or os.cpu_count() or 1)


def _as_tuple(stop) -> tuple:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


def _sampling_params(sampling: Mapping) -> SamplingParams:
    known = {f.name for f in fields(SamplingParams)}
    unknown = set(sampling) - known
    if unknown:
        raise ValueError(f"unknown sampling option(s): {', '.join(sorted(unknown))}; "
                         f"known: {', '.join(sorted(known))}")
    return SamplingParams(**sampling)


class Engine:
    def __init__(self, gguf: GGUFFile, model: Model, tokenizer: Tokenizer,
                 template: ChatTemplate, threads: int, context_policy: str, n_keep: int):
        self.gguf = gguf
        self.model = model
        self.tokenizer = tokenizer
        self.template = template
        self.threads = threads
        self.context_policy = context_policy
        self.n_keep = n_keep
        self._cached: list[int] = []  # the tokens of sequence 0 now in the KV cache
        self._cancel = threading.Event()
        self._lock = threading.Lock()  # one generation at a time
        md = gguf.metadata
        ftype = md.get("general.file_type")
        self.info = ModelInfo(
            path=str(gguf.path),
            name=str(md.get("general.name") or os.path.basename(str(gguf.path))),
            architecture=model.hparams.arch,
            quantization=mix_name(ftype),
            n_params=sum(t.n_elements for t in gguf.tensors.values()),
            n_layer=model.hparams.n_layer,
            n_embd=model.hparams.n_embd,
            n_vocab=model.n_vocab,
            n_ctx_train=model.hparams.n_ctx_train,
            n_ctx=model.n_ctx,
            file_bytes=gguf.file_size,
            kv_bytes=model.kv.nbytes,
            cache_type_k=model.kv.type_k,
            cache_type_v=model.kv.type_v,
        )

    @classmethod
    def load(cls, path, n_ctx: int = 4096, threads: int | None = None,
             cache_type_k: str = "f16", cache_type_v: str = "f16", use_mmap: bool = True,
             mlock: bool = False, context_policy: str = "shift", n_keep: int = 0,
             warmup: bool = True, progress: Progress | None = None,
             chat_template: str | None = None) -> "Engine":
        """Opens a GGUF model. n_ctx 0 means the model's training context. context_policy: what
        happens when the context fills: "shift" (llama.cpp's context shift: keep the first
        n_keep tokens, drop half of the rest) or "error". chat_template: a built-in template's
        name (CHAT_TEMPLATE_NAMES) or Jinja source; None: the model's own, or for a model
        without one a built-in chosen from its vocabulary. A template compiles when a chat first
        needs it: a broken one does not stop the model from loading or running raw prompts."""
        if context_policy not in CONTEXT_POLICIES:
            raise ValueError(f"context_policy must be one of {CONTEXT_POLICIES}, "
                             f"not {context_policy!r}")
        report = progress or (lambda stage, done, total: None)
        threads = int(threads) if threads else default_threads()
        import numba
        from threadpoolctl import threadpool_limits
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        # numba threads our kernels; BLAS (attention over long batches) runs between them, and a
        # second pool of spinning BLAS threads on the same cores slows both.
        threadpool_limits(limits=1, user_api="blas")
        report("Opening model", 0, 3)
        gguf = GGUFFile.open(path, use_mmap=use_mmap, mlock=mlock)
        try:
            report("Loading tokenizer", 1, 3)
            tokenizer = Tokenizer.from_metadata(gguf.metadata)
            template = ChatTemplate.from_metadata(gguf.metadata, chat_template,
                                                  add_bos=tokenizer.add_bos,
                                                  add_eos=tokenizer.add_eos, tokens=tokenizer.vocab)
            report("Loading weights", 2, 3)
            model = Model.load(gguf, n_ctx=n_ctx, cache_type_k=cache_type_k,
                               cache_type_v=cache_type_v)
            engine = cls(gguf, model, tokenizer, template, threads, context_policy, n_keep)
            if warmup:
                # Like llama.cpp's warm-up decode; on a first run this compiles the kernels.
                report("Warming up (compiles kernels on first run)", 2, 3)
                engine.logits([tokenizer.bos_id if tokenizer.bos_id is not None else 0] * 2)
            report("Ready", 3, 3)
            return engine
        except BaseException:
            gguf.close()
            raise

    def close(self) -> None:
        self.model.close()
        self.gguf.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---------------------------------------------------------------- text

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False
                 ) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    def apply_chat_template(self, messages: Sequence[Mapping],
                            add_generation_prompt: bool = True) -> str:
        """The prompt text for a chat; raises ChatTemplateError (a ValueError) when the template
        fails, within a couple of seconds whatever the template does."""
        return self.template.render(messages, add_generation_prompt=add_generation_prompt)

    def set_chat_template(self, name_or_source: str | None) -> None:
        """Speaks to the model in another template from the next chat on: a built-in name
        (CHAT_TEMPLATE_NAMES) or Jinja source; None: back to the model's own (or the one chosen
        from its vocabulary). Compiles on first use, like Engine.load's chat_template."""
        self.template = ChatTemplate.from_metadata(
            self.gguf.metadata, name_or_source, add_bos=self.tokenizer.add_bos,
            add_eos=self.tokenizer.add_eos, tokens=self.tokenizer.vocab)

    def prompt_tokens(self, prompt_or_messages) -> list[int]:
        """A raw prompt (str) or chat messages (list of {role, content}) as token ids, the way
        llama.cpp does: BOS per the model, special tokens parsed."""
        if isinstance(prompt_or_messages, str):
            text = prompt_or_messages
        else:
            text = self.apply_chat_template(prompt_or_messages)
        return self.tokenize(text, add_special=True, parse_special=True)

    # ---------------------------------------------------------------- evaluation

    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """float32 (n_tokens, n_vocab): the logits at every position of a fresh sequence."""
        ids = [int(t) for t in token_ids]
        if not ids:
            raise ValueError("no tokens to evaluate")
        if len(ids) > self.model.n_ctx:
            raise ContextFullError(f"{len(ids)} tokens do not fit in the context of "
                                   f"{self.model.n_ctx}")
        with self._lock:
            self._cached = []
            out = self.model.logits_for(ids)
            self._cached = ids
            return out

    @property
    def batch_size(self) -> int:
        """Tokens evaluated per forward pass (llama.cpp's n_ubatch)."""
        return self.model.n_ubatch

    def reset(self) -> None:
        """Empties the KV cache."""
        with self._lock:
            self.model.kv.seq_rm(0, -1, -1)
            self._cached = []

    def decode_tokens(self, ids: Sequence[int], pos: int) -> np.ndarray:
        """Evaluates `ids` at positions pos.. of the cached sequence (which must hold exactly
        `pos` tokens) and returns the last token's logits. For benchmarks and tools that drive
        evaluation themselves."""
        with self._lock:
            if pos != len(self._cached):
                raise ValueError(f"the cache holds {len(self._cached)} tokens, not {pos}")
            ids = [int(t) for t in ids]
            out = self.model.decode(Batch(ids, pos=pos, seq_ids=0))[-1]
            self._cached.extend(ids)
            return out

    def kv_usage(self) -> tuple[int, int]:
        return self.model.kv.used_cells, self.model.n_ctx

    def cancel(self) -> None:
        """Stops the running generation at its next step (safe from any thread)."""
        self._cancel.set()

    def fit_prompt(self, ids: list[int]) -> list[int]:
        """The prompt tokens generate() evaluates: all of them when they fit in the context,
        else cut as llama.cpp's server truncates input (context policy "shift"; "error" raises
        ContextFullError)."""
        n_ctx = self.model.n_ctx
        if len(ids) < n_ctx:
            return ids
        if self.context_policy == "error":
            raise ContextFullError(f"the prompt is {len(ids)} tokens but the context holds "
                                   f"{n_ctx}; shorten it or load the model with a larger context")
        # llama.cpp server's truncation: keep n_keep, drop whole blocks of half the rest.
        n_keep = min(self.n_keep, n_ctx - 4)
        n_left = n_ctx - n_keep
        block = max(1, n_left // 2)
        erased = (len(ids) - n_keep - block) // block
        kept = ids[:n_keep] + ids[n_keep + erased * block:]
        return kept[-(n_ctx - 1):] if len(kept) >= n_ctx else kept

    def _shift_context(self) -> int:
        """llama.cpp's context shift on sequence 0: keep n_keep, discard half of the rest."""
        n_past = len(self._cached)
        n_keep = min(self.n_keep, n_past - 2)
        n_discard = (n_past - n_keep) // 2
        kv = self.model.kv
        kv.seq_rm(0, n_keep, n_keep + n_discard)
        kv.seq_add(0, n_keep + n_discard, n_past, -n_discard)
        del self._cached[n_keep:n_keep + n_discard]
        return n_discard

    def _eval_prompt(self, ids: list[int]) -> tuple[np.ndarray, int]:
        """Evaluates the prompt, reusing the longest cached prefix. Returns (logits of the last
        prompt token, tokens reused)."""
        reuse = 0
        for a, b in zip(self._cached, ids):
            if a != b:
                break
            reuse += 1
        reuse = min(reuse, len(ids) - 1)  # the last token is evaluated again for its logits
        self.model.kv.seq_rm(0, reuse, -1)
        self._cached = self._cached[:reuse]
        logits = None
        step = self.model.n_ubatch
        for start in range(reuse, len(ids), step):
            if self._cancel.is_set():
                return None, reuse
            chunk = ids[start:start + step]
            logits = self.model.decode(Batch(chunk, pos=start, seq_ids=0))
            self._cached.extend(chunk)
        return logits[-1], reuse

    def generate(self, prompt_or_messages, **sampling) -> Iterator[GenerationEvent]:
        """Streams a completion of a raw prompt (str) or a chat (list of messages).
        Sampling options are SamplingParams' fields (temperature, top_k, top_p, min_p,
        repeat_penalty, seed, max_tokens, stop, logit_bias, ...); max_tokens None means until
        the end-of-generation token or the context policy stops it."""
        end_text = None if isinstance(prompt_or_messages, str) else self._end_of_turn_text()
        if end_text:
            sampling = {**sampling, "stop": (*_as_tuple(sampling.get("stop")), end_text)}
        params = _sampling_params(sampling)
        ids = self.prompt_tokens(prompt_or_messages)
        if not ids:
            raise ValueError("the prompt is empty")
        with self._lock:
            self._cancel.clear()
            yield from self._generate(ids, params)

    def _end_of_turn_text(self) -> str | None:
        """A built-in template's end-of-turn text when the vocabulary has no token for it: a
        model prompted in a format it was not trained on (ChatML for a model without a template,
        as llama.cpp does) can only write that marker as text, and would never produce an
        end-of-generation token, so generation stops at the text instead."""
        end = self.template.end_of_turn
        return end if end and self.tokenizer.token_to_id(end) is None else None

    def _generate(self, ids: list[int], params: SamplingParams) -> Iterator[GenerationEvent]:
        n_ctx = self.model.n_ctx
        n_given = len(ids)
        ids = self.fit_prompt(ids)
        sampler = Sampler(params, self.model.n_vocab, n_ctx=n_ctx)
        sampler.accept_many(ids)
        t0 = time.perf_counter()
        try:
            logits, reused = self._eval_prompt(ids)
        except KVCacheFullError as e:
            self._cached = []
            self.model.kv.seq_rm(0, -1, -1)
            raise ContextFullError(str(e)) from None
        t_prompt = time.perf_counter() - t0
        used = self.model.kv.used_cells
        if logits is None:
            yield GenerationEvent("done", n_prompt=len(ids), n_reused=reused,
                                  kv_used=used, kv_total=n_ctx, finish_reason="cancelled")
            return
        prompt_tps = (len(ids) - reused) / t_prompt if t_prompt > 0 else 0.0
        yield GenerationEvent("prompt", n_prompt=len(ids), n_reused=reused,
                              prompt_tps=prompt_tps, kv_used=used, kv_total=n_ctx,
                              n_prompt_dropped=n_given - len(ids))

        decoder = self.tokenizer.stream_decoder(unparse_special=False)
        stops = StopStringMatcher(params.stop)
        n_gen, t_gen0, ttft, finish = 0, time.perf_counter(), 0.0, None
        while True:
            if self._cancel.is_set():
                finish = "cancelled"
                break
            token = sampler.sample(logits)
            sampler.accept(token)
            n_gen += 1
            if n_gen == 1:
                ttft = time.perf_counter() - t0
            if self.tokenizer.is_eog(token):
                finish = "eog"
                break
            text, stopped = stops.feed(decoder.feed(token))
            elapsed = time.perf_counter() - t_gen0
            yield GenerationEvent("token", text=text, token_id=token, n_prompt=len(ids),
                                  n_reused=reused, n_generated=n_gen, prompt_tps=prompt_tps,
                                  gen_tps=n_gen / elapsed if elapsed > 0 else 0.0,
                                  time_to_first_token=ttft,
                                  kv_used=self.model.kv.used_cells, kv_total=n_ctx)
            if stopped:
                finish = "stop"
                break
            if params.max_tokens is not None and n_gen >= params.max_tokens:
                finish = "length"
                break
            if len(self._cached) >= n_ctx:
                if self.context_policy == "error":
                    finish = "context_full"
                    break
                self._shift_context()
            logits = self.model.decode(Batch([token], pos=len(self._cached), seq_ids=0))[-1]
            self._cached.append(token)
        rest = "" if finish == "stop" else stops.feed(decoder.flush())[0] + stops.flush()
        elapsed = time.perf_counter() - t_gen0
        yield GenerationEvent("done", text=rest, n_prompt=len(ids), n_reused=reused,
                              n_generated=n_gen, prompt_tps=prompt_tps,
                              gen_tps=n_gen / elapsed if elapsed > 0 else 0.0,
                              time_to_first_token=ttft, kv_used=self.model.kv.used_cells,
                              kv_total=n_ctx, finish_reason=finish)
