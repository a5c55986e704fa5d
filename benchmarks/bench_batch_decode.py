"""Benchmark one decode step of n tokens from n different sequences, as the scheduler runs it.

A Model loaded with n_seq_max = n decodes `Batch(tokens, pos=[p] * n, seq_ids=range(n),
logits=True)`: every generating slot's next token in one batch. Each sequence first gets a
PROMPT-token prompt, so attention has a context to look at. Printed per model and n: wall ms per
step and tokens/s, the process CPU time per step (all threads; with other processes on the cores
it says what the step itself costs far more steadily than the wall time), and each n's step time
over the time of a step of 1 token, by wall and by CPU time (medians over steps, then rounds).

With --base PKG (the `.pkg` folder of another checkout, e.g. a copy of main's code) each round
runs both the code under test and the base in fresh subprocesses, alternately, so before and after
are measured in the same run under the same load; the load average is printed with the results
(the machine's cores are shared: ratios within a run matter more than absolute figures).

    python benchmarks/bench_batch_decode.py [--threads 1 2] [--n 1 2 4 8 16] [--rounds 3]
        [--base /tmp/bd-base/.pkg] [--model PATH ...]
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import platformdirs

STORE = pathlib.Path(platformdirs.user_cache_dir("llamatui")) / "test-models"
MODELS = [STORE / "SmolLM2-135M-Instruct.Q4_1.gguf", STORE / "gemma-3-270m-q4_k_m.gguf"]
PROMPT = 64  # context tokens per sequence before the timed steps
STEPS = 12  # timed steps per (model, n); the median is reported


def step_times(path: str, n: int, threads: int) -> tuple[list[float], list[float]]:
    """Wall and process CPU seconds of each of STEPS decode steps of n tokens, one per
    sequence."""
    import numba

    from llamatui.inference.model import Batch, Model
    numba.set_num_threads(threads)
    model = Model.load(path, n_ctx=n * (PROMPT + STEPS + 2) + 16, n_seq_max=n)
    try:
        rng = np.random.default_rng(n)
        vocab = model.n_vocab
        for s in range(n):
            model.decode(Batch(rng.integers(0, vocab, PROMPT), pos=0, seq_ids=s))
        walls, cpus = [], []
        for i in range(STEPS + 1):
            batch = Batch(rng.integers(0, vocab, n), pos=[PROMPT + i] * n,
                          seq_ids=list(range(n)), logits=True)
            c0 = time.process_time()
            t0 = time.perf_counter()
            model.decode(batch)
            if i:  # the first step warms caches (and compiles, on a cold numba cache)
                walls.append(time.perf_counter() - t0)
                cpus.append(time.process_time() - c0)
        return walls, cpus
    finally:
        model.close()


def worker(args) -> None:
    """Measures every (model, n) at one thread count; prints JSON
    {model: {n: [median wall s, median CPU s]}}."""
    res = {}
    for path in args.model:
        res[path] = {n: [float(np.median(t)) for t in step_times(path, n, args.worker)]
                     for n in args.n}
    print(json.dumps(res))


def run_worker(pkg: str, args, threads: int) -> dict:
    env = dict(os.environ, PYTHONPATH=pkg)
    cmd = [sys.executable, __file__, "--worker", str(threads), "--n", *map(str, args.n),
           "--model", *args.model]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def report(label: str, runs: list[dict], args) -> dict:
    """Prints one table per model; returns {model: {n: (median wall s, median CPU s)}}."""
    med = {}
    for path in args.model:
        med[path] = {n: tuple(np.median([r[path][str(n)] for r in runs], axis=0))
                     for n in args.n}
        print(f"  {label:6} {pathlib.Path(path).name}")
        one_wall, one_cpu = med[path][args.n[0]]
        for n in args.n:
            wall, cpu = med[path][n]
            print(f"    n={n:<3} {1e3 * wall:8.2f} ms/step {n / wall:8.1f} tok/s  "
                  f"cpu {1e3 * cpu:8.2f} ms/step  step / step(n={args.n[0]}): "
                  f"wall {wall / one_wall:5.2f} cpu {cpu / one_cpu:5.2f}")
    return med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--n", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--base", help="the .pkg folder of the code to compare against")
    ap.add_argument("--model", nargs="+", default=[str(m) for m in MODELS])
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    here = str(pathlib.Path(__file__).resolve().parents[1] / ".pkg")
    pkgs = {"after": os.environ.get("PYTHONPATH", here)}
    if args.base:
        pkgs = {"before": args.base, **pkgs}
    for threads in args.threads:
        runs = {label: [] for label in pkgs}
        loads = []
        for _ in range(args.rounds):
            for label, pkg in pkgs.items():
                loads.append(os.getloadavg()[0])
                runs[label].append(run_worker(pkg, args, threads))
        print(f"\nthreads {threads}, {args.rounds} rounds, load average (1 min) "
              f"{min(loads):.1f}..{max(loads):.1f}")
        meds = {label: report(label, r, args) for label, r in runs.items()}
        if "before" in meds:
            for path in args.model:
                print(f"  speed-up (before / after) {pathlib.Path(path).name}:")
                for i, clock in enumerate(("wall", "cpu")):
                    ratios = "  ".join(
                        f"n={n}: {meds['before'][path][n][i] / meds['after'][path][n][i]:.2f}x"
                        for n in args.n)
                    print(f"    {clock:4} {ratios}")


if __name__ == "__main__":
    main()
