"""`llamatui bench -m MODEL -p 512 -n 128 [-d 4096] [-ngl N] -t 2 -r 3 [-o json]`: llama-bench's
tests and table. As llama-bench, the table has an `ngl` column when layers run on a GPU (or -ngl
is given) and a `threads` column when the CPU runs them (or -t is given)."""
import json
import os

from llamatui.inference import LoadConfig, run_bench

from . import UsageError
from .engine_args import load_engine
from .flags import add_cache_types, add_offload, add_threads, int_at_least, offload_options


def add_arguments(p):
    """llama-bench's flags, one value each."""
    p.add_argument("-m", "--model", required=True, help="GGUF file, or a model name in the store")
    for flag, long, default, what in (
            ("-p", "--n-prompt", 512, "prompt tokens (the pp test; 0 = none)"),
            ("-n", "--n-gen", 128, "generated tokens (the tg test; 0 = none)"),
            ("-d", "--n-depth", 0, "tokens already in the cache when each test starts")):
        p.add_argument(flag, long, type=int_at_least(0, "cannot be negative"), default=default,
                       metavar="N", help=f"{what} (default: {default})")
    add_threads(p)
    add_offload(p)
    p.add_argument("-r", "--repetitions", type=int_at_least(1), default=5, metavar="N",
                   help="number of times to repeat each test (default: 5)")
    add_cache_types(p)
    p.add_argument("-o", "--output", choices=("md", "json"), default="md",
                   help="output format printed to stdout (default: md)")


def run(args):
    if args.n_prompt == args.n_gen == 0:
        raise UsageError("-p and -n are both 0: there is no test to run")
    # llama-bench's context: just big enough for the tests
    config = LoadConfig(n_ctx=args.n_depth + max(args.n_prompt, args.n_gen) + 1,
                        threads=args.threads, cache_type_k=args.cache_type_k,
                        cache_type_v=args.cache_type_v, offload=offload_options(args))
    engine = load_engine(args, config)
    try:
        results = run_bench(engine, args.n_prompt, args.n_gen, args.repetitions,
                            n_depth=args.n_depth)
        info = engine.info
        backend = "CUDA" if info.n_gpu_layers else "CPU"
        ngl = info.n_gpu_layers if args.n_gpu_layers in (None, "auto") else args.n_gpu_layers
        if args.output == "json":
            print(json.dumps([{
                "model_filename": info.path, "model_type": f"{info.architecture} "
                f"{info.quantization}", "model_size": info.file_bytes,
                "model_n_params": info.n_params, "backends": backend,
                "n_gpu_layers": info.n_gpu_layers, "n_threads": engine.threads,
                "type_k": info.cache_type_k, "type_v": info.cache_type_v,
                "n_prompt": r.n_tokens if r.test.startswith("pp") else 0,
                "n_gen": r.n_tokens if r.test.startswith("tg") else 0, "n_depth": args.n_depth,
                "avg_ts": r.avg_ts, "stddev_ts": r.stddev_ts, "samples_ts": r.samples_ts,
            } for r in results], indent=1))
            return 0
        model = f"{info.architecture} {_size_label(info.n_params)} {info.quantization}"
        columns = [("model", 30, "<"), ("size", 10, ">"), ("params", 10, ">"),
                   ("backend", 10, "<")]
        if backend != "CPU" or args.n_gpu_layers is not None:
            columns.append(("ngl", 3, ">"))
        if backend == "CPU" or args.threads is not None:
            columns.append(("threads", 7, ">"))
        columns += [("test", 15, ">"), ("t/s", 20, ">")]
        print("| " + " | ".join(f"{name:{align}{width}s}" for name, width, align in columns)
              + " |")
        print("| " + " | ".join(("-" * width if align == "<" else "-" * (width - 1) + ":")
                                for _, width, align in columns) + " |")
        for r in results:
            values = {"model": model, "size": f"{info.file_bytes / 2**20:6.2f} MiB",
                      "params": f"{info.n_params / 1e6:8.2f} M", "backend": backend,
                      "ngl": str(ngl), "threads": str(engine.threads), "test": r.test,
                      "t/s": f"{r.avg_ts:12.2f} ± {r.stddev_ts:5.2f}"}
            print("| " + " | ".join(f"{values[name]:{align}{width}s}"
                                    for name, width, align in columns) + " |")
        if info.gpu_note and args.n_gpu_layers not in (None, 0):
            print(f"\n{info.gpu_note}")
        print(f"\nllamatui, {os.path.basename(info.path)}")
    finally:
        engine.close()


def _size_label(n_params: int) -> str:
    return f"{n_params / 1e9:.1f}B" if n_params >= 1e9 else f"{n_params / 1e6:.0f}M"
