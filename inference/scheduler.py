"""Continuous batching over parallel slots: llama-server's slot loop (tools/server/server.cpp,
`update_slots`) with vLLM's interface (`add_request`, `schedule`, `update_from_output`).

    sched = Scheduler(model, tokenizer, n_slots=4)
    req = sched.add_request(prompt_ids, SamplingParams(...), emit=queue.put)
    while sched.has_work():
        sched.step()            # schedule → model.decode (one ragged batch) → update_from_output

Each slot owns one sequence of the unified KV cache (sequence id = slot id) and at most
`n_ctx_slot` = n_ctx / n_slots of its cells, so slots never starve each other. A step builds ONE
`Batch`: the next token of every generating slot, then chunks of waiting prompts up to `n_batch`
tokens; the model decodes it once, and every slot that asked for logits samples with its own
sampler (seed, penalties, stop strings, UTF-8 hold-back) and emits a `GenerationEvent` to its
request's `emit` callback (from the thread that steps; the callback must be quick and thread-safe).

- A new request goes to the idle slot whose cached tokens share the longest prefix with its prompt
  (when at least `SLOT_SIMILARITY` of the prompt matches; else the least recently used idle slot),
  and reuses that prefix (`n_reused`, llama-server's `cached_tokens`).
- A slot whose sequence reaches its context shifts it (llama.cpp's context shift: keep BOS and
  `n_keep` tokens, discard half of the rest) or, with context_policy "error", finishes with
  "context_full".
- `cancel(request)` from any thread: a queued request ends at once, a prefilling or generating one
  at the next step; either way its slot is free again.
- A request with a `constraint` (inference/chat/constraint.py: a JSON schema, regex, Lark or GBNF
  grammar) samples only what the grammar allows; tokens the grammar forces are appended to the
  slot's next batch together with the sampled one (decoded at once, not one step each), and the
  request ends ("eog") as soon as the grammar is complete.
- A step whose every output row samples greedily from the raw logits (no grammar, logit bias,
  penalties or logprobs: Sampler.argmax_only) on a model that samples on its GPU
  (Model.samples_greedy) gets the token ids from the device, not the logits
  (Model.decode_tokens); any other step brings every output row's logits to the host samplers.
- Precision: matrices the packed 8-bit kernels take (matmul_packed: Q4_0, Q4_1, Q5_0, Q8_0,
  Q4_K, Q6_K) use them in every step, and they compute each token on its own; attention visits a token's cells by
  position, and a row whose logits are sampled always takes its per-token kernel: a request's
  tokens are then the same whatever shares its steps and whether its prompt was cached (the
  prompt rows of a large step go through attention's GEMM, whose sums can differ with the
  step's make-up in rare roundings). Other formats: with one slot, one-token
  steps use the row-at-a-time 8-bit kernels (matmul.int8_decode) and a prompt's last token gets
  such a step of its own, so the logits it samples from do not depend on how much of the prompt
  was cached (a seed gives the same text; the price is one decode step more per prompt); with
  several slots, whose steps mix requests, their products stay float32, so a request's text
  depends on what else runs by float32 rounding only.

Who steps: a server runs `serve_forever` in one engine thread; `Engine.generate` drives steps
from its caller's thread when no such loop runs (`step_if_free`). Decoding runs in numba's nogil
kernels, so other Python threads (an event loop) keep running meanwhile.
"""
from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .chat.constraint import Constraint, ConstraintError, ConstraintSpec
from .config import CONTEXT_POLICIES
from .cpu.matmul import int8_decode
from .model import Batch
from .sampling import Sampler, SamplingParams, StopStringMatcher, all_finite

__all__ = ["ConstraintError", "ConstraintSpec", "ContextFullError", "GenerationEvent",
           "NonFiniteLogitsError", "QueueFullError", "Request", "Scheduler", "SlotState"]

SLOT_SIMILARITY = 0.1  # llama-server's --slot-prompt-similarity


class ContextFullError(ValueError):
    """The prompt (or the conversation) does not fit in the context window."""

    def __init__(self, message: str, n_prompt: int = 0, n_ctx: int = 0):
        super().__init__(message)
        self.n_prompt, self.n_ctx = n_prompt, n_ctx


class QueueFullError(RuntimeError):
    """Every slot is busy and the queue of waiting requests is full."""


class NonFiniteLogitsError(ValueError):
    """The model produced NaN or infinite logits: its weights or metadata are broken."""


@dataclass
class GenerationEvent:
    """One step of a generation.

    kind: "prompt" (the prompt was processed: n_prompt, n_reused, prompt_tps are set),
          "token" (text is the new piece, may be "" while a multi-byte character or a possible
          stop string is held back), or "done" (finish_reason is set; text is any held-back rest;
          `error` holds the message when finish_reason is "error").
    """
    kind: str
    text: str = ""
    token_id: int | None = None
    n_prompt: int = 0
    n_reused: int = 0  # prompt tokens found already in the KV cache
    n_prompt_dropped: int = 0  # prompt tokens cut to fit the context
    n_generated: int = 0
    prompt_tps: float = 0.0
    gen_tps: float = 0.0
    time_to_first_token: float = 0.0
    kv_used: int = 0
    kv_total: int = 0
    # "stop", "eog" (also: a constraint's grammar is complete), "length", "cancelled",
    # "context_full", "error"
    finish_reason: str | None = None
    logprob: float | None = None  # of token_id, when the request asked for n_probs
    top_logprobs: list = field(default_factory=list)  # [(token id, logprob)], most likely first
    error: str | None = None
    slot: int = -1
    constrained: bool = False  # the request has a grammar or JSON schema
    mask_ms: float = 0.0  # constraint work per generated token so far, milliseconds
    n_forced: int = 0  # generated tokens the grammar forced (no sampling)


class SlotState:
    IDLE = "idle"
    PROMPT = "processing prompt"
    GENERATING = "generating"


_ids = itertools.count(1)


class Request:
    """One completion in the scheduler. Made by `Scheduler.add_request`; `cancel()` from any
    thread; `done` once its last event was emitted."""

    def __init__(self, prompt: Sequence[int], params: SamplingParams, emit: Callable,
                 n_probs: int = 0, cache_prompt: bool = True, n_dropped: int = 0,
                 constraint: Constraint | None = None, reasoning_budget=None,
                 preserved_tokens: frozenset[int] = frozenset()):
        self.id = next(_ids)
        self.prompt = list(prompt)
        self.params = params
        self.emit = emit
        self.n_probs = int(n_probs)
        self.cache_prompt = bool(cache_prompt)
        self.n_dropped = n_dropped
        self.constraint = constraint
        self.reasoning_budget = reasoning_budget  # chat.reasoning.ReasoningBudget or None
        self.preserved_tokens = frozenset(preserved_tokens)  # shown although special
        self.cancelled = threading.Event()
        self.done = threading.Event()
        self.exception: BaseException | None = None  # what ended it, when finish_reason is "error"
        self.slot: int | None = None
        self.t_queued = time.perf_counter()

    def cancel(self) -> None:
        self.cancelled.set()


class Slot:
    """llama-server's server_slot: a sequence of the cache, the tokens in it, and the request it
    serves (None when idle)."""

    def __init__(self, slot_id: int, n_ctx: int):
        self.id = slot_id
        self.n_ctx = n_ctx
        self.tokens: list[int] = []  # what the cache holds for this slot's sequence
        self.request: Request | None = None
        self.state = SlotState.IDLE
        self.t_last_used = 0.0
        self._reset_request_state()

    def _reset_request_state(self) -> None:
        self.sampler = self.decoder = self.stops = None
        self.prompt_pos = 0  # next prompt token to feed
        self.n_reused = 0
        self.n_generated = 0
        self.pending: list[int] = []  # sampled (and forced) tokens, not yet in the cache
        self.t_start = self.t_prompt_done = self.ttft = 0.0
        self.prompt_tps = 0.0

    def info(self) -> dict:
        """What /slots shows (no prompt text)."""
        r = self.request
        elapsed = time.perf_counter() - self.t_prompt_done if self.t_prompt_done else 0.0
        return {"id": self.id, "state": self.state, "n_ctx": self.n_ctx,
                "n_cached": len(self.tokens), "request_id": r.id if r else None,
                "n_prompt": len(r.prompt) if r else 0, "n_reused": self.n_reused,
                "n_generated": self.n_generated, "prompt_tps": self.prompt_tps,
                "gen_tps": self.n_generated / elapsed if r and elapsed > 0 else 0.0}


class Scheduler:
    """Slots over one model; see the module docstring."""

    def __init__(self, model, tokenizer, n_slots: int = 1, n_batch: int | None = None,
                 context_policy: str = "shift", n_keep: int = 0, max_queue: int | None = None):
        if context_policy not in CONTEXT_POLICIES:
            raise ValueError(f"context_policy must be one of {CONTEXT_POLICIES}, "
                             f"not {context_policy!r}")
        if not 1 <= n_slots <= model.kv.n_seq_max:
            raise ValueError(f"{n_slots} slots for a cache of {model.kv.n_seq_max} sequences")
        self.model = model
        self.tokenizer = tokenizer
        n_ctx_slot = model.n_ctx // n_slots
        if n_ctx_slot < 2:
            raise ValueError(f"a context of {model.n_ctx} tokens leaves {n_ctx_slot} per slot "
                             f"for {n_slots} slots; each needs at least 2")
        self.slots = [Slot(i, n_ctx_slot) for i in range(n_slots)]
        self.n_batch = int(n_batch or max(model.n_ubatch, 512))
        self.context_policy = context_policy
        self.n_keep = int(n_keep)
        self.max_queue = max_queue
        self.queue: deque[Request] = deque()
        self._lock = threading.RLock()  # slots and queue
        self._step_lock = threading.Lock()  # one decode at a time
        self._work = threading.Condition(self._lock)
        self._jobs: list[_Job] = []  # run_between_steps' calls waiting for the serve loop
        self._kv_used: int | None = None  # KV cells in use, counted once per step's events
        self.serving = False
        # llama-server's /metrics counters (server_metrics): prompt tokens evaluated and found
        # cached, decode calls and the slots in each, the longest sequence seen
        self.stats = {"n_prompt_tokens": 0, "n_prompt_tokens_cached": 0, "t_prompt": 0.0,
                      "n_generated_tokens": 0, "t_generation": 0.0, "n_decode": 0,
                      "n_busy_slots": 0, "n_tokens_max": 0, "n_requests": 0}

    # ------------------------------------------------------------------ requests

    @property
    def n_ctx_slot(self) -> int:
        return self.slots[0].n_ctx

    def fit_prompt(self, ids: list[int]) -> list[int]:
        """The prompt cut llama.cpp-style to fit a slot: keep BOS and n_keep tokens, drop whole
        blocks of half the rest, and at most n_ctx_slot - 1 tokens remain (one cell for the
        first generated token)."""
        n_ctx = self.n_ctx_slot
        if len(ids) < n_ctx:
            return ids
        n_keep = min(self._n_keep(len(ids)), n_ctx - 4)
        block = max(1, (n_ctx - n_keep) // 2)
        erased = (len(ids) - n_keep - block) // block
        kept = ids[:n_keep] + ids[n_keep + erased * block:]
        return kept[:n_keep] + kept[n_keep:][-(n_ctx - 1 - n_keep):] if len(kept) >= n_ctx \
            else kept

    def _n_keep(self, n_past: int) -> int:
        """Tokens a shift keeps: n_keep (-1: all of the prompt... here all but what must go) plus
        BOS when the model adds one, as llama-server (`n_keep + add_bos_token`)."""
        n_keep = n_past if self.n_keep < 0 else self.n_keep
        return n_keep + (1 if self.tokenizer.add_bos and self.n_keep >= 0 else 0)

    def add_request(self, prompt: Sequence[int], params: SamplingParams, emit: Callable,
                    *, n_probs: int = 0, cache_prompt: bool = True, truncate: bool = True,
                    wait: bool = True, constraint: ConstraintSpec | Constraint | None = None,
                    reasoning_budget=None, preserved_tokens: Sequence[int] = ()
                    ) -> Request:
        """Queues a completion of `prompt` (token ids). A prompt that does not fit a slot is cut
        (truncate) or refused with ContextFullError; with `wait` False a request that finds every
        slot busy is refused with QueueFullError; past `max_queue` waiting requests too.
        `constraint`: what the output must match (a spec, or a Constraint already built from one
        for this request); a schema or grammar that cannot be used is refused here with
        ConstraintError (a ValueError naming what is unsupported). `reasoning_budget`: a
        chat.reasoning.ReasoningBudget that forces the end of thinking (llama.cpp's
        --reasoning-budget); `preserved_tokens`: ids whose text the output shows although they
        are special (a chat format's markers)."""
        ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError("the prompt is empty")
        n_vocab = self.model.n_vocab
        if min(ids) < 0 or max(ids) >= n_vocab:
            raise ValueError(f"a prompt token id is outside the vocabulary [0, {n_vocab})")
        n_given = len(ids)
        if n_given >= self.n_ctx_slot:
            if not truncate or self.context_policy == "error":
                raise ContextFullError(
                    f"the prompt is {n_given} tokens but the context holds {self.n_ctx_slot}; "
                    f"shorten it or use a larger context", n_given, self.n_ctx_slot)
            ids = self.fit_prompt(ids)
        Sampler(params, n_vocab)  # checks logit_bias against the vocabulary now, not mid-step
        grammar = Constraint.build(self.tokenizer, n_vocab, constraint) \
            if isinstance(constraint, ConstraintSpec) else constraint
        if grammar is not None and (not isinstance(grammar, Constraint) or grammar.n_tokens):
            raise ConstraintError("constraint must be a ConstraintSpec or an unused Constraint")
        req = Request(ids, params, emit, n_probs, cache_prompt, n_given - len(ids), grammar,
                      reasoning_budget, frozenset(int(t) for t in preserved_tokens))
        with self._lock:
            busy = all(s.request is not None for s in self.slots)
            if busy and not wait:
                raise QueueFullError("every slot is busy")
            if self.max_queue is not None and busy and len(self.queue) >= self.max_queue:
                raise QueueFullError(f"every slot is busy and {len(self.queue)} requests wait "
                                     f"(--max-queue {self.max_queue})")
            self.queue.append(req)
            self.stats["n_requests"] += 1
            self._work.notify_all()
        return req

    def cancel(self, request: Request) -> None:
        request.cancel()
        with self._lock:
            self._work.notify_all()

    def has_work(self) -> bool:
        with self._lock:
            return bool(self.queue) or any(s.request is not None for s in self.slots)

    def slots_info(self) -> list[dict]:
        with self._lock:
            return [s.info() for s in self.slots]

    def n_queued(self) -> int:
        with self._lock:
            return len(self.queue)

    # ------------------------------------------------------------------ stepping

    def step_if_free(self) -> bool:
        """One step, unless another thread is stepping (or a serve loop runs): then False."""
        if self.serving or not self._step_lock.acquire(blocking=False):
            return False
        try:
            self.step()
        finally:
            self._step_lock.release()
        return True

    def serve_forever(self, stop: threading.Event, idle_wait: float = 0.5,
                      after_step: Callable[[], object] | None = None) -> None:
        """The engine thread of a server: steps while there is work (and runs the calls
        `run_between_steps` hands it), sleeps when there is none, until `stop` is set.
        after_step() runs on this thread after every step (a server hands a step's events on
        in one go there)."""
        with self._lock:
            self.serving = True
        try:
            while not stop.is_set():
                with self._lock:
                    if not self._has_work_locked():
                        self._work.wait(idle_wait)
                        continue
                with self._step_lock:
                    self._run_jobs()
                    self.step()
                if after_step is not None:
                    after_step()
        finally:
            with self._lock:
                self.serving = False
            with self._step_lock:
                self._run_jobs()  # any handed over as the loop stopped

    def run_between_steps(self, fn: Callable[[], object]):
        """fn() between two steps, on the thread that steps: the serve loop's own when one
        runs (the caller waits for the result, or fn's exception), else the caller's, holding
        the step lock. Forward passes outside generation (Engine.embed) go through here so that
        one thread launches every kernel: numba's OpenMP layer gives each launching thread its
        own team of workers, and once libgomp manages more threads than there are cores it
        lets them sleep after every kernel instead of spinning, so a second launching thread
        that stays alive (a server's thread pool after one embeddings request) made every
        later decode step several times slower (docs/serving.md)."""
        with self._lock:
            job = _Job(fn) if self.serving else None
            if job is not None:
                self._jobs.append(job)
                self._work.notify_all()
        if job is None:
            with self._step_lock:
                return fn()
        return job.wait()

    def _run_jobs(self) -> None:
        with self._lock:
            jobs, self._jobs = self._jobs, []
        for job in jobs:
            job.run()

    def wake(self) -> None:
        with self._lock:
            self._work.notify_all()

    def _has_work_locked(self) -> bool:
        return bool(self.queue or self._jobs) or any(s.request is not None for s in self.slots)

    def step(self) -> None:
        """schedule → decode → update_from_output, once."""
        with self._lock:
            self._drop_cancelled()
            self._admit()
            batch, outputs = self.schedule()
            greedy = batch is not None and self._greedy_on_device(outputs)
        if batch is None:
            return
        t0 = time.perf_counter()
        try:
            with int8_decode(len(self.slots) == 1):
                # (greedy: the token ids, sampled where the logits are)
                result = self.model.decode_tokens(batch) if greedy else self.model.decode(batch)
        except Exception as e:  # noqa: BLE001 - every request in the batch ends with the error
            with self._lock:
                for slot in self._slots_in(batch):
                    self._rollback(slot, batch)
                    self._fail(slot, e)
            return
        with self._lock:
            busy = self._slots_in(batch)
            self.stats["n_decode"] += 1
            self.stats["n_busy_slots"] += len(busy)
            self.stats["n_tokens_max"] = max([self.stats["n_tokens_max"],
                                              *(len(s.tokens) for s in busy)])
            self.update_from_output(outputs, None if greedy else result,
                                    time.perf_counter() - t0, tokens=result if greedy else None)

    def _greedy_on_device(self, outputs: list[tuple[Slot, int]]) -> bool:
        """Every output's slot takes the argmax of its raw logits and wants nothing else of them
        (no grammar, no logprobs), and the model can sample where its logits are
        (Model.samples_greedy): the step then brings back token ids, not logits."""
        return bool(outputs) and self.model.samples_greedy and all(
            s.request.constraint is None and not s.request.n_probs and s.sampler.argmax_only
            for s, _ in outputs)

    def _slots_in(self, batch: Batch) -> set:
        return {self.slots[s[0]] for s in batch.seq_ids}

    def _rollback(self, slot: Slot, batch: Batch) -> None:
        """Forgets the tokens the failed batch would have put in the slot's cache."""
        n = sum(1 for s in batch.seq_ids if s[0] == slot.id)
        del slot.tokens[len(slot.tokens) - n:]

    def _drop_cancelled(self) -> None:
        for req in [r for r in self.queue if r.cancelled.is_set()]:
            self.queue.remove(req)
            req.emit(GenerationEvent("done", n_prompt=len(req.prompt), finish_reason="cancelled",
                                     kv_used=self.model.kv.used_cells, kv_total=self.model.n_ctx))
            req.done.set()
        for slot in self.slots:
            if slot.request is not None and slot.request.cancelled.is_set():
                self._finish(slot, "cancelled")

    def _admit(self) -> None:
        """Queued requests into idle slots (the best prefix match first)."""
        while self.queue:
            idle = [s for s in self.slots if s.request is None]
            if not idle:
                return
            req = self.queue.popleft()
            self._start(self._pick_slot(idle, req.prompt), req)

    @staticmethod
    def _pick_slot(idle: list[Slot], prompt: list[int]) -> Slot:
        best, best_len = None, 0
        for s in idle:
            n = _common_prefix(s.tokens, prompt)
            if n > best_len:
                best, best_len = s, n
        if best is not None and best_len >= SLOT_SIMILARITY * len(prompt):
            return best
        return min(idle, key=lambda s: s.t_last_used)

    def _start(self, slot: Slot, req: Request) -> None:
        slot._reset_request_state()
        slot.request, req.slot = req, slot.id
        reuse = _common_prefix(slot.tokens, req.prompt) if req.cache_prompt else 0
        reuse = min(reuse, len(req.prompt) - 1)  # the last prompt token is decoded for logits
        # a hybrid model's recurrent states go back only to where they were saved (the live
        # state, a checkpoint): llama-server's context checkpoints
        reuse = self.model.kv.reusable_prefix(slot.id, reuse)
        if not self.model.kv.seq_rm(slot.id, reuse, -1):  # nothing to go back to: start over
            reuse = 0
            self.model.kv.seq_rm(slot.id, -1, -1)
        del slot.tokens[reuse:]
        slot.prompt_pos = slot.n_reused = reuse
        slot.sampler = Sampler(req.params, self.model.n_vocab, n_ctx=slot.n_ctx)
        slot.sampler.accept_many(req.prompt)
        # a grammar checked the raw pieces: show those, not detokenize's cleaned-up text
        slot.decoder = self.tokenizer.stream_decoder(unparse_special=False,
                                                     verbatim=req.constraint is not None,
                                                     preserved=req.preserved_tokens)
        slot.stops = StopStringMatcher(req.params.stop)
        slot.state = SlotState.PROMPT
        slot.t_start = time.perf_counter()

    def schedule(self) -> tuple[Batch | None, list[tuple[Slot, int]]]:
        """The next batch: every generating slot's pending token, then prompt chunks up to
        n_batch tokens. Returns (batch, [(slot, output row)]) — None when there is nothing."""
        tokens, pos, seqs, want = [], [], [], []
        outputs: list[tuple[Slot, int]] = []

        def add(slot: Slot, token: int, logits: bool) -> None:
            tokens.append(token)
            pos.append(len(slot.tokens))
            seqs.append(slot.id)
            want.append(logits)
            slot.tokens.append(token)
            if logits:
                outputs.append((slot, len(outputs)))

        for slot in self.slots:
            if slot.state == SlotState.GENERATING and slot.pending:
                if len(slot.tokens) + len(slot.pending) > slot.n_ctx \
                        and not self._make_room(slot, len(slot.pending)):
                    continue
                for i, token in enumerate(slot.pending):  # forced tokens come in one batch
                    add(slot, token, i == len(slot.pending) - 1)
                slot.pending = []
        for slot in self.slots:
            if slot.state != SlotState.PROMPT:
                continue
            prompt = slot.request.prompt
            # One slot: the last prompt token gets a step of its own, the one-token step every
            # sampled token gets (int8_decode), so its logits do not depend on how much of the
            # prompt was cached: a seed gives the same text.
            end = len(prompt) - 1 if len(self.slots) == 1 and slot.prompt_pos < len(prompt) - 1 \
                else len(prompt)
            n = min(end - slot.prompt_pos, self.n_batch - len(tokens))
            for i in range(slot.prompt_pos, slot.prompt_pos + n):
                add(slot, prompt[i], i == len(prompt) - 1)
            slot.prompt_pos += max(n, 0)
            if len(tokens) >= self.n_batch:
                break
        if not tokens:
            return None, []
        return Batch(tokens, pos=pos, seq_ids=seqs, logits=want), outputs

    def _make_room(self, slot: Slot, n_new: int = 1) -> bool:
        """A full slot: shift its context to make room for n_new tokens (True) or finish it
        (False)."""
        if self.context_policy == "error" or not self.model.kv.can_shift:
            # (a recurrent state cannot forget the middle of its sequence)
            self._finish(slot, "context_full")
            return False
        n_past = len(slot.tokens)
        n_keep = min(self._n_keep(n_past), n_past - 2)
        n_discard = max((n_past - n_keep) // 2, n_past + n_new - slot.n_ctx)
        if n_discard > n_past - n_keep:
            self._finish(slot, "context_full")
            return False
        kv = self.model.kv
        kv.seq_rm(slot.id, n_keep, n_keep + n_discard)
        kv.seq_add(slot.id, n_keep + n_discard, n_past, -n_discard)
        del slot.tokens[n_keep:n_keep + n_discard]
        return True

    def update_from_output(self, outputs: list[tuple[Slot, int]], logits: np.ndarray | None,
                           t_decode: float, tokens: np.ndarray | None = None) -> None:
        """Samples the next token of every slot that got logits and emits its events. `tokens`
        (with logits None): the outputs' greedy tokens, sampled on the device
        (Model.decode_tokens; -1 where the logits were not finite)."""
        now = time.perf_counter()
        self._kv_used = self.model.kv.used_cells  # the same for every event of the step
        for slot, row in outputs:
            req = slot.request
            if req is None:
                continue
            if slot.state == SlotState.PROMPT:
                self._prompt_done(slot, now)
            try:
                if tokens is None:
                    self._sample(slot, logits[row], now)
                else:
                    self._sample(slot, None, now, device_token=int(tokens[row]))
            except Exception as e:  # noqa: BLE001 - a broken model ends its request, not the loop
                self._fail(slot, e)
        n_gen = sum(1 for s, _ in outputs if s.state == SlotState.GENERATING)
        self.stats["t_generation"] += t_decode if n_gen else 0.0
        self._kv_used = None

    def _prompt_done(self, slot: Slot, now: float) -> None:
        req = slot.request
        slot.state = SlotState.GENERATING
        slot.t_prompt_done = now
        n_new = len(req.prompt) - slot.n_reused
        elapsed = now - slot.t_start
        slot.prompt_tps = n_new / elapsed if elapsed > 0 else 0.0
        self.stats["n_prompt_tokens"] += n_new
        self.stats["n_prompt_tokens_cached"] += slot.n_reused
        self.stats["t_prompt"] += elapsed
        req.emit(self._event(slot, "prompt"))

    def _sample(self, slot: Slot, row: np.ndarray | None, now: float,
                device_token: int = -1) -> None:
        """The slot's next token(s) from its logits: one sampled token, plus what a constraint
        then forces; or, when a constraint forces tokens before any sampling, those alone. Row
        None: the greedy `device_token` sampled on the device (-1: its logits were not finite;
        the slot has no constraint, _greedy_on_device)."""
        req = slot.request
        finite = all_finite(row) if row is not None else device_token >= 0
        if not finite:
            raise NonFiniteLogitsError(
                "the model produced non-finite logits (NaN or infinity): its weights or "
                "metadata are broken")
        grammar = req.constraint
        budget_token = req.reasoning_budget.forced_token() \
            if req.reasoning_budget is not None else None
        if budget_token is not None and grammar is not None and not grammar.allows(budget_token):
            budget_token = None  # a grammar that cannot take the end tag wins over the budget
        if budget_token is not None:  # the reasoning budget ran out: its end tag, unsampled
            tokens, sampled = [budget_token], False
            if grammar is not None:
                tokens += grammar.commit(budget_token)
        elif grammar is None:
            tokens = [slot.sampler.sample(row) if row is not None else device_token]
            sampled = True
        else:
            tokens, sampled = grammar.take_forced(), False
            if not tokens:
                token = grammar.sample(slot.sampler, row)
                tokens, sampled = [token, *grammar.commit(token)], True
        for i, token in enumerate(tokens):
            if not self._append(slot, token, row if sampled and i == 0 else None, now):
                return
        if grammar is not None and grammar.done:
            self._finish(slot, "eog")  # only EOG may follow: no need to decode for it
        else:
            slot.pending = tokens

    def _append(self, slot: Slot, token: int, row: np.ndarray | None, now: float) -> bool:
        """Adds one generated token (row: the logits it was sampled from, None when forced) and
        emits its event; False when that finished the request."""
        req = slot.request
        slot.sampler.accept(token)
        if req.reasoning_budget is not None:
            req.reasoning_budget.accept(token)
        slot.n_generated += 1
        self.stats["n_generated_tokens"] += 1
        if slot.n_generated == 1:
            slot.ttft = now - req.t_queued
        if self.tokenizer.is_eog(token):
            self._finish(slot, "eog")
            return False
        text, stopped = slot.stops.feed(slot.decoder.feed(token))
        event = self._event(slot, "token", text=text, token_id=token)
        if req.n_probs and row is not None:
            event.logprob, event.top_logprobs = _logprobs(row, token, req.n_probs)
        req.emit(event)
        if stopped:
            self._finish(slot, "stop")
        elif req.params.max_tokens is not None and slot.n_generated >= req.params.max_tokens:
            self._finish(slot, "length")
        else:
            return True
        return False

    def _event(self, slot: Slot, kind: str, **fields) -> GenerationEvent:
        req = slot.request
        elapsed = time.perf_counter() - slot.t_prompt_done if slot.t_prompt_done else 0.0
        grammar = req.constraint
        if grammar is not None:
            fields.update(constrained=True, mask_ms=grammar.mask_ms, n_forced=grammar.n_forced)
        return GenerationEvent(
            kind, n_prompt=len(req.prompt), n_reused=slot.n_reused,
            n_prompt_dropped=req.n_dropped, n_generated=slot.n_generated,
            prompt_tps=slot.prompt_tps, gen_tps=slot.n_generated / elapsed if elapsed > 0 else 0.0,
            time_to_first_token=slot.ttft,
            kv_used=self.model.kv.used_cells if self._kv_used is None else self._kv_used,
            kv_total=self.model.n_ctx, slot=slot.id, **fields)

    def _fail(self, slot: Slot, e: BaseException) -> None:
        if slot.request is not None:
            slot.request.exception = e
        self._finish(slot, "error", error=str(e) or type(e).__name__)

    def reap(self) -> None:
        """Ends cancelled requests now, without decoding (frees their slots)."""
        with self._lock:
            self._drop_cancelled()

    def _finish(self, slot: Slot, reason: str, error: str | None = None) -> None:
        req = slot.request
        if req is None:
            return
        rest = ""
        if reason not in ("stop", "error") and slot.decoder is not None:
            rest = slot.stops.feed(slot.decoder.flush())[0] + slot.stops.flush()
        event = self._event(slot, "done", text=rest, finish_reason=reason, error=error)
        slot.request, slot.pending = None, []
        slot.state = SlotState.IDLE
        slot.t_last_used = time.perf_counter()
        req.emit(event)
        req.done.set()

    # ------------------------------------------------------------------ direct use of a slot

    def claim_sequence(self, slot_id: int = 0, force: bool = False):
        """A context manager for tools that drive a slot's sequence themselves (perplexity,
        benchmarks, Engine.logits): holds the step lock; the slot must be idle (unless force)."""
        return _Claim(self, slot_id, force)


class _Job:
    """A call handed to the serve loop by run_between_steps, and its outcome."""

    def __init__(self, fn: Callable[[], object]):
        self.fn = fn
        self.done = threading.Event()
        self.result = self.error = None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
            self.error = e
        finally:
            self.done.set()

    def wait(self):
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.result


class _Claim:
    def __init__(self, sched: Scheduler, slot_id: int, force: bool):
        self.sched, self.slot, self.force = sched, sched.slots[slot_id], force

    def __enter__(self) -> Slot:
        self.sched._step_lock.acquire()
        if self.slot.request is not None and not self.force:
            self.sched._step_lock.release()
            raise RuntimeError("the engine is busy generating; stop the generation first")
        return self.slot

    def __exit__(self, *exc):
        self.sched._step_lock.release()


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _logprobs(row: np.ndarray, token: int, n: int) -> tuple[float, list[tuple[int, float]]]:
    """log-softmax of the raw logits: the chosen token's and the n most likely (OpenAI's
    logprobs, llama-server's n_probs without post-sampling)."""
    x = row.astype(np.float64)
    lse = x.max() + np.log(np.exp(x - x.max()).sum())
    n = min(n, x.size)
    top = np.argpartition(-x, n - 1)[:n]
    top = top[np.argsort(-x[top], kind="stable")]
    return float(x[token] - lse), [(int(i), float(x[i] - lse)) for i in top]
