"""Whole-model quantization time against llama-quantize, from F16 copies of the starter models.

    python benchmarks/bench_quantize.py [--threads 2] [--repeat 2]

The F16 copies are made first (not timed; kept in a temporary folder). Each conversion runs
`repeat` times in this process after one untimed warm-up conversion of a tiny model per type
(numba compiles or loads its kernels once per process, llama-quantize has no such cost), and the
best time is reported next to llama-quantize's reference time from the same F16 copies
(`LLAMA_QUANTIZE_SECONDS`: llama.cpp 0.6.0, 2 threads, on the project's 2-core machine).
When llama-cpp-python is installed, llama.cpp's own llama_model_quantize also runs on the same
F16 file in this run: its time, and whether its output file is byte-identical to ours.
"""
import argparse
import ctypes
import filecmp
import os
import sys
import tempfile
import time

import numpy as np

LLAMA_QUANTIZE_SECONDS = {  # llama.cpp 0.6.0, 2 threads
    ("smollm2-135m", "Q4_K_M"): 1.6, ("smollm2-135m", "Q8_0"): 0.9,
    ("gemma3-270m", "Q4_K_M"): 4.7, ("gemma3-270m", "Q8_0"): 2.4,
}


def warm_up(folder, types):
    """Converts a tiny model once per type so that kernel compilation/loading is not timed."""
    from llamatui.inference.gguf import GGUFValueType, GGUFWriter
    from llamatui.quantizer.model import quantize_model

    path = os.path.join(folder, "tiny.gguf")
    w = GGUFWriter(path)
    w.add("general.architecture", "llama")
    w.add("llama.block_count", 8, GGUFValueType.UINT32)
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", "F16", (64, 576),
                 rng.standard_normal((64, 576)).astype(np.float16))
    for il in range(8):
        for name, shape in (("attn_v", (64, 576)), ("ffn_down", (576, 1536)),
                            ("attn_q", (576, 576))):
            w.add_tensor(f"blk.{il}.{name}.weight", "F16", shape,
                         rng.standard_normal(shape).astype(np.float16))
    w.write()
    for t in types:
        quantize_model(path, os.path.join(folder, f"tiny-{t}.gguf"), t)


def llama_cpp_quantize(src, dst, ftype_name, threads):
    """Seconds llama.cpp's llama_model_quantize takes, or None without llama-cpp-python."""
    try:
        import llama_cpp
    except ImportError:
        return None
    from llamatui.quantizer.model import parse_ftype
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = parse_ftype(ftype_name).id
    params.nthread = threads
    t0 = time.perf_counter()
    if llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama.cpp failed to quantize {src} to {ftype_name}")
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("NUMBA_NUM_THREADS", str(args.threads))  # before numba starts

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from conftest import _starter

    from llamatui.quantizer.model import quantize_model

    types = ("Q4_K_M", "Q8_0")
    with tempfile.TemporaryDirectory() as folder:
        warm_up(folder, types)
        print(f"{'model':16s} {'type':7s} {'llamatui s':>10s} {'llama-quantize s':>16s} "
              f"{'ratio':>6s} {'BPW':>6s} {'llama.cpp now s':>15s} {'same bytes':>10s}")
        for name in ("smollm2-135m", "gemma3-270m"):
            f16 = os.path.join(folder, f"{name}-F16.gguf")
            quantize_model(_starter(name), f16, "F16", allow_requantize=True)
            for t in types:
                out = os.path.join(folder, f"{name}-{t}.gguf")
                best, result = float("inf"), None
                for _ in range(args.repeat):
                    t0 = time.perf_counter()
                    result = quantize_model(f16, out, t)
                    best = min(best, time.perf_counter() - t0)
                theirs = out + ".llama-cpp.gguf"
                now = llama_cpp_quantize(f16, theirs, t, args.threads)
                same = "" if now is None else ("yes" if filecmp.cmp(out, theirs, False) else "NO")
                for path in (out, theirs):
                    if os.path.exists(path):
                        os.unlink(path)
                ref = LLAMA_QUANTIZE_SECONDS[(name, t)]
                now_s = f"{now:15.2f}" if now is not None else f"{'(not installed)':>15s}"
                print(f"{name:16s} {t:7s} {best:10.2f} {ref:16.1f} {best / ref:6.2f} "
                      f"{result.bits_per_weight:6.2f} {now_s} {same:>10s}", flush=True)
            os.unlink(f16)


if __name__ == "__main__":
    main()
