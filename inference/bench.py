"""Throughput measured the way llama-bench measures it.

pp N: one N-token prompt decoded as a batch from an empty cache. tg N: N single-token decodes
one after another. With a depth D, the cache first holds D tokens (decoded before the clock
starts), and the test is named "pp N @ dD" as llama-bench's -d names it. Each test runs once as a
warm-up, then `repetitions` times; tokens/s is reported as mean ± standard deviation over the
repetitions. Tokens are random ids, as in llama-bench, since the content does not change the
work.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np


@dataclass
class BenchResult:
    test: str  # "pp512", "tg128"
    n_tokens: int
    samples_ts: list[float]  # tokens/s of each repetition

    @property
    def avg_ts(self) -> float:
        return float(np.mean(self.samples_ts))

    @property
    def stddev_ts(self) -> float:
        return float(np.std(self.samples_ts, ddof=1)) if len(self.samples_ts) > 1 else 0.0


def _fill(engine, ids: list[int], n: int) -> None:
    """An empty cache, then the first n of `ids` decoded (the depth a test starts at)."""
    engine.reset()
    for start in range(0, n, engine.batch_size):
        engine.decode_tokens(ids[start:min(n, start + engine.batch_size)], start)


def _prompt(engine, ids: list[int], start: int) -> None:
    for offset in range(0, len(ids), engine.batch_size):
        engine.decode_tokens(ids[offset:offset + engine.batch_size], start + offset)


def _generate(engine, first: int, n: int, start: int) -> None:
    token = first
    for pos in range(start, start + n):
        engine.decode_tokens([token], pos)


def run_bench(engine, n_prompt: int = 512, n_gen: int = 128, repetitions: int = 5,
              seed: int = 0, n_depth: int = 0) -> list[BenchResult]:
    """Runs pp{n_prompt} (if > 0) and tg{n_gen} (if > 0) on an Engine, each after n_depth
    tokens already in the cache (decoded before the clock starts, as llama-bench's -d)."""
    need = n_depth + max(n_prompt, n_gen) + 1
    if need > engine.info.n_ctx:
        raise ValueError(f"the tests need a context of at least {need} tokens; the engine has "
                         f"{engine.info.n_ctx}")
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, engine.info.n_vocab, n_depth + max(n_prompt, 1)).tolist()
    depth, prompt = ids[:n_depth], ids[n_depth:]
    suffix = f" @ d{n_depth}" if n_depth else ""
    tests = [(f"pp{n_prompt}{suffix}", n_prompt, lambda: _prompt(engine, prompt, n_depth))] \
        if n_prompt > 0 else []
    if n_gen > 0:
        tests.append((f"tg{n_gen}{suffix}", n_gen,
                      lambda: _generate(engine, prompt[0], n_gen, n_depth)))
    results = []
    for name, n, fn in tests:
        samples = []
        for rep in range(repetitions + 1):  # the first is the warm-up
            _fill(engine, depth, n_depth)
            t0 = time.perf_counter()
            fn()
            if rep:
                samples.append(n / (time.perf_counter() - t0))
        results.append(BenchResult(name, n, samples))
    engine.reset()
    return results
