"""Where a prompt's (or a decode step's) time goes: each backend kernel's share.

    python benchmarks/profile_prompt.py MODEL [-p 512] [-t 2] [-r 3] [--decode 32]

Wraps the CPU backend's methods with timers (the matrix products, attention, norms, activations,
the recurrent layers' kernels), decodes a random N-token prompt once as a warm-up and `-r` times
measured, and prints tokens/s and each kernel's milliseconds and share. With --decode N it times
N one-token steps after the prompt instead. The timers cost a few microseconds a call: next to a
prompt's work nothing, next to a small model's decode step a little ("other" includes them).
"""
from __future__ import annotations

import argparse
import collections
import time

import numpy as np

from llamatui.inference import Engine, LoadConfig
from llamatui.inference.cpu.backend import CPUBackend

# every computing method of the backend; matmul_many (Q, K, V; gate and up) includes the matmul
# calls it makes when it cannot fuse (they are not counted again under matmul)
NOT_KERNELS = {"weight", "experts", "vector", "kv_store", "take", "to_host"}
KERNELS = tuple(name for name, value in vars(CPUBackend).items()
                if callable(value) and not name.startswith("_") and name not in NOT_KERNELS)


_DEPTH = [0]  # a kernel called by another (matmul inside matmul_many) counts for the caller


def timed(totals: collections.Counter, name: str):
    method = getattr(CPUBackend, name)

    def wrapper(self, *args, **kwargs):
        t0 = time.perf_counter()
        _DEPTH[0] += 1
        try:
            return method(self, *args, **kwargs)
        finally:
            _DEPTH[0] -= 1
            if not _DEPTH[0]:
                totals[name] += time.perf_counter() - t0
    return wrapper


def time_prompt(engine, prompt, steps, totals) -> float:
    """Seconds to decode `prompt` as one batch."""
    engine.reset()
    t0 = time.perf_counter()
    engine.decode_tokens(prompt, 0)
    return time.perf_counter() - t0


def time_steps(engine, prompt, steps, totals) -> float:
    """Seconds of `steps` one-token decodes after `prompt` (the prompt is neither timed nor
    left in the kernels' totals)."""
    engine.reset()
    before = collections.Counter(totals)
    engine.decode_tokens(prompt, 0)
    totals.subtract(totals - before)
    t0 = time.perf_counter()
    for i, token in enumerate(steps):
        engine.decode_tokens([token], len(prompt) + i)
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--decode", type=int, default=0, metavar="N",
                    help="time N one-token steps after the prompt instead of the prompt")
    args = ap.parse_args()
    totals: collections.Counter = collections.Counter()
    for name in KERNELS:
        setattr(CPUBackend, name, timed(totals, name))
    engine = Engine.load(args.model, LoadConfig(n_ctx=max(1024, args.n_prompt + args.decode + 1),
                                                threads=args.threads))
    ids = np.random.default_rng(0).integers(0, engine.info.n_vocab,
                                            args.n_prompt + args.decode).tolist()
    prompt, steps = ids[:args.n_prompt], ids[args.n_prompt:]
    measure = time_steps if steps else time_prompt
    measure(engine, prompt, steps[:2], totals)  # warm-up: every kernel compiled and loaded
    totals.clear()
    per_run = sum(measure(engine, prompt, steps, totals) for _ in range(args.repetitions)) \
        / args.repetitions
    n = len(steps) or args.n_prompt
    what = f"tg{len(steps)} after pp{args.n_prompt}" if steps else f"pp{args.n_prompt}"
    print(f"{what}: {per_run * 1000:.1f} ms, {n / per_run:.1f} tok/s ({args.threads} threads)")
    for name, seconds in totals.most_common():
        ms = seconds / args.repetitions * 1000
        print(f"  {name:10s} {ms:8.1f} ms  {ms / (per_run * 1000) * 100:5.1f} %")
    rest = per_run - sum(totals.values()) / args.repetitions
    print(f"  {'other':10s} {rest * 1000:8.1f} ms  {rest / per_run * 100:5.1f} %  (Python, cache)")


if __name__ == "__main__":
    main()
