"""CUDA kernels on a real GPU, each against a peer measured in the same run.

    python benchmarks/bench_cuda.py          (needs CuPy, numba-cuda and a GPU)

- decode matvec per weight type (4096 -> 14336, one token): GB/s of weight bytes read, and the
  ratio to a device-to-device copy's read bandwidth (the roofline a matvec can reach);
- prompt path (512 tokens): dequantize to fp16 tiles + cuBLAS, against cuBLAS alone on fp16
  weights (the ratio is the cost of dequantizing);
- decode attention (f16 and q8_0 cache, 32 heads / 8 KV heads, head 128, depth 4096): GB/s of
  KV bytes read, against the copy.
Times are CUDA-event medians of 20 runs after 3 warm-ups.
"""
import sys

import numpy as np


def timed(fn, cp, runs=20):
    for _ in range(3):
        fn()
    times = []
    for _ in range(runs):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
    return float(np.median(times))


def copy_read_gbps(cp, n_bytes):
    src = cp.zeros(n_bytes, cp.uint8)
    dst = cp.empty_like(src)
    return n_bytes / timed(lambda: dst.__setitem__(Ellipsis, src), cp) / 1e9


def main():
    from llamatui.inference.cuda import probe
    found = probe()
    if not found.available:
        sys.exit(found.describe())
    import cupy as cp

    from llamatui.inference.cuda.attention import CellMask, DeviceKV, attention
    from llamatui.inference.cuda.dequant import DEVICE_TYPES, dequantize_rows
    from llamatui.inference.cuda.matvec import matvec
    print(found.describe())
    rng = np.random.default_rng(0)
    n_in, n_out = 4096, 14336
    peer = copy_read_gbps(cp, n_out * n_in // 2)
    print(f"device copy: {peer:.0f} GB/s read")
    x = cp.asarray(rng.standard_normal((1, n_in)).astype(np.float32))
    out = cp.empty((1, n_out), cp.float32)
    x512 = cp.asarray(rng.standard_normal((512, n_in)).astype(np.float16))
    w16 = cp.asarray(rng.standard_normal((n_out, n_in)).astype(np.float16))
    cublas = timed(lambda: x512 @ w16.T, cp)
    tile = cp.empty((n_out, n_in), cp.float16)
    ids = cp.arange(n_out, dtype=cp.int64)
    print(f"{'type':8} {'matvec GB/s':>12} {'vs copy':>8} {'prompt ms':>10} {'vs cuBLAS f16':>14}")
    for name, dt in DEVICE_TYPES.items():
        w = cp.asarray(rng.integers(0, 256, (n_out, dt.row_bytes(n_in)), dtype=np.uint8))
        t = timed(lambda: matvec(name, w, x, out), cp)
        gbps = w.nbytes / t / 1e9
        prompt = timed(lambda: (dequantize_rows(name, w, ids, tile), x512 @ tile.T), cp)
        print(f"{name:8} {gbps:12.0f} {gbps / peer:8.2f} {prompt * 1e3:10.2f} "
              f"{prompt / cublas:14.2f}")
    n_kv, n_head, n_head_kv, d = 4096, 32, 8, 128
    q = cp.asarray(rng.standard_normal((1, n_head, d)).astype(np.float32))
    o = cp.empty((1, n_head, d), cp.float32)
    cell_pos = cp.arange(n_kv, dtype=cp.int32)
    cell_seq = cp.ones((n_kv, 1), cp.bool_)
    tok = cp.asarray(np.array([n_kv - 1], np.int64))
    seq = cp.zeros(1, cp.int64)
    for kv_type, row_bytes in (("f16", n_head_kv * d * 2), ("q8_0", n_head_kv * d // 32 * 34)):
        kv = cp.asarray(rng.integers(0, 60, (n_kv, row_bytes), dtype=np.uint8))
        rows = DeviceKV(kv, kv_type, n_head_kv, d)
        cells = CellMask(cell_pos, cell_seq, tok, seq)
        t = timed(lambda: attention(q, rows, rows, cells, 0.088, o), cp)
        gbps = 2 * kv.nbytes / t / 1e9
        print(f"attention {kv_type} depth {n_kv}: {t * 1e6:.0f} us, {gbps:.0f} GB/s of KV, "
              f"{gbps / peer:.2f} of copy")


if __name__ == "__main__":
    main()
