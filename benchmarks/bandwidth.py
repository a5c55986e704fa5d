"""The machine's memory read bandwidth for a number of threads: the ceiling of big-model decode.

    python benchmarks/bandwidth.py [-t 2]

Decoding one token of a big model reads every weight once (the KV cache and activations are
small beside them), and the matrix-vector products do far less arithmetic per byte than the
cores can: the decode speed of a model of B bytes is at most bandwidth / B tokens per second.
The probe measures that bandwidth as a decode sees it: `threads` threads each stream through
their own share of an array much larger than any cache, summing it with vectorisable code (the
way the quantized matvec kernels stream their rows), best of a few runs after a warm-up.
bench_archs.py reports each model's decode as a share of this figure.
"""
from __future__ import annotations

import argparse
import time

import numba
import numpy as np

ARRAY_BYTES = 1 << 30  # 1 GiB: far beyond the last-level cache of any CPU
RUNS = 5


@numba.njit(parallel=True, fastmath=True, cache=True)
def _chunk_sums(values: np.ndarray, n_chunks: int) -> np.ndarray:
    """Each of `n_chunks` threads sums its own contiguous share of `values` (fastmath lets the
    sum be reassociated, so the loop vectorises and the loads, not the adds, set its speed)."""
    sums = np.zeros(n_chunks, np.float32)
    chunk = (values.size + n_chunks - 1) // n_chunks
    for c in numba.prange(n_chunks):
        acc = np.float32(0.0)
        for i in range(c * chunk, min(values.size, (c + 1) * chunk)):
            acc += values[i]
        sums[c] = acc
    return sums


def probe(threads: int) -> float:
    """Read bandwidth in GB/s (1e9 bytes per second) of `threads` threads streaming a 1 GiB
    float32 array: the best of RUNS runs after a warm-up (which also compiles, or loads the
    cached kernel)."""
    values = np.ones(ARRAY_BYTES // 4, np.float32)  # written, so every page is really mapped
    previous = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        _chunk_sums(values, threads)
        best = float("inf")
        for _ in range(RUNS):
            t0 = time.perf_counter()
            _chunk_sums(values, threads)
            best = min(best, time.perf_counter() - t0)
    finally:
        numba.set_num_threads(previous)
    return values.nbytes / best / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    print(f"memory read bandwidth, {args.threads} thread(s): {probe(args.threads):.1f} GB/s")


if __name__ == "__main__":
    main()
