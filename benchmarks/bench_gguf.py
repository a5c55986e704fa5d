"""GGUF open cost and dequantization throughput, against gguf-py in the same run.

    python benchmarks/bench_gguf.py

Open: each model is opened in a fresh process, after numba's one-time start-up (paid by any
numba kernel, once per process) has been triggered on a tiny file; reported: wall time and RSS
growth of GGUFFile.open before any tensor is touched, and of the first open in a process.
Dequantization: MB/s of quantized input for 4M elements of random blocks per type.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

OPEN_PROBE = r"""
import json, os, sys, time, tempfile, psutil, numpy as np
from llamatui.inference.gguf import GGUFFile, GGUFWriter
proc = psutil.Process()
tiny = os.path.join(tempfile.mkdtemp(), "tiny.gguf")
w = GGUFWriter(tiny); w.add("names", ["a", "b"]); w.add_tensor("t", "F32", (4,), np.zeros(4, np.float32)); w.write()
warm = sys.argv[2] == "warm"
if warm:
    GGUFFile.open(tiny).close()
rss0 = proc.memory_info().rss
t0 = time.perf_counter()
f = GGUFFile.open(sys.argv[1])
t1 = time.perf_counter()
rss1 = proc.memory_info().rss
print(json.dumps({"seconds": t1 - t0, "rss_growth": rss1 - rss0, "tensors": len(f.tensors)}))
"""


def open_cost(path, mode):
    runs = []
    for _ in range(5):
        out = subprocess.run([sys.executable, "-c", OPEN_PROBE, str(path), mode],
                             capture_output=True, text=True, check=True).stdout
        runs.append(json.loads(out))
    best = min(runs, key=lambda r: r["seconds"])
    return best["seconds"], max(r["rss_growth"] for r in runs)


def dequant_table():
    from gguf.quants import dequantize as ref_dequantize
    from gguf.constants import GGMLQuantizationType
    from llamatui.inference.quants import SUPPORTED_TYPES, dequantize, get_quant_type

    # Real data: the golden rows (Gemma 3 weights and edge cases) as ggml quantized them, tiled
    # to 4M elements; F32 from the same rows.
    golden = np.load(os.path.join(os.path.dirname(__file__), "..", "tests", "golden",
                                  "quant_vectors.npz"))
    print(f"\n{'type':8s} {'llamatui MB/s':>14s} {'gguf-py MB/s':>13s} {'ratio':>8s}")
    for name in SUPPORTED_TYPES:
        qt = get_quant_type(name)
        rows = golden["x"].view(np.uint8) if name == "F32" else golden.get(name)
        if rows is None:  # Q8_K has no golden rows (ggml never writes it to files)
            rng = np.random.default_rng(0)
            rows = np.zeros((34, 4096 // 256 * qt.type_size), np.uint8)
            rows.reshape(34, -1, qt.type_size)[:, :, :4] = \
                np.frombuffer(np.float32(0.01).tobytes(), np.uint8)
            rows.reshape(34, -1, qt.type_size)[:, :, 4:260] = rng.integers(0, 256, (34, 16, 256))
        raw = np.ascontiguousarray(np.tile(rows.reshape(-1), 30))
        n = raw.nbytes // qt.type_size * qt.block_size
        out = np.empty(n, np.float32)
        dequantize(name, raw, n, out=out)
        ours = min(_timed(lambda: dequantize(name, raw, n, out=out)) for _ in range(5))
        theirs = None
        if hasattr(GGMLQuantizationType, name) and name != "Q8_K":
            qtype = GGMLQuantizationType[name]
            sub = raw[: raw.size // 16]  # gguf-py is slow; time a sixteenth and scale
            theirs = _timed(lambda: ref_dequantize(sub, qtype)) * 16
        mbs = raw.nbytes / 1e6
        ref = f"{mbs / theirs:13.0f}" if theirs else f"{'n/a':>13s}"
        ratio = f"{theirs / ours:7.1f}x" if theirs else f"{'':>8s}"
        print(f"{name:8s} {mbs / ours:14.0f} {ref} {ratio}")


def _timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main():
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from conftest import _starter

    print(f"{'model':34s} {'open ms':>8s} {'RSS MB':>7s} {'1st-in-process ms':>18s} "
          f"{'RSS MB':>7s}")
    for name in ("smollm2-135m", "gemma3-270m"):
        path = _starter(name)
        warm_s, warm_rss = open_cost(path, "warm")
        cold_s, cold_rss = open_cost(path, "cold")
        print(f"{path.name:34s} {warm_s * 1e3:8.1f} {warm_rss / 2**20:7.1f} "
              f"{cold_s * 1e3:18.1f} {cold_rss / 2**20:7.1f}")
    dequant_table()


if __name__ == "__main__":
    main()
