"""Throughput measured the way llama-bench measures it.

pp N: one N-token prompt decoded as a batch from an empty cache. tg N: N single-token decodes
one after another. Each test runs once as a warm-up, then `repetitions` times; tokens/s is
reported as mean ± standard deviation over the repetitions. Tokens are random ids, as in
llama-bench, since the content does not change the work.
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


def _prompt(engine, ids: np.ndarray) -> None:
    engine.reset()
    for start in range(0, len(ids), engine.batch_size):
        engine.decode_tokens(ids[start:start + engine.batch_size], start)


def _generate(engine, first: int, n: int) -> None:
    engine.reset()
    token = first
    for pos in range(n):
        engine.decode_tokens([token], pos)


def run_bench(engine, n_prompt: int = 512, n_gen: int = 128, repetitions: int = 5,
              seed: int = 0) -> list[BenchResult]:
    """Runs pp{n_prompt} (if > 0) and tg{n_gen} (if > 0) on an Engine."""
    if n_prompt + 1 > engine.info.n_ctx or n_gen + 1 > engine.info.n_ctx:
        raise ValueError(f"the tests need a context of at least {max(n_prompt, n_gen) + 1} "
                         f"tokens; the engine has {engine.info.n_ctx}")
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, engine.info.n_vocab, max(n_prompt, 1)).tolist()
    results = []
    tests = [(f"pp{n_prompt}", n_prompt, lambda: _prompt(engine, ids))] if n_prompt > 0 else []
    if n_gen > 0:
        tests.append((f"tg{n_gen}", n_gen, lambda: _generate(engine, ids[0], n_gen)))
    for name, n, fn in tests:
        fn()  # warm-up
        samples = []
        for _ in range(repetitions):
            t0 = time.perf_counter()
            fn()
            samples.append(n / (time.perf_counter() - t0))
        results.append(BenchResult(name, n, samples))
    engine.reset()
    return results
