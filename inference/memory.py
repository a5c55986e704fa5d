"""Memory a model needs beyond its mmap'd weights, checked against what the machine has before
the one big allocation (the KV cache) is made, so that `-c 10000000` is a clear refusal with
the largest context that fits instead of a MemoryError (or a swap storm) later.

The KV cache's size is exact (`kv_cache_bytes`, the same formula the recommender's estimate uses);
the compute buffers are bounded by the micro-batch (`n_ubatch` tokens), so a margin covers them.
"""
from __future__ import annotations

import mmap
import os

import numpy as np

CACHE_BYTES_PER_VALUE = {"f32": 4.0, "f16": 2.0, "q8_0": 34 / 32}
# what a forward pass allocates besides the cache at the default micro-batch (activations, scores,
# dequantized tiles, logits): measured well under this for the models we run (bench_memory.py)
COMPUTE_MARGIN_BYTES = 512 << 20
USABLE_FRACTION = 0.9  # of the memory the OS reports available


class InsufficientMemoryError(ValueError):
    """The model's KV cache and buffers need more memory than the machine has available (a
    ValueError: the context asked for is too large for this machine)."""


def kv_bytes_per_cell(n_layer: int, n_head_kv: int, head_dim_k: int, head_dim_v: int,
                      type_k: str = "f16", type_v: str = "f16") -> float:
    """Bytes one cell (one token's K and V on every layer) takes in the cache."""
    return n_layer * n_head_kv * (head_dim_k * CACHE_BYTES_PER_VALUE[type_k]
                                  + head_dim_v * CACHE_BYTES_PER_VALUE[type_v])


def available_bytes() -> int:
    """Memory the OS says a new allocation can take without swapping (psutil's "available";
    LLAMATUI_AVAILABLE_MEMORY overrides it, for tests)."""
    override = os.environ.get("LLAMATUI_AVAILABLE_MEMORY")
    if override:
        return int(override)
    import psutil
    return int(psutil.virtual_memory().available)


def check_kv_fits(n_ctx: int, per_cell: float, weights_bytes: int = 0) -> None:
    """Raises InsufficientMemoryError when a cache of `n_ctx` cells, the compute buffers and the
    weights' pages do not fit in the usable part of the available memory."""
    usable = int(available_bytes() * USABLE_FRACTION)
    need = int(n_ctx * per_cell) + COMPUTE_MARGIN_BYTES + weights_bytes
    if need <= usable:
        return
    room = usable - COMPUTE_MARGIN_BYTES - weights_bytes
    largest = int(room // per_cell) // 256 * 256 if per_cell > 0 and room > 0 else 0
    hint = (f"the largest context that fits is -c {largest}" if largest >= 256 else
            "not even a 256-token context fits")
    raise InsufficientMemoryError(
        f"a context of {n_ctx} tokens needs {need / 2**30:.1f} GiB ({n_ctx * per_cell / 2**30:.1f}"
        f" GiB of KV cache, {weights_bytes / 2**30:.1f} GiB of weights, buffers) but "
        f"{usable / 2**30:.1f} GiB is available; {hint}")


HUGE_PAGE_BYTES = 2 << 20


def zeros_on_huge_pages(shape: tuple[int, ...], dtype) -> np.ndarray:
    """np.zeros(shape, dtype) in 2 MiB pages where the OS gives them (Linux transparent huge
    pages, enabled "always" or "madvise"), else in ordinary pages: for the KV cache.

    Why: a decode step of several sequences reads a few cells of each, scattered over every
    layer's K and V (cells of sequences decoded together alternate), so it touches a 4 KiB page
    per cell and misses the TLB on most of them (page walks cost most in a VM); numpy asks for
    huge pages only for arrays of 4 MiB or more, which a layer's K or V often is not. Measured
    on SmolLM2's 30 layers, 8 sequences of 100 cells, caches evicted as a step's weights evict
    them: attention 7-11 % faster. Pages are still committed as they are first written."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    advise = getattr(mmap, "MADV_HUGEPAGE", None)
    if advise is None or nbytes < HUGE_PAGE_BYTES:
        return np.zeros(shape, dtype)
    try:  # private anonymous memory is zero-filled; 2 MiB more so that an aligned span fits
        region = mmap.mmap(-1, nbytes + HUGE_PAGE_BYTES,
                           flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError:  # refused: numpy says so as it always has (MemoryError)
        return np.zeros(shape, dtype)
    raw = np.frombuffer(region, np.uint8)
    start = -raw.ctypes.data % HUGE_PAGE_BYTES
    try:
        region.madvise(advise, start, nbytes - nbytes % HUGE_PAGE_BYTES or HUGE_PAGE_BYTES)
    except OSError:  # THP off ("never") or not built in: ordinary pages
        pass
    return raw[start:start + nbytes].view(dtype).reshape(shape)
