"""The Python left in a decode step of one sequence: step time minus time in compiled kernels.

    python benchmarks/bench_decode_python.py [MODEL] [-t 2] [-n 128] [-r 3]

MODEL defaults to the SmolLM2 135M starter. Two paths are timed, each after a warm-up:
- `decode`: Engine.decode_tokens([token], pos), one step as llama-bench's tg times it;
- `generate`: Engine.generate(prompt, temperature 0) per generated token: the same step plus
  the scheduler, greedy sampling, detokenizing and the event queue, as a chat reply runs it
  (the end-of-generation tokens banned by a logit bias, so that every run makes n tokens).

Every numba kernel of the engine is timed where Python calls it (each dispatcher's class is
swapped for a subclass whose `__call__` adds up its time; kernels called from compiled code are
inside their caller's time). Python = step time - kernel time - the timer's own cost per call
(calibrated on an empty kernel), per step, best of `-r` runs. Issue 29's target: <= 0.3 ms per
decode step on SmolLM2.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import numba
import numpy as np
from numba.core.registry import CPUDispatcher

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

KERNEL_TIME = [0.0, 0]  # seconds inside kernels, calls


class TimedDispatcher(CPUDispatcher):
    """A dispatcher whose calls from Python are timed (set as an existing one's class)."""

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return CPUDispatcher.__call__(self, *args, **kwargs)
        finally:
            KERNEL_TIME[0] += time.perf_counter() - t0
            KERNEL_TIME[1] += 1


def time_kernels() -> int:
    """Every llamatui numba dispatcher in the process timed from now on; returns how many."""
    found = [obj for obj in gc.get_objects() if type(obj) is CPUDispatcher
             and obj.py_func.__module__.startswith("llamatui")]
    for dispatcher in found:
        dispatcher.__class__ = TimedDispatcher
    return len(found)


@numba.njit(cache=True, nogil=True)
def _empty(x):
    return x


def timer_cost() -> float:
    """Seconds the timing adds to one kernel call (an empty kernel, timed against untimed)."""
    x = np.zeros(1, np.float32)
    _empty(x)
    t0 = time.perf_counter()
    for _ in range(20000):
        _empty(x)
    plain = time.perf_counter() - t0
    timed = TimedDispatcher.__call__
    t0 = time.perf_counter()
    for _ in range(20000):
        timed(_empty, x)
    return max(0.0, (time.perf_counter() - t0 - plain) / 20000)


def per_step(run, n: int, reps: int, overhead: float) -> tuple[float, float, float]:
    """(step ms, kernel ms, kernel calls) per step of `run(n)`, from its least-disturbed rep."""
    best = None
    for _ in range(reps):
        KERNEL_TIME[:] = [0.0, 0]
        t0 = time.perf_counter()
        steps = run(n)
        wall = time.perf_counter() - t0
        kernels, calls = KERNEL_TIME
        row = (wall / steps * 1e3, (kernels - calls * overhead) / steps * 1e3, calls / steps)
        if best is None or row[0] - row[1] < best[0] - best[1]:
            best = row
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=128, help="steps per run")
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    args = ap.parse_args()
    from llamatui.inference import Engine, LoadConfig
    if args.model is None:
        from conftest import _starter
        args.model = _starter("smollm2-135m")
    engine = Engine.load(args.model, LoadConfig(n_ctx=4 * args.n + 64, threads=args.threads))
    first = engine.tokenize("The capital of France is")

    def decode(n):
        engine.reset()
        engine.decode_tokens(first, 0)
        for i in range(n):
            engine.decode_tokens([first[-1]], len(first) + i)
        return n

    never_end = {t: float("-inf") for t in engine.tokenizer.eog_ids}  # n tokens every run

    def generate(n):
        engine.reset()
        events = list(engine.generate("The capital of France is", temperature=0.0,
                                      max_tokens=n, logit_bias=never_end))
        return sum(1 for e in events if e.kind == "token") or 1

    decode(8)  # warm-up: every kernel compiled or loaded before timing starts
    generate(8)
    n_timed = time_kernels()
    overhead = timer_cost()
    print(f"{os.path.basename(str(args.model))}: {args.threads} threads, {n_timed} kernels "
          f"timed, timer cost {overhead * 1e6:.2f} µs per call subtracted")
    for name, run in (("decode", decode), ("generate", generate)):
        step, kernels, calls = per_step(run, args.n, args.repetitions, overhead)
        print(f"  {name:9s} {step:7.3f} ms per step: kernels {kernels:7.3f} ms ({calls:.0f} "
              f"calls), Python {step - kernels:6.3f} ms ({(step - kernels) / step:5.1%})")
    engine.close()


if __name__ == "__main__":
    main()
