"""The packed 8-bit kernels (inference/matmul_packed.py) against the paths they replace, on the
starter models' real matrices, for 1, 8 and 512 tokens (a decode step of one sequence, of eight,
a prompt).

    python benchmarks/bench_packed.py [--threads 2] [--model PATH ...]

For each distinct packable (type, shape): the best wall time of `matmul` without the packed copy
(one token: the row-at-a-time 8-bit kernel where the CPU has VNNI, else float32; 2-16 tokens:
the float32 batch tiles; more: the bfloat16 or float32 prompt path) and with it, and their
ratio; then the sum over the model's matrices (each shape weighted by its count).
"""
from __future__ import annotations

import argparse
import collections
import pathlib
import time

import numba
import numpy as np

from llamatui.inference.gguf import GGUFFile
from llamatui.inference.cpu.matmul import matmul, packed_weight

TOKENS = (1, 8, 512)


def best(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench_model(path: str) -> None:
    with GGUFFile.open(path) as f:
        shapes = collections.Counter()
        first = {}
        for t in f.tensors.values():
            if len(t.shape) == 2 and packed_weight(t.type, t.rows) is not None:
                key = (t.type, tuple(t.shape))
                shapes[key] += 1
                first.setdefault(key, t)
        print(f"\n{pathlib.Path(path).name} (numba threads: {numba.get_num_threads()}): "
              f"ms without / with the packed kernels")
        print(f"{'type':5} {'rows x cols':>14} {'count':>5} | " +
              " | ".join(f"{n:>3} tokens: {'plain':>7} {'packed':>7} {'ratio':>5}" for n in TOKENS))
        rng = np.random.default_rng(0)
        total = {n: [0.0, 0.0] for n in TOKENS}
        for (type_name, (rows, cols)), count in shapes.items():
            w = first[(type_name, (rows, cols))].rows
            packed = packed_weight(type_name, w)
            line = f"{type_name:5} {rows:>6} x {cols:<6} {count:>5} | "
            cells = []
            for n in TOKENS:
                x = rng.standard_normal((n, cols)).astype(np.float32)
                reps = 3 if n * rows * cols > 1e9 else 20
                plain = best(lambda: matmul(type_name, w, x), reps)
                fast = best(lambda: matmul(type_name, w, x, packed=packed), reps)
                total[n][0] += plain * count
                total[n][1] += fast * count
                cells.append(f"{'':>10} {plain * 1e3:>7.3f} {fast * 1e3:>7.3f} {plain / fast:>5.2f}")
            print(line + " | ".join(cells), flush=True)
        print("all packable matrices: " + ", ".join(
            f"{n} tokens {p * 1e3:.2f} / {q * 1e3:.2f} ms = {p / q:.2f}x"
            for n, (p, q) in total.items()))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--model", action="append", help="GGUF file(s) (default: the starter models)")
    args = ap.parse_args()
    if args.threads:
        numba.set_num_threads(args.threads)
    paths = args.model
    if not paths:
        import sys
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
        from conftest import _starter
        paths = [str(_starter("smollm2-135m")), str(_starter("gemma3-270m"))]
    for path in paths:
        bench_model(path)


if __name__ == "__main__":
    main()
