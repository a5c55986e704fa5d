"""Benchmark llamatui.inference.cpu.matmul on the starter models' real weight matrices.

For every distinct (type, shape) of 2-D weight in each model:
  decode  (n_tokens = 1):   microseconds per call and GB/s of weight bytes streamed
  prefill (n_tokens = 512): GFLOP/s (2 * n * rows * cols per call)
Wall figures are the best of repeated calls; the /cpu columns divide by the median process CPU
time instead (all threads together: per core-second), which other processes on the machine
disturb much less.
and, per model, the matmul time of one decoded token and of a 512-token prompt summed over all
its matrices (each shape weighted by how many tensors have it), as tokens/s: an upper bound for
the whole forward pass, to compare with llama.cpp's tg128 / pp512 (shared/README.md).

The LM head (output.weight or the tied token_embd) is timed for decode only: a prompt needs its
logits for the last token alone.

    python benchmarks/bench_matmul.py [--threads N] [--model PATH ...] [--quick]
"""
from __future__ import annotations

import argparse
import collections
import pathlib
import time

import numba
import numpy as np

from llamatui.inference.gguf import GGUFFile
from llamatui.inference.cpu.matmul import DECODE_MAX_TOKENS, matmul

MODELS = ["/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf", "/tmp/models/gemma-3-270m-q4_k_m.gguf"]


def best_time(fn, min_seconds: float, min_reps: int) -> tuple[float, float]:
    """(smallest wall time, median process CPU time) of repeated calls. With other processes on
    the cores the wall time suffers; CPU time (all threads) says what the kernel itself costs."""
    fn()  # warm-up (and numba compile, when the cache is cold)
    walls, cpus = [], []
    end = time.perf_counter() + min_seconds
    while len(walls) < min_reps or time.perf_counter() < end:
        c0 = time.process_time()
        t0 = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return min(walls), float(np.median(cpus))


def bench_model(path: str, n_prefill: int, seconds: float) -> None:
    with GGUFFile.open(path) as f:
        mats = collections.OrderedDict()
        for t in f.tensors.values():
            if len(t.shape) != 2:
                continue
            if t.name == "token_embd.weight" and "output.weight" in f.tensors:
                continue  # an embedding table only, not a matmul
            head = t.name in ("output.weight", "token_embd.weight")
            mats.setdefault((t.type, t.shape, head), []).append(t)
        print(f"\n{pathlib.Path(path).name}  (numba threads: {numba.get_num_threads()})")
        print(f"{'type':6} {'rows x cols':>15} {'count':>5} {'MB':>7} | {'decode us':>9} {'GB/s':>6} "
              f"{'GB/s/cpu':>8} | {'prefill ms':>10} {'GFLOP/s':>8} {'/cpu':>6}")
        rng = np.random.default_rng(0)
        tok_decode = tok_prefill = 0.0
        for (type_name, (rows, cols), head), tensors in mats.items():
            w = tensors[0].rows
            x1 = rng.standard_normal((1, cols)).astype(np.float32)
            t1, c1 = best_time(lambda: matmul(type_name, w, x1), seconds, 5)
            tok_decode += t1 * len(tensors)
            line = (f"{type_name:6} {rows:>7} x {cols:<6} {len(tensors):>5} {w.nbytes / 1e6:>7.2f} | "
                    f"{t1 * 1e6:>9.0f} {w.nbytes / t1 / 1e9:>6.1f} {w.nbytes / c1 / 1e9:>8.1f} | ")
            if head:
                line += "(LM head: decode only)"
            else:
                xp = rng.standard_normal((n_prefill, cols)).astype(np.float32)
                tp, cp = best_time(lambda: matmul(type_name, w, xp), seconds, 2)
                tok_prefill += tp * len(tensors)
                flops = 2 * n_prefill * rows * cols
                line += f"{tp * 1e3:>10.2f} {flops / tp / 1e9:>8.1f} {flops / cp / 1e9:>6.1f}"
            print(line, flush=True)
        print(f"all matmuls of one decoded token: {tok_decode * 1e3:.2f} ms = {1 / tok_decode:.0f} tok/s; "
              f"of a {n_prefill}-token prompt (without LM head): {tok_prefill * 1e3:.0f} ms = "
              f"{n_prefill / tok_prefill:.0f} tok/s")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=None, help="numba threads (default: numba's)")
    ap.add_argument("--model", action="append", help="GGUF file(s) (default: the starter models)")
    ap.add_argument("--prefill", type=int, default=512, help="prompt length for the prefill column")
    ap.add_argument("--quick", action="store_true", help="shorter timing loops")
    args = ap.parse_args()
    if args.threads:
        numba.set_num_threads(args.threads)
    print(f"decode path for n_tokens <= {DECODE_MAX_TOKENS}; times are the best of repeated calls")
    for path in args.model or MODELS:
        bench_model(path, args.prefill, 0.1 if args.quick else 0.4)


if __name__ == "__main__":
    main()
