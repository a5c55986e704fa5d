"""Benchmark one decode step of n tokens from n different sequences, as the scheduler runs it.

A Model loaded with n_seq_max = n decodes `Batch(tokens, pos=[p] * n, seq_ids=range(n),
logits=True)`: every generating slot's next token in one batch. Each sequence first gets a
PROMPT-token prompt, so attention has a context to look at. Printed per model and n: wall ms per
step and tokens/s, the process CPU time per step (all threads; with other processes on the cores
it says what the step itself costs far more steadily than the wall time), and each n's step time
over the time of a step of 1 token, by wall and by CPU time (medians over all timed steps).

With --base PKG (the `.pkg` folder of another checkout, e.g. a copy of main's code) the code under
test and the base run in two worker processes that take turns step by step, so before and after
are measured under the same load; the load average is printed with the results (the machine's
cores are shared: ratios within a run matter more than absolute figures). A short pause before
each step lets the other worker's idle threads stop spinning.

    python benchmarks/bench_batch_decode.py [--threads 1 2] [--n 1 2 4 8 16] [--steps 24]
        [--base /tmp/bd-base/.pkg] [--model PATH ...]
"""
from __future__ import annotations

import argparse
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
PAUSE = 0.02  # seconds before each step


def serve(threads: int) -> None:
    """Worker: `load PATH N` loads a model for n sequences and gives each a prompt; `step`
    decodes one token of every sequence and answers `wall cpu` in seconds."""
    import numba

    from llamatui.inference.model import Batch, Model
    numba.set_num_threads(threads)
    model, n, pos, rng = None, 0, 0, np.random.default_rng(0)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "load":
            if model is not None:
                model.close()
            n, pos = int(cmd[2]), PROMPT
            model = Model.load(cmd[1], n_ctx=n * (PROMPT + 512), n_seq_max=n)
            for s in range(n):
                model.decode(Batch(rng.integers(0, model.n_vocab, PROMPT), pos=0, seq_ids=s))
            print("ok", flush=True)
        else:
            batch = Batch(rng.integers(0, model.n_vocab, n), pos=[pos] * n,
                          seq_ids=list(range(n)), logits=True)
            pos += 1
            c0 = time.process_time()
            t0 = time.perf_counter()
            model.decode(batch)
            print(time.perf_counter() - t0, time.process_time() - c0, flush=True)


class Worker:
    def __init__(self, pkg: str, threads: int):
        env = dict(os.environ, PYTHONPATH=pkg)
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", str(threads)],
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)

    def ask(self, line: str) -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def measure(workers: dict, path: str, n: int, steps: int) -> dict:
    """{label: (median wall s, median CPU s)} over `steps` steps taken in turns."""
    for w in workers.values():
        assert w.ask(f"load {path} {n}").startswith("ok")
        w.ask("step")  # warm-up (and numba compile, on a cold cache)
    times = {label: [] for label in workers}
    for _ in range(steps):
        for label, w in workers.items():
            time.sleep(PAUSE)
            times[label].append([float(v) for v in w.ask("step").split()])
    return {label: tuple(np.median(t, axis=0)) for label, t in times.items()}


def report(label: str, med: dict, ns: list[int]) -> None:
    one_wall, one_cpu = med[ns[0]]
    for n in ns:
        wall, cpu = med[n]
        print(f"    {label:6} n={n:<3} {1e3 * wall:8.2f} ms/step {n / wall:8.1f} tok/s  "
              f"cpu {1e3 * cpu:8.2f} ms/step  step / step(n={ns[0]}): wall {wall / one_wall:5.2f}"
              f" cpu {cpu / one_cpu:5.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--n", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--base", help="the .pkg folder of the code to compare against")
    ap.add_argument("--model", nargs="+", default=[str(m) for m in MODELS])
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(args.serve)
    here = str(pathlib.Path(__file__).resolve().parents[1] / ".pkg")
    pkgs = {"after": os.environ.get("PYTHONPATH", here)}
    if args.base:
        pkgs = {"before": args.base, **pkgs}
    for threads in args.threads:
        workers = {label: Worker(pkg, threads) for label, pkg in pkgs.items()}
        try:
            for path in args.model:
                load = [os.getloadavg()[0]]
                res = {n: measure(workers, path, n, args.steps) for n in args.n}
                load.append(os.getloadavg()[0])
                print(f"\n{pathlib.Path(path).name}, {threads} thread(s), {args.steps} steps "
                      f"each, load average (1 min) {min(load):.1f}..{max(load):.1f}")
                for label in pkgs:
                    report(label, {n: res[n][label] for n in args.n}, args.n)
                if args.base:
                    for i, clock in enumerate(("wall", "cpu")):
                        ratios = "  ".join(f"n={n}: {res[n]['before'][i] / res[n]['after'][i]:.2f}x"
                                           for n in args.n)
                        print(f"    speed-up {clock:4} {ratios}")
        finally:
            for w in workers.values():
                w.close()


if __name__ == "__main__":
    main()
