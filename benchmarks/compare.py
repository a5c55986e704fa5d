"""llamatui against its peers, measured in one run on this machine.

    python benchmarks/compare.py [-t 2] [-r 3] [--models smollm2-135m gemma3-270m]
                                 [--llama-bench PATH] [--transformers-python VENV/bin/python]

For each model (a starter, or one of bench_archs.py's synthetic shapes such as qwen2.5-0.5b):
llama-bench's pp512 and tg128 for llamatui, and for llama.cpp (its own llama-bench when one is
found: --llama-bench, $LLAMA_BENCH or on PATH; else llama-cpp-python) and Hugging Face
transformers (PyTorch CPU, loading the same GGUF) when they are installed; decoding with 3000
tokens already in the cache (tg64 @ d3000, llamatui, and llama.cpp through llama-cpp-python);
then llamatui's time to first token from a cold process with a warm kernel cache
(`llamatui run -n 1`: process start, load, an 8-token prompt, first token) and its peak RSS while
generating 128 tokens. Ratios are llamatui / peer: above 1 means llamatui is faster.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time


sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
DEFAULT_LLAMA_BENCH = os.environ.get("LLAMA_BENCH") or shutil.which("llama-bench")


def ours(path, threads, reps):
    out = subprocess.run([sys.executable, "-m", "llamatui.app.cli", "bench", "-m", str(path),
                          "-p", "512", "-n", "128", "-t", str(threads), "-r", str(reps),
                          "-o", "json"], capture_output=True, text=True, check=True).stdout
    return {("pp512" if r["n_prompt"] else "tg128"): r["avg_ts"] for r in json.loads(out)}


def llama_bench(binary, path, threads, reps):
    """llama-bench's pp512 and tg128 (its mean t/s over `reps`) on the file: ({test: t/s}, None)
    or (None, why not)."""
    proc = subprocess.run([binary, "-m", str(path), "-p", "512", "-n", "128", "-t", str(threads),
                           "-r", str(reps), "-o", "json"],
                          capture_output=True, text=True, check=False)
    if proc.returncode:
        return None, proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"
    res = {}
    for row in json.loads(proc.stdout):
        if (row["n_prompt"], row["n_gen"]) == (512, 0):
            res["pp512"] = row["avg_ts"]
        elif (row["n_prompt"], row["n_gen"]) == (0, 128):
            res["tg128"] = row["avg_ts"]
    return res, None


DEPTH, DEPTH_GEN = 3000, 64


def ours_at_depth(path, threads, reps):
    out = subprocess.run([sys.executable, "-m", "llamatui.app.cli", "bench", "-m", str(path),
                          "-p", "0", "-n", str(DEPTH_GEN), "-d", str(DEPTH), "-t", str(threads),
                          "-r", str(reps), "-o", "json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)[0]["avg_ts"]


# llama.cpp decoding with DEPTH tokens already in its cache (filled before the clock starts)
LLAMA_CPP_DEPTH_PROBE = r"""
import json, sys, time, numpy as np
from llama_cpp import Llama
path, threads, reps, depth, n_gen = sys.argv[1], *map(int, sys.argv[2:6])
llm = Llama(path, n_ctx=depth + n_gen + 1, n_batch=512, n_ubatch=512, n_threads=threads,
            n_threads_batch=threads, verbose=False)
ids = np.random.default_rng(0).integers(0, llm.n_vocab(), depth + n_gen).tolist()
ts = []
for rep in range(reps + 1):  # the first is the warm-up
    llm.reset()
    llm.eval(ids[:depth])
    t0 = time.perf_counter()
    for t in ids[depth:]:
        llm.eval([t])
    if rep:
        ts.append(n_gen / (time.perf_counter() - t0))
print(json.dumps(sum(ts) / len(ts)))
"""


def llama_cpp_at_depth(path, threads, reps):
    try:
        __import__("llama_cpp")
    except ImportError:
        return None
    proc = subprocess.run([sys.executable, "-c", LLAMA_CPP_DEPTH_PROBE, str(path), str(threads),
                           str(reps), str(DEPTH), str(DEPTH_GEN)], capture_output=True, text=True)
    return json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None


# Each probe defines pp() and tg(); this timing (warm-up, then mean tokens/s) follows it.
TIMING = r"""
res = {}
for name, fn, n in (("pp512", pp, 512), ("tg128", tg, 128)):
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter(); fn(); ts.append(n / (time.perf_counter() - t0))
    res[name] = sum(ts) / len(ts)
print(json.dumps(res))
"""

LLAMA_CPP_PROBE = r"""
import json, sys, time, numpy as np
from llama_cpp import Llama
path, threads, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = Llama(path, n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=threads,
            n_threads_batch=threads, verbose=False)
ids = np.random.default_rng(0).integers(0, llm.n_vocab(), 512).tolist()
def pp():
    llm.reset()  # eval() drops cache cells past n_tokens before decoding
    llm.eval(ids)
def tg():
    llm.reset()  # eval() drops cache cells past n_tokens before decoding
    for t in ids[:128]:
        llm.eval([t])
"""

TRANSFORMERS_PROBE = r"""
import json, os, sys, time, torch
from transformers import AutoModelForCausalLM
path, threads, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path),
                                             gguf_file=os.path.basename(path),
                                             dtype=torch.float32)
ids = torch.randint(0, model.config.vocab_size, (1, 512))
@torch.no_grad()
def pp():
    model(ids, use_cache=False)
@torch.no_grad()
def tg():
    past = None
    for i in range(128):
        out = model(ids[:, i:i + 1], past_key_values=past, use_cache=True)
        past = out.past_key_values
"""


def peer(probe, module, path, threads, reps, python=sys.executable):
    if subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode:
        return None, f"{module} not installed"
    proc = subprocess.run([python, "-c", probe + TIMING, str(path), str(threads), str(reps)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return None, proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"
    return json.loads(proc.stdout.strip().splitlines()[-1]), None


RSS_PROBE = r"""
import resource, subprocess, sys
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
"""


def start_and_memory(path, threads):
    run = [sys.executable, "-m", "llamatui.app.cli", "run", "-m", str(path), "-t", str(threads),
           "--temp", "0", "-p", "The capital of France is a city in"]
    subprocess.run(run + ["-n", "1"], capture_output=True, check=True)  # warms the kernel cache
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run(run + ["-n", "1"], capture_output=True, check=True)
        times.append(time.perf_counter() - t0)
    rss = int(subprocess.run([sys.executable, "-c", RSS_PROBE, *run, "-n", "128"],
                             capture_output=True, text=True, check=True).stdout)
    return min(times), rss


def model_path(name):
    """A starter model (pulled as `llamatui pull` does), or one of bench_archs.py's synthetic
    shapes (written once into its cache folder)."""
    import bench_archs  # here, not at the top: bench_archs imports this module
    if name in bench_archs.MODELS:
        return bench_archs.cached_model(name, bench_archs.DEFAULT_CACHE)
    from conftest import _starter
    return _starter(name)


def peers(path, args):
    """(label, {test: t/s} or None, why not) for llama.cpp and transformers."""
    if args.llama_bench:
        rows = [("llama.cpp", *llama_bench(args.llama_bench, path, args.threads,
                                           args.repetitions))]
    else:
        rows = [("llama.cpp", *peer(LLAMA_CPP_PROBE, "llama_cpp", path, args.threads,
                                    args.repetitions))]
    rows.append(("transformers", *peer(TRANSFORMERS_PROBE, "transformers", path, args.threads,
                                       args.repetitions, args.transformers_python)))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"],
                    help="starter models, or bench_archs.py's synthetic shapes")
    ap.add_argument("--llama-bench", default=DEFAULT_LLAMA_BENCH,
                    help="llama.cpp's llama-bench binary for pp512 and tg128 (default: "
                         "$LLAMA_BENCH or llama-bench on PATH; none: llama-cpp-python)")
    ap.add_argument("--transformers-python", default=sys.executable,
                    help="the Python that has torch and transformers (a separate venv keeps "
                         "their multi-GB install out of llamatui's)")
    args = ap.parse_args()

    for name in args.models:
        path = model_path(name)
        print(f"\n## {path.name} (-t {args.threads}, {args.repetitions} repetitions; "
              f"llama.cpp: {args.llama_bench or 'llama-cpp-python'})")
        mine = ours(path, args.threads, args.repetitions)
        rows = [("llamatui", mine, None), *peers(path, args)]
        print(f"| {'runtime':12s} | {'pp512 t/s':>10s} | {'tg128 t/s':>10s} | "
              f"{'pp ratio':>9s} | {'tg ratio':>9s} |")
        print(f"|{'-' * 14}|{'-' * 12}:|{'-' * 12}:|{'-' * 10}:|{'-' * 10}:|")
        for label, res, why in rows:
            if res is None:
                print(f"| {label:12s} | {'—':>10s} | {'—':>10s} | {'':>9s} | {'':>9s} |  ({why})")
                continue
            pr = "" if label == "llamatui" else f"{mine['pp512'] / res['pp512']:8.2f}x"
            tr = "" if label == "llamatui" else f"{mine['tg128'] / res['tg128']:8.2f}x"
            print(f"| {label:12s} | {res['pp512']:10.1f} | {res['tg128']:10.1f} | {pr:>9s} | "
                  f"{tr:>9s} |")
        deep, peer_deep = (ours_at_depth(path, args.threads, args.repetitions),
                           llama_cpp_at_depth(path, args.threads, args.repetitions))
        line = f"\ndecoding with {DEPTH} tokens in the cache (tg{DEPTH_GEN} @ d{DEPTH}): " \
               f"llamatui {deep:.1f} tok/s"
        if peer_deep:
            line += f", llama.cpp {peer_deep:.1f} tok/s ({deep / peer_deep:.2f}x)"
        print(line)
        ttft, rss = start_and_memory(path, args.threads)
        size = path.stat().st_size
        print(f"\nwarm start to first token (process start, load, prompt, 1 token): {ttft:.2f} s")
        print(f"peak RSS generating 128 tokens (n_ctx 4096): {rss / 2**20:.0f} MiB "
              f"(model file {size / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
