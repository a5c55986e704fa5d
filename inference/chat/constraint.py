"""Structured output: a grammar that every generated token must fit, as llama.cpp's grammar
sampler (`src/llama-grammar.cpp`, `llama_sampler_init_grammar`) does — built on llguidance
(Earley parsing over a token trie) instead of a grammar engine of our own.

    spec = ConstraintSpec("json_schema", {"type": "object", ...})
    constraint = Constraint.build(tokenizer, n_vocab, spec)   # ConstraintError when refused
    forced = constraint.take_forced()        # a prefix the grammar forces before any sampling
    token = constraint.sample(sampler, logits)                 # instead of sampler.sample
    forced = constraint.commit(token)        # the tokens the grammar forces next (committed)

Kinds: a JSON schema, any JSON object (OpenAI's `json_object`), a regex, a Lark grammar
(llguidance's dialect) or a GBNF grammar (llama.cpp's format, converted to Lark by llguidance).

Why llguidance: llama.cpp's own sampler walks every token of the vocabulary through its stack
machine at every step (llama.cpp #7554); llguidance walks a token trie, many times faster
(docs/performance.md has both measured), compiles JSON schemas itself (refusing, by name, the
keywords it cannot honour rather than skipping them) and ships as one dependency-free abi3 wheel. xgrammar is as
fast but needs torch. benchmarks/bench_constrained.py measures all three.

The vocabulary goes to llguidance once per tokenizer (`ConstraintVocab.of`, cached): every
token's bytes as our detokenizer produces them, CONTROL tokens (and USER_DEFINED ones that look
like `<...>`) marked special so that no grammar can spell them, and one end-of-generation id
standing for the whole EOG set.

Sampling keeps llama.cpp's trick (`common_sampler_sample`): the token the unconstrained chain
draws is checked first, and only when the grammar rejects it is the full mask computed, applied
(a numba kernel) and the chain run again. EOG is allowed exactly when the grammar accepts.

Objects hold only the keys their schema lists unless it allows others, and date-time / time
strings are bounded, as llama.cpp's converter generates them (json_schema.generation_schema): a
small model invents keys or fraction digits forever otherwise.

JSON numbers are capped as llama.cpp's schema converter caps them (`[1-9][0-9]{0,15}`,
`[0-9]{1,16}`): at most MAX_NUMBER_DIGITS digits in a row outside strings, so a small model that
would repeat a digit forever ("-129.5674844444…") has to end the number. llguidance's JSON
compiler has no such bound, so `Constraint` keeps a JSON lexer's state (inside a string or not,
digits in a row) over what was committed and, at the cap, removes the tokens that would add a
digit before sampling.
"""
from __future__ import annotations

import json
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from numba import njit

from .json_schema import generation_schema

__all__ = ["CONSTRAINT_KINDS", "Constraint", "ConstraintError", "ConstraintSpec",
           "ConstraintVocab"]

CONSTRAINT_KINDS = ("json_schema", "json_object", "regex", "lark", "gbnf")

# JSON without free whitespace: ", " and ": " between items, nothing else. Flexible whitespace
# lets a small model spin on newlines until max_tokens (llama.cpp bounds it at 20 per gap).
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

MAX_FORCED = 64  # forced tokens appended in one step; the rest follow at the next one
MAX_NUMBER_DIGITS = 16  # digits in a row in a JSON number part (integral, fraction, exponent)


class ConstraintError(ValueError):
    """A schema or grammar that cannot be used; the message names what is wrong or
    unsupported (llguidance's own words, e.g. 'Unimplemented keys: ["not"]')."""


def _llguidance():
    try:
        import llguidance
    except ImportError as e:
        raise ConstraintError("structured output needs the llguidance package "
                              "(pip install llguidance)") from e
    return llguidance


@dataclass(frozen=True)
class ConstraintSpec:
    """What the output must match. kind: one of CONSTRAINT_KINDS; source: the JSON schema
    (a mapping or its JSON text), the regex, the Lark or GBNF grammar text; none for
    "json_object"."""
    kind: str
    source: str | Mapping | None = None

    def __post_init__(self):
        if self.kind not in CONSTRAINT_KINDS:
            raise ConstraintError(f"constraint kind must be one of {', '.join(CONSTRAINT_KINDS)}, "
                                  f"not {self.kind!r}")
        if self.kind == "json_object":
            if self.source is not None:
                raise ConstraintError("a json_object constraint takes no source")
        elif self.kind == "json_schema":
            object.__setattr__(self, "source", _schema_text(self.source))
        elif not isinstance(self.source, str) or not self.source.strip():
            raise ConstraintError(f"a {self.kind} constraint needs its text, got "
                                  f"{self.source!r}")

    def compile(self) -> str:
        """The llguidance grammar (its JSON form) for this spec, checked: ConstraintError names
        what llguidance refuses (an unimplemented keyword, a bad regex, an unknown rule)."""
        grammar = self._grammar()
        failed, messages = _llguidance().LLMatcher.validate_grammar_with_warnings(grammar)
        if failed:
            raise ConstraintError(_describe(self, messages[0]))
        return grammar

    def _grammar(self) -> str:
        llg = _llguidance()
        matcher = llg.LLMatcher
        if self.kind == "json_schema":
            try:
                schema = json.dumps(generation_schema(json.loads(self.source)))
                return matcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)
            except RecursionError:
                raise ConstraintError("cannot use this JSON schema: it nests too deeply") \
                    from None
            except ValueError as e:  # llguidance's own limits ("recursion limit exceeded")
                raise ConstraintError(_describe(self, str(e))) from None
        if self.kind == "json_object":
            return matcher.grammar_from_json_schema('{"type": "object"}', overrides=JSON_OPTIONS)
        if self.kind == "regex":
            return matcher.grammar_from_regex(self.source)
        if self.kind == "lark":
            return matcher.grammar_from_lark(self.source)
        try:
            return llg.grammar_from("gbnf", self.source)
        except ValueError as e:  # the converter's "Rule 'x' not found", "Expected ')' at ..."
            raise ConstraintError(f"cannot use this GBNF grammar: {_strip_prefix(str(e))}") \
                from None


def _schema_text(source) -> str:
    """A JSON schema as compact JSON text; ConstraintError when it is not a JSON object."""
    if isinstance(source, str):
        try:
            source = json.loads(source)
        except json.JSONDecodeError as e:
            raise ConstraintError(f"the JSON schema is not valid JSON: {e}") from None
        except RecursionError:
            raise ConstraintError("cannot use this JSON schema: it nests too deeply") from None
    if isinstance(source, bool):
        raise ConstraintError("a boolean JSON schema constrains nothing useful; give an object")
    if not isinstance(source, Mapping):
        raise ConstraintError(f"a JSON schema must be a JSON object, got "
                              f"{type(source).__name__}")
    try:
        return json.dumps(source, separators=(",", ":"))
    except RecursionError:
        raise ConstraintError("cannot use this JSON schema: it nests too deeply") from None


def _strip_prefix(message: str) -> str:
    return message.removeprefix("Failed to convert the grammar from GBNF to Lark: ")


# --------------------------------------------------------------------------------------------
# the vocabulary, once per tokenizer


class _TokenizerWrapper:
    """What llguidance's LLTokenizer reads from a Python tokenizer (its TokenizerWrapper
    protocol): token bytes, EOS/BOS ids, special ids and a text → ids callable, which it calls
    to tokenize forced text. It holds the tokenizer weakly: the cache below is keyed by the
    tokenizer, and a strong reference from inside llguidance would keep both alive forever."""
    is_tokenizer_wrapper = True

    def __init__(self, tokenizer, tokens, eos_id, special_ids):
        self.tokens = tokens
        self.eos_token_id = eos_id
        self.bos_token_id = tokenizer.bos_id
        self.special_token_ids = special_ids
        self._tokenizer = weakref.ref(tokenizer)

    def __call__(self, text: str) -> list[int]:
        return self._tokenizer().encode(text, add_special=False)


class ConstraintVocab:
    """One tokenizer's vocabulary as llguidance sees it. Built once per tokenizer (`of`): it
    visits every token, which takes a noticeable time for a large vocabulary."""

    _cache: ClassVar[weakref.WeakKeyDictionary] = weakref.WeakKeyDictionary()
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, tokenizer, n_vocab: int):
        from ..tokenizers.tokenizer import ATTR_CONTROL, ATTR_UNKNOWN, ATTR_USER_DEFINED
        llg = _llguidance()
        n_tok = tokenizer.n_vocab
        if n_vocab < n_tok:
            raise ValueError(f"the model has {n_vocab} logits for {n_tok} tokens")
        tokens, special = [], []
        for i in range(n_tok):
            piece = tokenizer.token_to_piece(i)
            attr = tokenizer.token_attr(i)
            if attr & (ATTR_CONTROL | ATTR_UNKNOWN) or (
                    attr & ATTR_USER_DEFINED and piece.startswith(b"<") and piece.endswith(b">")):
                special.append(i)
            tokens.append(piece)
        tokens += [b""] * (n_vocab - n_tok)  # logits past the vocabulary: never allowed
        eog = sorted(tokenizer.eog_ids)
        eos = tokenizer.eos_id if tokenizer.eos_id in tokenizer.eog_ids else \
            (eog[0] if eog else None)
        special = sorted(set(special) | set(eog))
        self.n_vocab = n_vocab
        self.pieces = tokens
        # ASCII digits each token starts with (the JSON number cap's unit)
        self.lead_digits = np.array([len(t) - len(t.lstrip(b"0123456789")) for t in tokens],
                                    dtype=np.int64)
        self.max_lead_digits = int(self.lead_digits.max(initial=0))
        self.eog_ids = np.array(eog, dtype=np.int64)
        self.ll = llg.LLTokenizer(_TokenizerWrapper(tokenizer, tokens, eos, special))
        # without an EOG token llguidance adds an empty one past the vocabulary
        self.eos_id = int(self.ll.eos_token)
        self.n_words = (self.ll.vocab_size + 31) // 32

    @classmethod
    def of(cls, tokenizer, n_vocab: int | None = None) -> ConstraintVocab:
        """The cached vocabulary of `tokenizer` (n_vocab: the model's logits, when more)."""
        n_vocab = n_vocab or tokenizer.n_vocab
        with cls._lock:
            vocab = cls._cache.get(tokenizer)
            if vocab is None or vocab.n_vocab != n_vocab:
                vocab = cls._cache[tokenizer] = cls(tokenizer, n_vocab)
            return vocab


# --------------------------------------------------------------------------------------------
# one request's constraint


@njit(cache=True, nogil=True)
def _apply_mask(logits, words, out):
    """out = logits where the token's bit in `words` is set, -inf elsewhere (and past the
    mask). Whole 32-token words are copied or cleared at once: masks are mostly empty."""
    n = logits.shape[0]
    for w in range(words.shape[0]):
        bits = words[w]
        base = w * 32
        end = min(base + 32, n)
        if bits == 0:
            for i in range(base, end):
                out[i] = -np.inf
        elif bits == 0xFFFFFFFF:
            for i in range(base, end):
                out[i] = logits[i]
        else:
            for i in range(base, end):
                out[i] = logits[i] if (bits >> (i - base)) & 1 else -np.inf
    for i in range(words.shape[0] * 32, n):
        out[i] = -np.inf


class Constraint:
    """One generation's grammar state: `sample` instead of `Sampler.sample`, `commit` each
    sampled token (it returns the tokens the grammar then forces, committed with it),
    `take_forced` for what is forced before anything is sampled. `done` once only EOG can
    follow.

    Statistics: n_tokens (committed, forced ones included), n_forced, n_masks (full masks
    computed: the sampled token was rejected), seconds (spent on the constraint: checks, masks,
    resampling, forced tokens)."""

    def __init__(self, vocab: ConstraintVocab, spec: ConstraintSpec, grammar: str):
        llg = _llguidance()
        self.vocab = vocab
        self.spec = spec
        self._matcher = llg.LLMatcher(vocab.ll, grammar, log_level=0)
        if self._matcher.is_error():
            raise ConstraintError(_describe(spec, self._matcher.get_error()))
        self._eog = frozenset(vocab.eog_ids.tolist())
        self._words = np.zeros(vocab.n_words, dtype=np.uint32)
        self._masked = np.empty(vocab.n_vocab, dtype=np.float32)
        self.n_tokens = self.n_forced = self.n_masks = 0
        self.seconds = 0.0
        self._ff_known_empty = False
        self._json = _JsonDigits() if spec.kind in ("json_schema", "json_object") else None

    @classmethod
    def build(cls, tokenizer, n_vocab: int | None, spec: ConstraintSpec) -> Constraint:
        """A fresh constraint for one request; ConstraintError when the grammar is refused."""
        if not isinstance(spec, ConstraintSpec):
            raise ConstraintError(f"constraint must be a ConstraintSpec, got "
                                  f"{type(spec).__name__}")
        grammar = spec.compile()
        return cls(ConstraintVocab.of(tokenizer, n_vocab), spec, grammar)

    # ---- state

    @property
    def done(self) -> bool:
        """The grammar is complete and nothing but EOG may follow."""
        return self._matcher.is_stopped()

    @property
    def accepting(self) -> bool:
        """The output so far is a complete match (EOG may follow)."""
        return self._matcher.is_accepting()

    @property
    def mask_ms(self) -> float:
        """Constraint work per committed token, in milliseconds."""
        return 1e3 * self.seconds / self.n_tokens if self.n_tokens else 0.0

    def allows(self, token: int) -> bool:
        """Whether `token` may come next (an EOG token exactly when the grammar accepts)."""
        if token in self._eog:
            return self._matcher.is_accepting()
        return self._matcher.validate_tokens([token]) == 1

    # ---- sampling

    def sample(self, sampler, logits: np.ndarray) -> int:
        """llama.cpp's grammar-checked sampling: the chain's own choice when the grammar allows
        it, else the chain again over the logits the mask leaves."""
        logits = self._capped(logits)
        token = sampler.sample(logits)
        t0 = time.perf_counter()
        try:
            if self.allows(token):
                return token
            self.n_masks += 1
            return sampler.sample(self.masked(logits))
        finally:
            self.seconds += time.perf_counter() - t0

    def _capped(self, logits: np.ndarray) -> np.ndarray:
        """The logits without the tokens that would make a JSON number longer than the cap."""
        run = self._json.run if self._json else 0
        if run + self.vocab.max_lead_digits <= MAX_NUMBER_DIGITS:
            return logits
        lead = self.vocab.lead_digits
        row = np.array(logits, dtype=np.float32)
        row[:lead.size][(lead > 0) & (run + lead > MAX_NUMBER_DIGITS)] = -np.inf
        return row

    def masked(self, logits: np.ndarray) -> np.ndarray:
        """The logits with every token the grammar rejects at -inf (a buffer reused per call)."""
        words = self._words
        self._matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        self._check()
        eos = self.vocab.eos_id
        allow_eog = int(words[eos >> 5]) >> (eos & 31) & 1
        for t in self.vocab.eog_ids.tolist():  # llguidance knows one; the model has a set
            bit = 1 << (t & 31)
            words[t >> 5] = int(words[t >> 5]) | bit if allow_eog \
                else int(words[t >> 5]) & (0xFFFFFFFF ^ bit)
        row = np.asarray(logits, dtype=np.float32)
        _apply_mask(row, words, self._masked)
        return self._masked

    def commit(self, token: int) -> list[int]:
        """Advances the grammar past a sampled `token`; returns the tokens the grammar forces
        next, already committed too (none after EOG)."""
        t0 = time.perf_counter()
        try:
            self.n_tokens += 1
            self._ff_known_empty = False
            if token in self._eog:
                return []
            if not self._matcher.consume_token(token):
                self._check()
                raise ConstraintError(f"token {token} does not fit the {self.spec.kind}")
            self._lex([token])
            return self._take_forced()
        finally:
            self.seconds += time.perf_counter() - t0

    def take_forced(self) -> list[int]:
        """The tokens the grammar forces before anything is sampled (at the start), committed;
        usually none."""
        t0 = time.perf_counter()
        try:
            return [] if self._ff_known_empty else self._take_forced()
        finally:
            self.seconds += time.perf_counter() - t0

    def _take_forced(self) -> list[int]:
        # llguidance's fast-forward tokens hold back a last token that could still merge with
        # what follows, so after taking them all there is nothing more to take until the next
        # sampled token; remembering that saves a second search per token
        matcher = self._matcher
        forced = [] if matcher.is_stopped() else matcher.compute_ff_tokens()
        self._ff_known_empty = len(forced) <= MAX_FORCED
        forced = forced[:MAX_FORCED]
        if forced and not matcher.consume_tokens(forced):
            self._check()
        self.n_tokens += len(forced)
        self.n_forced += len(forced)
        self._lex(forced)
        return forced

    def _lex(self, tokens: list[int]) -> None:
        if self._json:
            for t in tokens:
                self._json.feed(self.vocab.pieces[t])

    def _check(self) -> None:
        if self._matcher.is_error():
            raise ConstraintError(_describe(self.spec, self._matcher.get_error()))


class _JsonDigits:
    """Just enough of a JSON lexer for the number cap: inside a string or not, and how many
    digits in a row end the output."""

    def __init__(self):
        self.in_string = self.escaped = False
        self.run = 0

    def feed(self, data: bytes) -> None:
        for b in data:
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif b == 0x5C:  # backslash
                    self.escaped = True
                elif b == 0x22:  # quote
                    self.in_string = False
            elif 0x30 <= b <= 0x39:
                self.run += 1
            else:
                self.run = 0
                self.in_string = b == 0x22


def _describe(spec: ConstraintSpec, message: str) -> str:
    what = {"json_schema": "JSON schema", "json_object": "JSON object grammar",
            "regex": "regex", "lark": "Lark grammar", "gbnf": "GBNF grammar"}[spec.kind]
    return f"cannot use this {what}: {message.strip()}"
