"""Where a prompt's time goes: each backend kernel's share of one N-token batch.

    python benchmarks/profile_prompt.py MODEL [-p 512] [-t 2] [-r 3]

Wraps the CPU backend's methods with timers (the matrix products, attention, norms, activations),
decodes a random N-token prompt once as a warm-up and `-r` times measured, and prints tokens/s and
each kernel's milliseconds and share. The timers cost a few microseconds a call, nothing next to
a prompt's work.
"""
from __future__ import annotations

import argparse
import collections
import time

import numpy as np

from llamatui.inference import Engine, LoadConfig
from llamatui.inference.cpu.backend import CPUBackend

# matmul_many (Q, K, V; gate and up) includes the matmul calls it makes when it cannot fuse
KERNELS = ("matmul", "matmul_many", "attention", "rms_norm", "geglu", "swiglu", "rope", "add",
           "scale", "get_rows")


def timed(totals: collections.Counter, name: str):
    method = getattr(CPUBackend, name)

    def wrapper(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            totals[name] += time.perf_counter() - t0
    return wrapper


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    args = ap.parse_args()
    totals: collections.Counter = collections.Counter()
    for name in KERNELS:
        setattr(CPUBackend, name, timed(totals, name))
    engine = Engine.load(args.model, LoadConfig(n_ctx=max(1024, args.n_prompt + 1),
                                                threads=args.threads))
    ids = np.random.default_rng(0).integers(0, engine.info.n_vocab, args.n_prompt).tolist()
    engine.reset()
    engine.decode_tokens(ids, 0)  # warm-up
    totals.clear()
    t0 = time.perf_counter()
    for _ in range(args.repetitions):
        engine.reset()
        engine.decode_tokens(ids, 0)
    per_run = (time.perf_counter() - t0) / args.repetitions
    print(f"pp{args.n_prompt}: {per_run * 1000:.1f} ms, {args.n_prompt / per_run:.1f} tok/s "
          f"({args.threads} threads)")
    for name, seconds in totals.most_common():
        ms = seconds / args.repetitions * 1000
        print(f"  {name:10s} {ms:8.1f} ms  {ms / (per_run * 1000) * 100:5.1f} %")
    rest = per_run - sum(totals.values()) / args.repetitions
    print(f"  {'other':10s} {rest * 1000:8.1f} ms  {rest / per_run * 100:5.1f} %  (Python, cache)")


if __name__ == "__main__":
    main()
