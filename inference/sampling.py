"""Token sampling with llama.cpp's sampler chain and defaults, and stop-string handling.

The chain is the one `common_sampler_init` builds with the default sampler list:

    logit bias → penalties → top-k → typical → top-p → min-p → temperature → draw

Each step follows `src/llama-sampling.cpp`:

- logit bias adds `bias[id]` to the logit (-inf bans a token);
- penalties look at the last `repeat_last_n` accepted tokens: a token seen `count` times has its
  logit divided by `repeat_penalty` when positive, multiplied when ≤ 0, then lowered by
  `count * frequency_penalty + presence_penalty`;
- top-k keeps the k largest logits (k ≤ 0: off);
- typical keeps the tokens whose surprise `-log p` is closest to the entropy until their mass
  exceeds `typical_p` (≥ 1: off);
- top-p keeps the most likely tokens until their mass reaches `top_p` (≥ 1: off);
- min-p keeps the tokens with `p ≥ min_p · p_max`, i.e. `logit ≥ max_logit + log(min_p)`
  (≤ 0: off);
- temperature divides the logits; at `temperature ≤ 0` it keeps only the largest logit, so the
  draw is greedy, but logit bias and penalties (and the filters) still apply first, as in
  llama.cpp;
- the draw is a softmax over what is left and one uniform number against the running sum. A
  single survivor is returned without touching the RNG (llama.cpp's `dist` does the same).

Every filter keeps at least one token and at least `min_keep`. The RNG is numpy's PCG64, not
llama.cpp's mt19937, so a seed gives a reproducible sequence here but not llama.cpp's sequence.

Speed: with top-k on, one numba pass over the logits (a k-element heap) finds the candidates, and
every later step works on those k candidates only, however large the vocabulary.

`SamplingParams` holds the options with their defaults; `SAMPLING_LIMITS` states the range of
each numeric one, which `SamplingParams` checks and front-ends build their settings on.

The sampler does not see the prompt unless told: llama.cpp's CLI accepts the prompt tokens into
the sampler so that repetition penalties cover them — call `accept_many(prompt_ids)` to do the
same.
"""
from __future__ import annotations

import math
import numbers
import secrets
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from numba import njit

from .cpu.simd import vadd, vflag_above, vload, vsub, vsum, vzero

__all__ = ["SamplingParams", "SAMPLING_LIMITS", "Limit", "Sampler", "StopStringMatcher"]


# --------------------------------------------------------------------------------------------
# parameters


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


@dataclass(frozen=True)
class Limit:
    """The values a numeric option takes: from `low` to `high` (None: no bound on that side;
    with `low_open`, `low` itself is excluded), whole numbers only when `integer`."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    integer: bool = False

    def problem(self, value) -> str | None:
        """What is wrong with `value` ("must be at least 1"), or None when it is allowed."""
        if self.integer:
            if not _is_int(value):
                return "must be a whole number"
        elif not _is_real(value) or not math.isfinite(float(value)):
            return "must be a number"
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return f"must be {'above' if self.low_open else 'at least'} {self.low}"
        if self.high is not None and value > self.high:
            return f"must be at most {self.high}"
        return None

    def checked(self, name: str, value) -> float | int:
        """`value` as an int or a float; ValueError naming `name` when it is not allowed."""
        problem = self.problem(value)
        if problem is not None:
            raise ValueError(f"{name} {problem}, got {value!r}")
        return int(value) if self.integer else float(value)

    def narrowed(self, low: float | None = None, high: float | None = None) -> Limit:
        """This range with a tighter bound on either side (a front-end's own, such as a form
        that refuses a temperature of 80); it never widens."""
        if low is not None and self.low is not None and low < self.low:
            raise ValueError(f"{low} is below this range's own lower bound {self.low}")
        if high is not None and self.high is not None and high > self.high:
            raise ValueError(f"{high} is above this range's own upper bound {self.high}")
        return replace(self, low=self.low if low is None else low,
                       high=self.high if high is None else high)


# SamplingParams' numeric options and the values each takes: what __post_init__ checks, and
# what a front-end's own settings build on (app/conversations.py's ChatSettings).
SAMPLING_LIMITS: dict[str, Limit] = {
    "temperature": Limit(),  # ≤ 0: greedy
    "top_k": Limit(-(2**31), integer=True),  # ≤ 0: off
    "top_p": Limit(0.0, 1.0),  # 1: off
    "min_p": Limit(0.0, 1.0),  # 0: off
    "typical_p": Limit(0.0, 1.0),  # 1: off
    "repeat_penalty": Limit(0.0, low_open=True),  # 1: off
    "repeat_last_n": Limit(-1, integer=True),  # 0: no tokens, -1: the whole context
    "frequency_penalty": Limit(),
    "presence_penalty": Limit(),
    "seed": Limit(0, 2**128 - 1, integer=True),  # PCG64 takes 128 bits
    "max_tokens": Limit(1, integer=True),
    "min_keep": Limit(0, integer=True),
}
# The options that may also be None: seed (a random one) and max_tokens (no limit).
NONE_ALLOWED = frozenset({"seed", "max_tokens"})


@dataclass(frozen=True)
class SamplingParams:
    """What to sample and when to stop. Defaults are llama.cpp's (`common/common.h`).

    temperature ≤ 0 means greedy. top_k ≤ 0, top_p = 1, min_p = 0 and typical_p = 1 turn those
    filters off; repeat_penalty = 1 and frequency/presence penalty = 0 turn penalties off.
    repeat_last_n: how many recent tokens the penalties look at; 0 = none, -1 = the whole context.
    seed: None draws a random one (see `Sampler.seed`). logit_bias: token id → added to its logit
    (-inf bans it). max_tokens: None = until end of generation or context. stop: strings that
    end generation (a single string is accepted too).
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    max_tokens: int | None = None
    stop: Sequence[str] = ()
    min_keep: int = 0

    def __post_init__(self):
        set_ = object.__setattr__
        for name, limit in SAMPLING_LIMITS.items():
            value = getattr(self, name)
            if value is not None or name not in NONE_ALLOWED:
                set_(self, name, limit.checked(name, value))
        set_(self, "logit_bias", self._check_bias(self.logit_bias))
        set_(self, "stop", self._check_stop(self.stop))

    @staticmethod
    def _check_bias(bias) -> dict[int, float]:
        if bias is None:
            return {}
        if not isinstance(bias, Mapping):
            raise ValueError(f"logit_bias must be a mapping of token id → bias, got {type(bias).__name__}")
        out = {}
        for k, v in bias.items():
            if not _is_int(k) or k < 0:
                raise ValueError(f"logit_bias keys must be token ids (integers ≥ 0), got {k!r}")
            if not _is_real(v) or math.isnan(float(v)) or float(v) == math.inf:
                raise ValueError(
                    f"logit_bias[{k}] must be a finite number or -inf (to ban the token), got {v!r}")
            out[int(k)] = float(v)
        return out

    @staticmethod
    def _check_stop(stop) -> tuple[str, ...]:
        if stop is None:
            return ()
        if isinstance(stop, str):
            stop = (stop,)
        if not isinstance(stop, Iterable):
            raise ValueError(f"stop must be a list of strings, got {type(stop).__name__}")
        out = []
        for s in stop:
            if not isinstance(s, str):
                raise ValueError(f"stop strings must be str, got {s!r}")
            if not s:
                raise ValueError("stop strings must not be empty")
            if s not in out:
                out.append(s)
        return tuple(out)

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= 0.0


# --------------------------------------------------------------------------------------------
# kernels


@njit(cache=True, inline="always")
def _below(va, ia, vb, ib):
    # heap order: the "smallest" candidate is the one to evict first: lower logit, or on a tie the
    # higher token id (so that ties keep the lowest ids, like a stable descending sort)
    return va < vb or (va == vb and ia > ib)


@njit(cache=True, inline="always")
def _sift_down(vals, ids, pos, k):
    while True:
        child = 2 * pos + 1
        if child >= k:
            break
        if child + 1 < k and _below(vals[child + 1], ids[child + 1], vals[child], ids[child]):
            child += 1
        if _below(vals[child], ids[child], vals[pos], ids[pos]):
            vals[pos], vals[child] = vals[child], vals[pos]
            ids[pos], ids[child] = ids[child], ids[pos]
            pos = child
        else:
            break


@njit(cache=True, inline="always")
def _offer(x, i, out_vals, out_ids, k):
    """x[i] into the heap if it beats the root; 1 when it is NaN or +inf (rejected later)."""
    v = x[i]
    if v > out_vals[0]:  # NaN never passes; a tie with the root keeps the lower id
        out_vals[0] = v
        out_ids[0] = i
        _sift_down(out_vals, out_ids, 0, k)
        return 1 if v == np.inf else 0
    return 1 if v != v else 0


@njit(cache=True, nogil=True)
def _top_k_kernel(x, k, out_vals, out_ids):
    """The k largest entries of x (ties: lowest index first) into out_*, as a min-heap (unsorted).
    Returns the number of entries that are NaN or +inf (which the caller rejects).

    After the first few hundred entries hardly any beats the heap's root, so 16 entries at a time
    are first compared with it in one vector instruction, and walked one by one only when one is
    above it (or NaN or +inf)."""
    n = x.shape[0]
    bad = 0
    for i in range(k):
        v = x[i]
        if v != v or v == np.inf:
            bad += 1
        out_vals[i] = v
        out_ids[i] = i
    for start in range(k // 2 - 1, -1, -1):
        _sift_down(out_vals, out_ids, start, k)
    i = k
    while i + 16 <= n:
        if vflag_above(vload(x, i), out_vals[0]):
            for j in range(i, i + 16):
                bad += _offer(x, j, out_vals, out_ids, k)
        i += 16
    for j in range(i, n):
        bad += _offer(x, j, out_vals, out_ids, k)
    return bad


@njit(cache=True, nogil=True)
def _all_finite_kernel(x):
    # x - x is 0 for a finite x and NaN for NaN or an infinity; the NaN survives the sums
    n = x.shape[0]
    acc = vzero()
    i = 0
    while i + 16 <= n:
        v = vload(x, i)
        acc = vadd(acc, vsub(v, v))
        i += 16
    total = vsum(acc)
    for j in range(i, n):
        total += x[j] - x[j]
    return total == 0


def all_finite(row: np.ndarray) -> bool:
    """No NaN or infinity in a row of logits: one vectorized pass (numpy's isfinite().all()
    writes a bool per logit and reads them again)."""
    if row.dtype == np.float32 and row.ndim == 1 and row.flags.c_contiguous:
        return bool(_all_finite_kernel(row))
    return bool(np.isfinite(row).all())


@njit(cache=True, nogil=True)
def _sorted_top_k(x, k, vals, ids):
    """The k largest entries of x into vals/ids, sorted descending, ties lower id first (an
    insertion sort for the usual few dozen; else by id, then a stable sort by logit). Returns
    how many entries of x are NaN or +inf (then the order does not matter: the caller rejects)."""
    bad = _top_k_kernel(x, k, vals, ids)
    if k <= 64:
        for i in range(1, k):
            v, d = vals[i], ids[i]
            j = i - 1
            while j >= 0 and (vals[j] < v or (vals[j] == v and ids[j] > d)):
                vals[j + 1], ids[j + 1] = vals[j], ids[j]
                j -= 1
            vals[j + 1], ids[j + 1] = v, d
    else:
        by_id = np.argsort(ids)
        v, d = vals[by_id], ids[by_id]
        order = np.argsort(-v, kind="mergesort")
        vals[:] = v[order]
        ids[:] = d[order]
    return bad


@njit(cache=True, nogil=True)
def _top_k_sorted(x, k, top_p, log_min_p, min_keep, ids, vals):
    """llama.cpp's default chain up to the draw in one call: the k largest logits sorted
    (`_sorted_top_k`), then how many top-p and min-p keep (`_nucleus`). Returns -1 when x holds
    NaN or +inf, or when the best candidate is -inf (the general path then says which)."""
    if _sorted_top_k(x, k, vals, ids) or not vals[0] > -np.inf:
        return -1
    return _nucleus(vals, top_p, log_min_p, min_keep)


def _top_k(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(ids, logits) of the k largest logits, sorted descending (ties: lower id first)."""
    vals = np.empty(k, dtype=np.float32)
    ids = np.empty(k, dtype=np.int64)
    bad = _sorted_top_k(x, k, vals, ids)
    return ids, vals, bad


@njit(cache=True, nogil=True)
def _nucleus(vals, top_p, log_min_p, min_keep):
    """How many of the candidates (logits sorted descending) top-p and then min-p keep, as the
    general path below computes it: the smallest prefix whose float32 softmax mass reaches top_p
    (at least min_keep), then the prefix above max + log(min_p) (at least min_keep)."""
    n = vals.shape[0]
    if top_p < 1.0 and n > 1:
        e = np.empty(n, np.float32)
        total = np.float32(0.0)
        for i in range(n):
            e[i] = np.exp(vals[i] - vals[0])
            total += e[i]
        cum = np.float32(0.0)
        for i in range(n):
            cum += e[i] / total
            if cum >= top_p and i + 1 >= min_keep:
                n = i + 1
                break
    if log_min_p > -np.inf and n > 1:
        floor = vals[0] + log_min_p
        for i in range(min_keep, n):
            if vals[i] < floor:
                n = i
                break
    return n


@njit(cache=True, nogil=True)
def _draw(vals, n, temperature, u, probs):
    """The position drawn among the first n candidates (sorted logits) at `temperature`, with u
    uniform in [0, 1); probs[:n] = their probabilities."""
    mx = vals[0] / temperature
    cum = np.empty(n, np.float64)
    total = 0.0
    for i in range(n):
        probs[i] = np.exp(vals[i] / temperature - mx)
        total += probs[i]
        cum[i] = total
    target = u * total
    pick = n
    for i in range(n):  # searchsorted(cum, target, side="right")
        if cum[i] > target:
            pick = i
            break
    if pick >= n:  # rounding at the very top: the last candidate with mass
        for i in range(n - 1, -1, -1):
            if probs[i] > 0:
                pick = i
                break
    for i in range(n):
        probs[i] = probs[i] / np.float32(total)
    return pick


def _desc_order(ids: np.ndarray, vals: np.ndarray) -> np.ndarray:
    """Positions sorting the candidates by logit, descending; ties by lower id (for large arrays,
    whose ids are still in ascending order, a stable argsort gives the same)."""
    if len(vals) > 4096:
        return np.argsort(-vals, kind="stable")
    return np.lexsort((ids, -vals))


def _sort_desc(ids: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = _desc_order(ids, vals)
    return ids[order], vals[order]


def _softmax32(vals: np.ndarray) -> np.ndarray:
    """llama.cpp's softmax: float32 exp(logit - max), normalised by the sum."""
    e = np.exp(vals - vals.max(), dtype=np.float32)
    return e / e.sum(dtype=np.float32)


# --------------------------------------------------------------------------------------------
# the sampler


class Sampler:
    """One generation's sampler: `sample(logits) -> token id`, `accept(token_id)` after each token
    (and `accept_many(prompt_ids)` first, to let the penalties see the prompt as llama.cpp does).

    n_ctx is only used for `repeat_last_n = -1` (the whole context); without it the window is
    unbounded. After `sample`, `last_candidates` holds the final (ids, probabilities) it drew from.
    """

    def __init__(self, params: SamplingParams, n_vocab: int, *, n_ctx: int | None = None):
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        if not _is_int(n_vocab) or n_vocab < 1:
            raise ValueError(f"n_vocab must be a positive integer, got {n_vocab!r}")
        if n_ctx is not None and (not _is_int(n_ctx) or n_ctx < 1):
            raise ValueError(f"n_ctx must be a positive integer or None, got {n_ctx!r}")
        self.params = params
        self.n_vocab = int(n_vocab)
        for tok in params.logit_bias:
            if tok >= self.n_vocab:
                raise ValueError(
                    f"logit_bias names token {tok}, but the vocabulary has {self.n_vocab} tokens")
        self._bias_ids = np.fromiter(params.logit_bias.keys(), dtype=np.int64,
                                     count=len(params.logit_bias))
        self._bias_vals = np.fromiter(params.logit_bias.values(), dtype=np.float32,
                                      count=len(params.logit_bias))

        last_n = params.repeat_last_n
        if last_n == -1:
            last_n = n_ctx  # None: unbounded
        self._window_size = last_n
        self._penalties_on = last_n != 0 and not (
            params.repeat_penalty == 1.0 and params.frequency_penalty == 0.0
            and params.presence_penalty == 0.0)
        self._history: deque[int] = deque()
        self._counts: dict[int, int] = {}
        self._log_min_p = np.float32(math.log(params.min_p) if params.min_p > 0.0 else -math.inf)

        self.seed: int = 0
        self._rng: np.random.Generator
        self.reset()
        self.last_candidates: tuple[np.ndarray, np.ndarray] | None = None

    # ---- state

    def reset(self) -> None:
        """Forget accepted tokens and restart the RNG: the same sequence again for a fixed seed, a
        fresh random seed otherwise (as llama.cpp's `dist` sampler resets)."""
        self._history.clear()
        self._counts.clear()
        self.seed = self.params.seed if self.params.seed is not None else secrets.randbits(64)
        self._rng = np.random.Generator(np.random.PCG64(self.seed))

    def accept(self, token_id: int) -> None:
        """Record a token that is now part of the sequence (for the penalty window)."""
        if not _is_int(token_id) or not 0 <= token_id < self.n_vocab:
            raise ValueError(f"token id must be an integer in [0, {self.n_vocab}), got {token_id!r}")
        if self._window_size == 0:
            return
        token_id = int(token_id)
        if self._window_size is not None and len(self._history) >= self._window_size:
            old = self._history.popleft()
            c = self._counts[old] - 1
            if c:
                self._counts[old] = c
            else:
                del self._counts[old]
        self._history.append(token_id)
        self._counts[token_id] = self._counts.get(token_id, 0) + 1

    def accept_many(self, token_ids: Iterable[int]) -> None:
        for t in token_ids:
            self.accept(t)

    @property
    def argmax_only(self) -> bool:
        """The chain always answers the argmax of the raw logits (ties: the lowest id), so the
        logits need not reach the host (Model.decode_tokens): greedy (temperature ≤ 0 without
        typical sampling, or top-k = 1, which leaves one candidate for every later step) with no
        logit bias and no penalties to change them first."""
        p = self.params
        greedy = (p.temperature <= 0.0 and p.typical_p >= 1.0) or p.top_k == 1
        return greedy and not len(self._bias_ids) and not self._penalties_on

    @property
    def history(self) -> tuple[int, ...]:
        """The tokens in the penalty window, oldest first."""
        return tuple(self._history)

    # ---- sampling

    def _prepare(self, logits) -> np.ndarray:
        x = np.asarray(logits)
        if x.ndim != 1 or x.shape[0] != self.n_vocab:
            raise ValueError(f"logits must have shape ({self.n_vocab},), got {x.shape}")
        if x.dtype != np.float32:
            x = x.astype(np.float32)
        p = self.params
        if len(self._bias_ids) == 0 and not (self._penalties_on and self._counts):
            return np.ascontiguousarray(x)
        x = x.copy()
        if len(self._bias_ids):
            x[self._bias_ids] += self._bias_vals
        if self._penalties_on and self._counts:
            ids = np.fromiter(self._counts.keys(), dtype=np.int64, count=len(self._counts))
            cnt = np.fromiter(self._counts.values(), dtype=np.float32, count=len(self._counts))
            v = x[ids]
            rp = np.float32(p.repeat_penalty)
            v = np.where(v <= 0, v * rp, v / rp).astype(np.float32)
            v -= cnt * np.float32(p.frequency_penalty) + np.float32(p.presence_penalty)
            x[ids] = v
        return x

    def _sample_top_k(self, x: np.ndarray) -> int | None:
        """top-k, top-p, min-p, temperature and the draw: the common case (llama.cpp's
        defaults) in two compiled steps rather than a dozen numpy calls, the same choices as
        the general path below; None when the logits hold NaN or +inf or only -inf (the
        general path then raises the error that says which)."""
        p = self.params
        ids = np.empty(p.top_k, np.int64)
        vals = np.empty(p.top_k, np.float32)
        n = _top_k_sorted(x, p.top_k, np.float32(p.top_p), self._log_min_p,
                          max(p.min_keep, 1), ids, vals)
        if n < 0:
            return None
        ids, vals = ids[:n], vals[:n]
        if n == 1:
            self.last_candidates = (ids, np.ones(1, dtype=np.float32))
            return int(ids[0])
        probs = np.empty(n, np.float32)
        i = _draw(vals, n, np.float32(p.temperature), self._rng.random(), probs)
        self.last_candidates = (ids, probs)
        return int(ids[i])

    def sample(self, logits: np.ndarray) -> int:
        """Apply the chain to one row of logits (n_vocab,) and draw a token id."""
        p = self.params
        x = self._prepare(logits)
        if p.temperature <= 0.0 and p.typical_p >= 1.0:
            return self._sample_greedy(x)
        if 0 < p.top_k < self.n_vocab and p.typical_p >= 1.0:
            token = self._sample_top_k(x)
            if token is not None:
                return token
        ids, vals, is_sorted = self._candidates(x)
        min_keep = max(p.min_keep, 1)
        if p.typical_p < 1.0 and len(ids) > 1:
            ids, vals = _typical(ids, vals, is_sorted, p.typical_p, min_keep)
            is_sorted = False
        if p.top_p < 1.0 and len(ids) > 1:
            ids, vals, is_sorted = _top_p(ids, vals, is_sorted, p.top_p, min_keep)
        if p.min_p > 0.0 and len(ids) > 1:
            ids, vals = _min_p(ids, vals, is_sorted, self._log_min_p, min_keep)
        return self._draw(ids, vals)

    def _sample_greedy(self, x: np.ndarray) -> int:
        """Temperature ≤ 0 without typical sampling: top-k, top-p and min-p all keep the most
        likely token (ties: lowest id), so the chain's answer is the argmax of the biased and
        penalised logits."""
        token = int(np.argmax(x))
        best = x[token]
        if not best > -np.inf or best == np.inf:  # NaN sorts first in argmax
            if np.isnan(x).any() or best == np.inf:
                raise ValueError("logits contain NaN or +inf value(s)")
            raise ValueError("no token can be sampled: every candidate logit is -inf")
        self.last_candidates = (np.array([token], dtype=np.int64), np.ones(1, dtype=np.float32))
        return token

    def _candidates(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
        """(ids, logits, sorted?) that the filters start from: the top-k, sorted, when top-k is
        on, else every token in id order; ValueError when the logits hold NaN or +inf, or when
        every candidate is -inf."""
        p, n = self.params, self.n_vocab
        if 0 < p.top_k < n:
            ids, vals, bad = _top_k(x, p.top_k)
            is_sorted = True
        else:
            bad = int(np.count_nonzero(np.isnan(x) | (x == np.inf)))
            ids, vals = np.arange(n, dtype=np.int64), x
            is_sorted = False
        if bad:
            raise ValueError(f"logits contain {bad} NaN or +inf value(s)")
        if not vals.max() > -np.inf:
            raise ValueError("no token can be sampled: every candidate logit is -inf")
        return ids, vals, is_sorted

    def _draw(self, ids: np.ndarray, vals: np.ndarray) -> int:
        """The chain's last steps: temperature (≤ 0: the best candidate, ties to the lowest id),
        then one draw from the softmax of what is left."""
        p = self.params
        if p.temperature <= 0.0:
            best = vals.max()
            tied = ids[vals == best]
            token = int(tied.min())
            self.last_candidates = (np.array([token], dtype=np.int64),
                                    np.ones(1, dtype=np.float32))
            return token
        vals = vals / np.float32(p.temperature)
        if len(ids) == 1:
            self.last_candidates = (ids, np.ones(1, dtype=np.float32))
            return int(ids[0])
        e = np.exp(vals - vals.max(), dtype=np.float32)
        cum = np.cumsum(e, dtype=np.float64)
        total = cum[-1]
        target = self._rng.random() * total
        i = int(np.searchsorted(cum, target, side="right"))
        if i >= len(ids):  # rounding at the very top: the last token with non-zero mass
            i = int(np.nonzero(e > 0)[0][-1])
        self.last_candidates = (ids, (e / np.float32(total)).astype(np.float32))
        return int(ids[i])


def _typical(ids: np.ndarray, vals: np.ndarray, is_sorted: bool, typical_p: float,
             min_keep: int) -> tuple[np.ndarray, np.ndarray]:
    """Locally typical sampling: the candidates whose surprise is closest to the entropy, until
    their mass exceeds typical_p (in that order, no longer sorted by logit)."""
    if not is_sorted:
        ids, vals = _sort_desc(ids, vals)
    probs = _softmax32(vals)
    with np.errstate(divide="ignore"):
        logp = np.log(probs)
    pos = probs > 0
    entropy = -np.sum(probs[pos] * logp[pos], dtype=np.float32)
    shifted = np.abs(-logp - entropy)
    order = np.argsort(shifted, kind="stable")
    cum = np.cumsum(probs[order], dtype=np.float32)
    over = np.nonzero((cum > typical_p) & (np.arange(len(cum)) >= min_keep - 1))[0]
    last = int(over[0]) + 1 if len(over) else len(cum)
    keep = order[:last]
    return ids[keep], vals[keep]


def _top_p(ids: np.ndarray, vals: np.ndarray, is_sorted: bool, top_p: float,
           min_keep: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """The most likely candidates until their mass reaches top_p; (ids, logits, sorted?)."""
    probs = _softmax32(vals)
    if not is_sorted:
        # like llama.cpp, look for the nucleus among the most likely few first; the mass of a
        # prefix is the same whichever way the rest is ordered
        k = 256
        while k <= 2048 and k * 4 <= len(ids):
            top_pos, top_probs, _ = _top_k(probs, k)
            cum = np.cumsum(top_probs, dtype=np.float32)
            hit = np.nonzero((cum >= top_p) & (np.arange(1, k + 1) >= min_keep))[0]
            if len(hit):
                keep = top_pos[:int(hit[0]) + 1]
                return ids[keep], vals[keep], True
            k *= 8
        order = _desc_order(ids, vals)
        ids, vals, probs = ids[order], vals[order], probs[order]
    cum = np.cumsum(probs, dtype=np.float32)
    hit = np.nonzero((cum >= top_p) & (np.arange(1, len(cum) + 1) >= min_keep))[0]
    last = int(hit[0]) + 1 if len(hit) else len(cum)
    return ids[:last], vals[:last], True


def _min_p(ids: np.ndarray, vals: np.ndarray, is_sorted: bool, log_min_p: float,
           min_keep: int) -> tuple[np.ndarray, np.ndarray]:
    """The candidates whose logit is at least the best one's + log(min_p) (at least min_keep
    of them, the most likely)."""
    if not is_sorted:
        keep = vals >= vals.max() + log_min_p
        if np.count_nonzero(keep) >= min_keep:
            return ids[keep], vals[keep]
        ids, vals = _sort_desc(ids, vals)
    below = np.nonzero((vals < vals[0] + log_min_p) & (np.arange(len(vals)) >= min_keep))[0]
    if len(below):
        ids, vals = ids[:below[0]], vals[:below[0]]
    return ids, vals


# --------------------------------------------------------------------------------------------
# stop strings


class StopStringMatcher:
    """Watches generated text for stop strings, as llama.cpp's server does.

    Feed each decoded piece with `feed(piece)`: it returns `(text, stopped)`, where `text` is the
    newly safe-to-show text. Text that could be the start of a stop string is held back until the
    next pieces show whether it is; when a stop string completes, everything from its start on is
    dropped and `stopped` is True (`stop_string` says which; the earliest match wins). When
    generation ends for another reason, `flush()` returns what is still held back.
    """

    def __init__(self, stop: Sequence[str] | str = ()):
        self.stops: tuple[str, ...] = SamplingParams._check_stop(stop)
        self._text = ""  # everything fed, cut at the stop string once found
        self._sent = 0  # characters of _text already returned
        self.stop_string: str | None = None

    @property
    def stopped(self) -> bool:
        return self.stop_string is not None

    @property
    def text(self) -> str:
        """All text so far, without the stop string and what followed it."""
        return self._text

    @property
    def pending(self) -> str:
        """Text held back because it may begin a stop string."""
        return self._text[self._sent:]

    def feed(self, piece: str) -> tuple[str, bool]:
        if not isinstance(piece, str):
            raise ValueError(f"piece must be str, got {type(piece).__name__}")
        if self.stopped:
            return "", True
        self._text += piece
        unsent = self._text[self._sent:]
        if not self.stops:
            self._sent = len(self._text)
            return unsent, False

        # a complete stop string can only start in the unsent part: everything sent was checked
        # not to be the beginning of one
        best = -1
        for s in self.stops:
            pos = unsent.find(s)
            if pos != -1 and (best == -1 or pos < best):
                best, self.stop_string = pos, s
        if best != -1:
            out = unsent[:best]
            self._text = self._text[:self._sent + best]
            self._sent = len(self._text)
            return out, True

        # hold back the longest tail that is a proper prefix of some stop string
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(unsent)), hold, -1):
                if unsent.endswith(s[:k]):
                    hold = k
                    break
        out = unsent[:len(unsent) - hold]
        self._sent += len(out)
        return out, False

    def flush(self) -> str:
        """Generation ended without a stop string: release the held-back text."""
        out = self._text[self._sent:]
        self._sent = len(self._text)
        return out
