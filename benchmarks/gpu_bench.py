"""GPU offload against the CPU, llama-bench's way, for both starter models (or their stand-ins).

    python benchmarks/gpu_bench.py OUTDIR [--models DIR] [--reps N] [--ngl 0,half,all]
                                          [--model-file NAME=PATH ...] [--only NAME ...]
                                          [--append]

For each model and each -ngl (0: the CPU alone, half: the output layer and the last half of the
layers, all) it loads the engine, runs pp512 and tg128 (inference.bench.run_bench, the numbers
`llamatui bench` prints) and the time to first token of a 128-token prompt from an empty cache
(the prompt's decode and the first token's greedy pick), and records the CUDA graph counts.
Writes OUTDIR/gpu_bench.json and OUTDIR/gpu_bench.md and prints the table, with each row's
speed-up over -ngl 0 (measured in the same run). Models: the starter models from --models DIR
when there, else stand-ins with their shapes and types (gpu_models.py), and any --model-file
(gpu_check.sh adds Qwen2.5-0.5B's shape that way); --only keeps the named ones. --append adds
the rows to OUTDIR/gpu_bench.json's instead of starting afresh (gpu_check.sh measures -ngl all
while llama.cpp builds, and the rows that load the CPU once the build has left the cores).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from gpu_models import STARTERS, write_stand_in  # noqa: E402 -- the benchmarks folder

PROMPT_TTFT = 128


def model_paths(models_dir, scratch) -> dict[str, pathlib.Path]:
    """The starter models when --models has them, else their stand-ins."""
    from llamatui.models.store import STARTER_MODELS
    paths = {}
    for name in STARTERS:
        real = pathlib.Path(models_dir or "/nonexistent") / STARTER_MODELS[name].filename
        paths[name] = real if real.is_file() else write_stand_in(name, scratch)
    return paths


def resolve_ngl(spec: str, n_layer: int) -> int:
    return {"half": n_layer // 2 + 1, "all": n_layer + 1}.get(spec, None) or int(spec)


def time_to_first_token(engine, reps: int) -> float:
    rng = np.random.default_rng(1)
    times = []
    for _ in range(reps + 1):
        ids = rng.integers(0, engine.info.n_vocab, PROMPT_TTFT).tolist()
        engine.reset()
        t0 = time.perf_counter()
        logits = engine.decode_tokens(ids, 0)
        int(np.argmax(logits))
        times.append(time.perf_counter() - t0)
    return float(np.median(times[1:]))


def bench_one(path, ngl: int, reps: int) -> dict:
    from llamatui.inference import Engine, LoadConfig, OffloadOptions
    from llamatui.inference.bench import run_bench
    t0 = time.perf_counter()
    engine = Engine.load(path, LoadConfig(n_ctx=1024, offload=OffloadOptions(n_gpu_layers=ngl)))
    load_s = time.perf_counter() - t0
    try:
        results = {r.test: r for r in run_bench(engine, 512, 128, reps)}
        ttft = time_to_first_token(engine, reps)
        graphs = engine.model._graphs
        info = engine.info
        return {"ngl": ngl, "n_gpu_layers": info.n_gpu_layers, "vram_mib": info.vram_bytes >> 20,
                "gpu_note": info.gpu_note, "load_s": round(load_s, 2),
                "pp512": results["pp512"].avg_ts, "pp512_sd": results["pp512"].stddev_ts,
                "tg128": results["tg128"].avg_ts, "tg128_sd": results["tg128"].stddev_ts,
                "ttft_ms": ttft * 1e3,
                "graph_replays": graphs.replays if graphs else 0,
                "graph_failures": graphs.failures[:3] if graphs else []}
    finally:
        engine.close()


def table(rows) -> str:
    lines = ["| model | ngl | on GPU | VRAM MiB | pp512 t/s | tg128 t/s | TTFT ms | "
             "pp vs CPU | tg vs CPU |", "|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        cpu = next((c for c in rows if c["model"] == r["model"] and c["ngl"] == 0), None)
        pp = f"{r['pp512'] / cpu['pp512']:.1f}x" if cpu else "-"
        tg = f"{r['tg128'] / cpu['tg128']:.1f}x" if cpu else "-"
        lines.append(f"| {r['title']} | {r['ngl']} | {r['n_gpu_layers']} | {r['vram_mib']} | "
                     f"{r['pp512']:.0f} | {r['tg128']:.0f} | {r['ttft_ms']:.1f} | {pp} | {tg} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir")
    p.add_argument("--models", default=None, help="a folder holding the starter models")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--ngl", default="0,half,all", help="comma-separated -ngl values")
    p.add_argument("--model-file", action="append", default=[], metavar="NAME=PATH",
                   help="another model to measure (repeatable)")
    p.add_argument("--only", nargs="+", default=None, metavar="NAME", help="these models only")
    p.add_argument("--append", action="store_true",
                   help="add to OUTDIR/gpu_bench.json's rows instead of replacing them")
    args = p.parse_args(argv)
    from llamatui.inference.catalog import get_arch
    from llamatui.inference.cuda import probe
    from llamatui.inference.gguf import GGUFFile
    from llamatui.inference.hparams import read_hparams
    found = probe()
    print(found.describe(), flush=True)
    out = pathlib.Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    saved = out / "gpu_bench.json"
    rows = json.loads(saved.read_text()) if args.append and saved.is_file() else []
    paths = model_paths(args.models, out / "models")
    for spec in args.model_file:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            p.error(f"--model-file {spec!r}: expected NAME=PATH")
        paths[name] = pathlib.Path(path)
    for name, path in paths.items():
        if args.only and name not in args.only:
            continue
        with GGUFFile.open(path) as g:
            n_layer = read_hparams(g, get_arch(g.metadata["general.architecture"])).n_layer
        title = STARTERS.get(name, name) + ("" if "stand-in" not in path.name else " (stand-in)")
        for spec in args.ngl.split(","):
            row = {"model": name, "title": title, **bench_one(path, resolve_ngl(spec, n_layer),
                                                              args.reps)}
            row["file"] = str(path)
            rows.append(row)
            print(json.dumps(row), flush=True)
            saved.write_text(json.dumps(rows, indent=1))
    text = table(rows)
    (out / "gpu_bench.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
