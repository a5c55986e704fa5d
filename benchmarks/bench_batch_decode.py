"""Benchmark one decode step of n tokens from n different sequences, as the scheduler runs it.

A Model loaded with n_seq_max = n decodes `Batch(tokens, pos=[p] * n, seq_ids=range(n),
logits=True)`: every generating slot's next token in one batch. Each sequence first gets a
PROMPT-token prompt, so attention has a context to look at. Printed per model and n: wall ms per
step and tokens/s, the process CPU time per step (all threads; with other processes on the cores
it says what the step itself costs far more steadily than the wall time), and each n's step time
over the time of a step of 1 token, by wall and by CPU time (medians over all timed steps).

With --base PKG (the `.pkg` folder of another checkout, e.g. a copy of main's code) the code under
test and the base run in worker processes that take turns step by step, so before and after are
measured under the same load; with --llama-cpp so does llama.cpp (through llama-cpp-python's
low-level API: llama_decode of the same batches, n_seq_max = n, the same thread count), and the
ratios llama.cpp / ours are printed (above 1: ours is faster). The load average is printed with the
results (the machine's cores are shared: ratios within a run matter more than absolute figures).
A short pause before each step lets the other workers' idle threads stop spinning.

    python benchmarks/bench_batch_decode.py [--threads 1 2] [--n 1 2 4 8 16] [--steps 24]
        [--base /tmp/bd-base/.pkg] [--llama-cpp] [--model PATH ...]
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


def serve(engine) -> None:
    """Worker: `load PATH N` loads a model for n sequences and gives each a prompt; `step`
    decodes one token of every sequence and answers `wall cpu` in seconds. `engine(path, n)`
    returns (n_vocab, decode(tokens, positions, seq_ids, logits))."""
    n, pos, rng = 0, 0, np.random.default_rng(0)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "load":
            n, pos = int(cmd[2]), PROMPT
            n_vocab, decode = engine(cmd[1], n)
            for s in range(n):
                decode(rng.integers(0, n_vocab, PROMPT), range(PROMPT), [s] * PROMPT,
                       [False] * (PROMPT - 1) + [True])
            print("ok", flush=True)
        else:
            tokens = rng.integers(0, n_vocab, n)
            c0 = time.process_time()
            t0 = time.perf_counter()
            decode(tokens, [pos] * n, range(n), [True] * n)
            print(time.perf_counter() - t0, time.process_time() - c0, flush=True)
            pos += 1


def llamatui_engine(threads: int):
    import numba

    from llamatui.inference import LoadConfig
    from llamatui.inference.model import Batch, Model
    numba.set_num_threads(threads)
    models = []

    def load(path, n):
        if models:
            models.pop().close()
        model = Model.load(path, LoadConfig(n_ctx=n * (PROMPT + 512), n_parallel=n))
        models.append(model)
        return model.n_vocab, lambda tokens, pos, seqs, logits: model.decode(
            Batch(tokens, pos=list(pos), seq_ids=list(seqs), logits=logits))
    return load


def llama_cpp_engine(threads: int):
    import ctypes

    import llama_cpp
    quiet = llama_cpp.llama_log_callback(lambda level, text, user_data: None)
    llama_cpp.llama_log_set(quiet, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    state = {}

    def load(path, n):
        if state:
            llama_cpp.llama_batch_free(state["batch"])
            llama_cpp.llama_free(state["ctx"])
            llama_cpp.llama_model_free(state["model"])
        model = llama_cpp.llama_model_load_from_file(path.encode(),
                                                     llama_cpp.llama_model_default_params())
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n * (PROMPT + 512), 512, 512, n
        cp.n_threads = cp.n_threads_batch = threads
        ctx = llama_cpp.llama_init_from_model(model, cp)
        batch = llama_cpp.llama_batch_init(512, 0, 1)
        state.update(model=model, ctx=ctx, batch=batch, quiet=quiet)

        def decode(tokens, pos, seqs, logits):
            batch.n_tokens = len(tokens)
            for i, (t, p, s, out) in enumerate(zip(tokens, pos, seqs, logits)):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = int(t), int(p), 1
                batch.seq_id[i][0], batch.logits[i] = int(s), int(out)
            if llama_cpp.llama_decode(ctx, batch):
                raise RuntimeError("llama_decode failed")
        return llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model)), decode
    return load


class Worker:
    def __init__(self, pkg: str | None, threads: int):
        env = dict(os.environ, PYTHONPATH=pkg) if pkg else None
        engine = ["--serve-llama-cpp"] if pkg is None else ["--serve"]
        self.proc = subprocess.Popen([sys.executable, __file__, *engine, str(threads)],
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
        print(f"    {label:9} n={n:<3} {1e3 * wall:8.2f} ms/step {n / wall:8.1f} tok/s  "
              f"cpu {1e3 * cpu:8.2f} ms/step  step / step(n={ns[0]}): wall {wall / one_wall:5.2f}"
              f" cpu {cpu / one_cpu:5.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--n", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--base", help="the .pkg folder of the code to compare against")
    ap.add_argument("--llama-cpp", action="store_true", help="llama.cpp as a peer")
    ap.add_argument("--model", nargs="+", default=[str(m) for m in MODELS])
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--serve-llama-cpp", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(llamatui_engine(args.serve))
    if args.serve_llama_cpp:
        return serve(llama_cpp_engine(args.serve_llama_cpp))
    here = str(pathlib.Path(__file__).resolve().parents[1] / ".pkg")
    pkgs = {"after": os.environ.get("PYTHONPATH", here)}
    if args.base:
        pkgs = {"before": args.base, **pkgs}
    if args.llama_cpp:
        pkgs["llama.cpp"] = None
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
                for peer, title in (("before", "speed-up"), ("llama.cpp", "llama.cpp / ours")):
                    for i, clock in enumerate(("wall", "cpu") if peer in pkgs else ()):
                        ratios = "  ".join(f"n={n}: {res[n][peer][i] / res[n]['after'][i]:.2f}x"
                                           for n in args.n)
                        print(f"    {title} {clock:4} {ratios}")
        finally:
            for w in workers.values():
                w.close()


if __name__ == "__main__":
    main()
