"""The engine's public API: load a GGUF model, tokenize, template, generate, embed.

    engine = Engine.load("model.gguf", LoadConfig(n_ctx=4096))
    for event in engine.generate([{"role": "user", "content": "Hi"}], temperature=0.7):
        print(event.text, end="")

    vectors = engine.embed(["first text", "second"])    # (2, n_embd), L2-normalized

The UI and the server use only this module (the server also `engine.scheduler`). `generate` is a
generator meant to run in a worker thread; `cancel()` from any other thread stops it at the next
token. Generation runs through the engine's `Scheduler` (inference/scheduler.py): `generate` is a
one-request client of it, the server a many-request one; there is one generation loop. `embed`
is safe from any thread too: it runs between the scheduler's steps.
"""
from __future__ import annotations

import os
import queue
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields

import numpy as np

from .catalog import mix_name
from .chat.template import ChatTemplate
from .chat.constraint import Constraint, ConstraintError, ConstraintSpec
from .config import LoadConfig, OffloadOptions, config_or_defaults, default_threads
from .embedding import EUCLIDEAN, POOLINGS, normalize
from .gguf import GGUFFile
from .model import Batch, EmbeddingOnlyError, Model
from .sampling import SamplingParams
from .scheduler import ContextFullError, GenerationEvent, QueueFullError, Scheduler
from .tokenizers.tokenizer import Tokenizer

__all__ = ["ConstraintError", "ConstraintSpec", "ContextFullError", "EmbeddingOnlyError",
           "Engine", "EngineBusyError", "EngineClosedError", "GenerationEvent", "LoadConfig",
           "ModelInfo", "OffloadOptions", "POOLINGS", "default_threads"]

Progress = Callable[[str, int, int], None]


class EngineBusyError(RuntimeError):
    """Every slot of the engine is generating: finish or close the other generation first."""


class EngineClosedError(RuntimeError):
    """The engine was closed."""


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
    has_chat_template: bool  # the file has its own (else one is chosen as llama.cpp does)
    encoder: bool = False  # an embedding model (BERT): embed() only, no text generation
    pooling: str = "none"  # the model's own pooling_type, embed()'s default
    n_gpu_layers: int = 0  # layers on a GPU, the output layer counted (llama.cpp's count)
    vram_bytes: int = 0  # device memory of the offloaded weights and KV rows
    gpu_note: str = ""  # why the GPU is not used (one line), or ""
    offload: str = ""  # llama.cpp's summary, "offloaded N/M layers to GPU (...)", or ""


def _as_tuple(stop) -> tuple:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


def constraint_spec(constraint: ConstraintSpec | None = None, grammar: str | None = None,
                    json_schema=None) -> ConstraintSpec | None:
    """One ConstraintSpec from generate()'s three ways of giving one (at most one of them):
    a spec, llama.cpp's `grammar` (GBNF) or `json_schema` (a mapping or its JSON text)."""
    given = [name for name, v in (("constraint", constraint), ("grammar", grammar),
                                  ("json_schema", json_schema)) if v is not None]
    if len(given) > 1:
        raise ConstraintError(f"give one of constraint, grammar and json_schema, not "
                              f"{' and '.join(given)}")
    if grammar is not None:
        return ConstraintSpec("gbnf", grammar)
    if json_schema is not None:
        return ConstraintSpec("json_schema", json_schema)
    if constraint is not None and not isinstance(constraint, ConstraintSpec):
        raise ConstraintError(f"constraint must be a ConstraintSpec, got "
                              f"{type(constraint).__name__}")
    return constraint


def _sampling_params(sampling: Mapping) -> SamplingParams:
    known = {f.name for f in fields(SamplingParams)}
    unknown = set(sampling) - known
    if unknown:
        raise ValueError(f"unknown sampling option(s): {', '.join(sorted(unknown))}; "
                         f"known: {', '.join(sorted(known))}")
    return SamplingParams(**sampling)


class Engine:
    def __init__(self, gguf: GGUFFile, model: Model, tokenizer: Tokenizer,
                 template: ChatTemplate, config: LoadConfig | None = None):
        """An engine over a loaded model; Engine.load makes one from a file. Of `config` it
        uses the threads, the context policy, n_keep and the slots (n_parallel)."""
        config = config_or_defaults(config)
        self.config = config
        self.gguf = gguf
        self.model = model
        self.tokenizer = tokenizer
        self.template = template
        self.threads = config.n_threads
        self.context_policy = config.context_policy
        self.n_keep = config.n_keep
        self.scheduler = Scheduler(model, tokenizer, n_slots=config.n_parallel,
                                   context_policy=config.context_policy, n_keep=config.n_keep)
        self._requests: set = set()  # generate()'s requests in flight, for cancel()
        self.chat_template_choice: str | None = None  # set_chat_template's (None: the model's)
        self._closed = False
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
            has_chat_template=template.origin == "model",
            encoder=model.hparams.encoder,
            pooling=model.hparams.pooling,
            n_gpu_layers=model.n_gpu_layers,
            vram_bytes=model.vram_bytes,
            gpu_note=model.offload_note,
            offload=model.placement.plan.describe() if model.placement.plan else "",
        )

    @classmethod
    def load(cls, path, config: LoadConfig | None = None,
             progress: Progress | None = None) -> "Engine":
        """Opens a GGUF model as `config` says (LoadConfig: context size, threads, KV cache
        types, mmap/mlock, context policy, slots, chat template, GPU offload; None: the
        defaults, on the CPU), reporting `progress(stage, done, total)` as it goes. A chat
        template compiles when a chat first needs it: a broken one does not stop the model from
        loading or running raw prompts. Without a usable GPU the model runs on the CPU and
        info.gpu_note says why."""
        config = config_or_defaults(config)
        report = progress or (lambda stage, done, total: None)
        threads = config.n_threads
        import numba
        from threadpoolctl import threadpool_limits
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        # numba threads our kernels; BLAS (attention over long batches) runs between them, and a
        # second pool of spinning BLAS threads on the same cores slows both.
        threadpool_limits(limits=1, user_api="blas")
        report("Opening model", 0, 3)
        gguf = GGUFFile.open(path, use_mmap=config.use_mmap, mlock=config.mlock)
        try:
            report("Loading tokenizer", 1, 3)
            tokenizer = Tokenizer.from_metadata(gguf.metadata)
            template = ChatTemplate.from_metadata(gguf.metadata, config.chat_template,
                                                  tokenizer=tokenizer)
            report("Loading weights", 2, 3)
            model = Model.load(gguf, config)
            engine = cls(gguf, model, tokenizer, template, config)
            engine.chat_template_choice = config.chat_template
            if config.warmup:
                # Like llama.cpp's warm-up decode; on a first run this compiles the kernels.
                report("Warming up (compiles kernels on first run)", 2, 3)
                tokens = [tokenizer.bos_id if tokenizer.bos_id is not None else 0] * 2
                if model.hparams.encoder:
                    engine.embed([tokens], pooling="mean")
                else:
                    engine.logits(tokens)
            report("Ready", 3, 3)
            return engine
        except BaseException:
            gguf.close()
            raise

    def close(self) -> None:
        """Stops every generation and releases the model; the engine cannot be used after."""
        if self._closed:
            return
        self.cancel()
        with self.scheduler.claim_sequence(0, force=True):
            self._closed = True
            self.model.close()
            self.gguf.close()

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("the engine is closed; load the model again")

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
                            add_generation_prompt: bool = True, **template_vars) -> str:
        """The prompt text for a chat; raises ChatTemplateError (a ValueError) when the template
        fails, within a couple of seconds whatever the template does. `template_vars`: more
        Jinja variables (`tools`, `enable_thinking`), as llama.cpp's chat params pass them."""
        return self.template.render(messages, add_generation_prompt=add_generation_prompt,
                                    **template_vars)

    def set_chat_template(self, name_or_source: str | None) -> None:
        """Speaks to the model in another template from the next chat on: a built-in name
        (CHAT_TEMPLATE_NAMES) or Jinja source; None: back to the model's own (or the one chosen
        from its vocabulary). Compiles on first use, like Engine.load's chat_template."""
        if name_or_source == self.chat_template_choice:
            return
        self.chat_template_choice = name_or_source
        self.template = ChatTemplate.from_metadata(self.gguf.metadata, name_or_source,
                                                   tokenizer=self.tokenizer)

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
        """float32 (n_tokens, n_vocab): the logits at every position of a fresh sequence (slot
        0's; a later generate() reuses it as a cached prefix)."""
        self._check_open()
        ids = [int(t) for t in token_ids]
        if not ids:
            raise ValueError("no tokens to evaluate")
        if len(ids) > self.scheduler.n_ctx_slot:
            raise ContextFullError(f"{len(ids)} tokens do not fit in the context of "
                                   f"{self.scheduler.n_ctx_slot}", len(ids),
                                   self.scheduler.n_ctx_slot)
        with self.scheduler.claim_sequence(0) as slot:
            slot.tokens = []
            out = self.model.logits_for(ids, seq_id=0)
            slot.tokens = ids
            return out

    def embed(self, inputs, pooling: str | None = None, normalize_as: int = EUCLIDEAN
              ) -> np.ndarray:
        """Embeddings, float32 (len(inputs), n_embd): one row per input, a text (tokenized as
        llama-server does: special tokens added and parsed — BERT's [CLS] ... [SEP]) or a list
        of token ids; a single str is one input. llama.cpp's `--embeddings`: each input is
        evaluated on its own, its last hidden states (after the final norm) pooled by `pooling`
        ("mean", "cls", "last"; None: the model's own `pooling_type`) and each row normalized
        as llama-server's `embd_normalize` (2: unit Euclidean length; -1: raw; embedding.py).

        Works for encoders (BERT) and decoders alike, never touches the KV cache, and is safe
        from any thread: it runs between the scheduler's steps (on a server's engine thread
        when one runs: Scheduler.run_between_steps), so generations only pause.
        ValueError for an empty input, an unknown pooling, or a model that sets none when none
        is given; ContextFullError for an input longer than the model embeds at once."""
        self._check_open()
        pooling = self._embedding_pooling(pooling)
        items = [inputs] if isinstance(inputs, str) else list(inputs)
        if not items:
            raise ValueError("no inputs to embed")
        seqs = [self._embedding_tokens(i, item) for i, item in enumerate(items)]
        limit = self.model.max_embed_tokens
        for i, ids in enumerate(seqs):
            if len(ids) > limit:
                raise ContextFullError(f"input {i} is {len(ids)} tokens; this model embeds at "
                                       f"most {limit} at once", len(ids), limit)
        def forward() -> np.ndarray:  # no slot is claimed: embeddings do not use the cache
            self._check_open()
            return self.model.embed(seqs, pooling)
        return normalize(self.scheduler.run_between_steps(forward), normalize_as)

    def _embedding_pooling(self, pooling: str | None) -> str:
        if pooling is None:
            pooling = self.model.hparams.pooling
            if pooling not in POOLINGS:
                raise ValueError(f"the model's pooling_type is {pooling!r}, which makes no "
                                 f"embedding per input; choose one of {', '.join(POOLINGS)}")
        elif pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, not {pooling!r}")
        return pooling

    def _embedding_tokens(self, i: int, item) -> list[int]:
        if isinstance(item, str):
            ids = self.tokenize(item, add_special=True, parse_special=True)
        elif isinstance(item, (bytes, bytearray)) or not hasattr(item, "__iter__"):
            raise ValueError(f"input {i} is a {type(item).__name__}: expected a text or a list "
                             f"of token ids")
        else:
            ids = list(item)
            if not all(isinstance(t, (int, np.integer)) and not isinstance(t, bool)
                       for t in ids):
                raise ValueError(f"input {i} is neither a text nor a list of token ids")
            ids = [int(t) for t in ids]
            n_vocab = self.model.n_vocab
            if any(not 0 <= t < n_vocab for t in ids):
                raise ValueError(f"input {i} has a token id outside the vocabulary "
                                 f"[0, {n_vocab})")
        if not ids:
            raise ValueError(f"input {i} is empty")
        return ids

    @property
    def batch_size(self) -> int:
        """Tokens evaluated per forward pass (llama.cpp's n_ubatch)."""
        return self.model.n_ubatch

    def reset(self) -> None:
        """Empties the KV cache (of slot 0's sequence; every slot's when none generates)."""
        with self.scheduler.claim_sequence(0) as slot:
            self.model.kv.seq_rm(0, -1, -1)
            slot.tokens = []

    def decode_tokens(self, ids: Sequence[int], pos: int) -> np.ndarray:
        """Evaluates `ids` at positions pos.. of slot 0's cached sequence (which must hold
        exactly `pos` tokens) and returns the last token's logits. For benchmarks and tools that
        drive evaluation themselves."""
        self._check_open()
        with self.scheduler.claim_sequence(0) as slot:
            if pos != len(slot.tokens):
                raise ValueError(f"the cache holds {len(slot.tokens)} tokens, not {pos}")
            ids = [int(t) for t in ids]
            out = self.model.decode(Batch(ids, pos=pos, seq_ids=0))[-1]
            slot.tokens.extend(ids)
            return out

    def kv_usage(self) -> tuple[int, int]:
        return self.model.kv.used_cells, self.model.n_ctx

    def cancel(self) -> None:
        """Stops generate()'s generations at their next step (safe from any thread)."""
        for req in list(self._requests):
            self.scheduler.cancel(req)

    def fit_prompt(self, ids: list[int]) -> list[int]:
        """The prompt tokens generate() evaluates: all of them when they fit in the context,
        else cut as llama.cpp's server truncates input, keeping BOS and n_keep (context policy
        "shift"; "error" raises ContextFullError)."""
        n_ctx = self.scheduler.n_ctx_slot
        if len(ids) >= n_ctx and self.context_policy == "error":
            raise ContextFullError(f"the prompt is {len(ids)} tokens but the context holds "
                                   f"{n_ctx}; shorten it or load the model with a larger "
                                   f"context", len(ids), n_ctx)
        return self.scheduler.fit_prompt(ids)

    def generate(self, prompt_or_messages, *, constraint: ConstraintSpec | None = None,
                 grammar: str | None = None, json_schema=None,
                 **sampling) -> Iterator[GenerationEvent]:
        """Streams a completion of a raw prompt (str) or a chat (list of messages).
        Sampling options are SamplingParams' fields (temperature, top_k, top_p, min_p,
        repeat_penalty, seed, max_tokens, stop, logit_bias, ...); max_tokens None means until
        the end-of-generation token or the context policy stops it.

        Structured output (at most one): `grammar` (GBNF, llama.cpp's --grammar), `json_schema`
        (a mapping or JSON text, llama.cpp's --json-schema) or `constraint` (a ConstraintSpec:
        also regex, Lark, any JSON object). A schema or grammar that cannot be used raises
        ConstraintError before anything is generated.

        Raises EngineBusyError when every slot is generating (unless a server loop runs the
        scheduler: then the request waits its turn). Closing or dropping the generator ends
        its generation and frees the slot."""
        self._check_open()
        if self.model.hparams.encoder:
            raise EmbeddingOnlyError(self.model.hparams.arch)
        end_text = None if isinstance(prompt_or_messages, str) else self.end_of_turn_text()
        if end_text:
            sampling = {**sampling, "stop": (*_as_tuple(sampling.get("stop")), end_text)}
        params = _sampling_params(sampling)
        spec = constraint_spec(constraint, grammar, json_schema)
        ids = self.prompt_tokens(prompt_or_messages)
        if not ids:
            raise ValueError("the prompt is empty")
        self.fit_prompt(ids)  # an oversized prompt under context policy "error" fails here
        # built here, not when the stream starts, so that a refused schema fails the call
        rules = None if spec is None else Constraint.build(self.tokenizer, self.model.n_vocab,
                                                           spec)
        return self._stream(ids, params, rules)

    def _stream(self, ids: list[int], params: SamplingParams,
                rules: Constraint | None) -> Iterator[GenerationEvent]:
        events: queue.SimpleQueue = queue.SimpleQueue()
        sched = self.scheduler
        try:
            req = sched.add_request(ids, params, events.put, wait=sched.serving,
                                    constraint=rules)
        except QueueFullError:
            raise EngineBusyError("the engine is busy with another generation; finish or close "
                                  "it first (engine.cancel() stops it)") from None
        self._requests.add(req)
        try:
            while True:
                try:
                    event = events.get_nowait()
                except queue.Empty:
                    if not sched.step_if_free():
                        try:
                            event = events.get(timeout=0.05)
                        except queue.Empty:
                            continue
                    else:
                        continue
                if event.finish_reason == "error":
                    raise req.exception or RuntimeError(event.error)
                yield event
                if event.kind == "done":
                    return
        finally:
            self._requests.discard(req)
            if not req.done.is_set():  # closed or dropped mid-generation: free the slot
                sched.cancel(req)
                sched.reap()

    def end_of_turn_text(self) -> str | None:
        """A built-in template's end-of-turn text when the vocabulary has no token for it: a
        model prompted in a format it was not trained on (ChatML for a model without a template,
        as llama.cpp does) can only write that marker as text, and would never produce an
        end-of-generation token, so generation stops at the text instead."""
        end = self.template.end_of_turn
        return end if end and self.tokenizer.token_to_id(end) is None else None
