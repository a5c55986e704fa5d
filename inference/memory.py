"""Memory a model needs beyond its mmap'd weights, checked against what the machine has before
the one big allocation (the KV cache) is made, so that `-c 10000000` is a clear refusal with
the largest context that fits instead of a MemoryError (or a swap storm) later.

The KV cache's size is exact (`kv_cache_bytes`, the same formula the recommender's estimate uses);
the compute buffers are bounded by the micro-batch (`n_ubatch` tokens), so a margin covers them.
"""
from __future__ import annotations

import os

from .catalog import GGML_TYPES

_Q8_0 = GGML_TYPES["Q8_0"]
# bytes a KV cache of each type takes per value (q8_0: a 34-byte block per 32 values)
CACHE_BYTES_PER_VALUE = {"f32": 4.0, "f16": 2.0, "q8_0": _Q8_0.type_size / _Q8_0.block_size}
# what a forward pass allocates besides the cache at the default micro-batch (activations, scores,
# dequantized tiles, logits): measured well under this for the models we run (bench_memory.py)
COMPUTE_MARGIN_BYTES = 512 << 20
USABLE_FRACTION = 0.9  # of the memory the OS reports available
# The CPU backend's bounded working buffers, which the recommender's estimate counts too: the
# scores of one chunk of prompt attention (floats, 32 MiB) and one dequantized weight tile.
ATTENTION_SCORE_FLOATS = 8 << 20
DEQUANT_TILE_BYTES = 2 << 20


class InsufficientMemoryError(ValueError):
    """The model's KV cache and buffers need more memory than the machine has available (a
    ValueError: the context asked for is too large for this machine)."""


def kv_cell_values(arch, hp) -> list[tuple[int, int]]:
    """Per layer, the K and V values one cell of its cache holds (n_head_kv * head_dim_k,
    n_head_kv * head_dim_v, from the family's kv_shape), (0, 0) for a layer that keeps none:
    one that attends over an earlier layer's rows (kv_source: Gemma 4's shared KV), a
    recurrent layer (recurrent_rows: Qwen 3.5's DeltaNet layers), every layer of an encoder.
    What Model allocates, and what the memory estimates count: one home for both."""
    recurrent = arch.recurrent_rows(hp)
    stateful = set(recurrent.layers) if recurrent is not None else set()
    values = []
    for il in range(hp.n_layer):
        if hp.encoder or il in stateful or arch.kv_source(hp, il) != il:
            values.append((0, 0))
            continue
        n_head_kv, head_dim_k, head_dim_v = arch.kv_shape(hp, il)
        values.append((n_head_kv * head_dim_k, n_head_kv * head_dim_v))
    return values


def kv_cell_bytes(values, type_k: str = "f16", type_v: str = "f16") -> list[float]:
    """Bytes one cell takes in each layer's cache, from kv_cell_values."""
    bk, bv = CACHE_BYTES_PER_VALUE[type_k], CACHE_BYTES_PER_VALUE[type_v]
    return [k * bk + v * bv for k, v in values]


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
