"""Peak memory of the engine against the recommender's estimate, per starter model.

    python benchmarks/bench_memory.py [--full] [--json]

Each model runs in a fresh process: Engine.load(path, LoadConfig(n_ctx=2048, threads=2)), a short
chat prompt, 4 generated tokens; peak RSS is that process's VmHWM (ru_maxrss where /proc is
missing). With --full the prompt nearly fills the context (2000 tokens), which shows the whole KV
cache and the largest compute buffers (slow on small machines: the prompt is processed at CPU
speed). The estimate is
`llamatui.models.recommend.estimate_file(path, n_ctx=2048, threads=2)`: `resident_at(n)` for the
tokens actually in the cache, `total_bytes` for a full context. A warm-up run first fills numba's
cache (`--cold` skips it: the first run after installing compiles the kernels, which peaks higher).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

PROBE = r"""
import json, resource, sys, time
import psutil
proc = psutil.Process()
def peak():
    # VmHWM: the peak of this process's own memory map. ru_maxrss is not used: after fork+exec
    # Linux keeps the forked copy's high-water mark, i.e. the parent's (a test runner's) RSS.
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
marks = {"start": proc.memory_info().rss}
from llamatui.inference import Engine, LoadConfig
marks["imports"] = proc.memory_info().rss
path, n_prompt, n_ctx, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
t0 = time.perf_counter()
engine = Engine.load(path, LoadConfig(n_ctx=n_ctx, threads=threads))
marks["loaded"] = proc.memory_info().rss
marks["loaded_peak"] = peak()
t_load = time.perf_counter() - t0
if n_prompt <= 64:
    prompt = [{"role": "user", "content": "Name three colours."}]
else:
    ids = engine.tokenize("The quick brown fox jumps over the lazy dog. " * (n_prompt // 5))
    prompt = engine.detokenize(ids[1:n_prompt])
t0 = time.perf_counter()
n_cache = 0
for ev in engine.generate(prompt, max_tokens=4, temperature=0):
    n_cache = ev.kv_used
t_gen = time.perf_counter() - t0
marks["generated"] = proc.memory_info().rss
# kernels compiled by this process (not loaded from numba's cache): LLVM's memory is in the peak
from numba.core.dispatcher import Dispatcher
compiled = 0
for name, mod in list(sys.modules.items()):
    if name.startswith("llamatui"):
        for v in list(vars(mod).values()):
            if isinstance(v, Dispatcher):
                compiled += len(v.overloads) - sum(v.stats.cache_hits.values())
print(json.dumps({"peak_rss": peak(), "marks": marks, "kv_used": n_cache, "t_load": t_load,
                  "t_gen": t_gen, "compiled": compiled}))
"""


def measure(path, n_prompt: int, n_ctx: int = 2048, threads: int = 2) -> dict:
    env = dict(os.environ, NUMBA_NUM_THREADS=str(max(threads, 1)))
    out = subprocess.run([sys.executable, "-c", PROBE, str(path), str(n_prompt), str(n_ctx),
                          str(threads)], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"probe failed for {path}:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(path, n_prompt: int, n_ctx: int = 2048, threads: int = 2, warm: bool = True
            ) -> dict:
    """Estimate against measurement. `warm`: a first short run fills numba's cache, so the
    measured run loads compiled kernels as every later run does (a run that compiles them
    peaks higher, by about `MemoryEstimate.first_run_extra_bytes`)."""
    from llamatui.models.recommend import estimate_file
    if warm:
        measure(path, 4, 256, threads)
    for _ in range(3 if warm else 1):
        m = measure(path, n_prompt, n_ctx, threads)
        if not m["compiled"]:
            break  # else the cache was refilled meanwhile (sources edited): measure again
    est = estimate_file(path, n_ctx=n_ctx, threads=threads)
    expected = est.resident_at(m["kv_used"])
    return {"model": os.path.basename(str(path)), "kv_used": m["kv_used"],
            "compiled": m["compiled"],
            "peak_rss": m["peak_rss"], "estimate_at_use": expected,
            "estimate_full_context": est.total_bytes,
            "error": expected / m["peak_rss"] - 1, "measured": m,
            "breakdown": {k: v for k, v, _ in est.breakdown()}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--full", action="store_true", help="also fill the context (slow)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--cold", action="store_true", help="no warm-up run (numba may compile)")
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from conftest import test_store  # the tests' copy of the starter models
    from llamatui.models.store import STARTER_MODELS, pull_starter
    rows = []
    for name in STARTER_MODELS:
        path = pull_starter(name, store=test_store())
        rows.append(compare(path, 16, warm=not args.cold))
        if args.full:
            rows.append(compare(path, 2000, warm=False))
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    mib = 1 / 2**20
    print(f"{'model':36s} {'kv used':>7s} {'peak RSS':>9s} {'estimate':>9s} {'error':>7s}"
          f" {'full ctx est.':>13s} {'compiled':>8s}")
    for r in rows:
        print(f"{r['model']:36s} {r['kv_used']:7d} {r['peak_rss'] * mib:8.1f}M "
              f"{r['estimate_at_use'] * mib:8.1f}M {r['error'] * 100:+6.1f}% "
              f"{r['estimate_full_context'] * mib:12.1f}M {r['compiled']:8d}")
    for r in rows[:1]:
        print("\nbreakdown for", r["model"])
        for k, v in r["breakdown"].items():
            print(f"  {k:28s} {v * mib:8.1f} MiB")


if __name__ == "__main__":
    main()
