"""Whether the engine runs a model here: its family has a forward pass (catalog.ARCHITECTURES) and
every type of its matrices has CPU kernels.

What the CPU computes is not kept as a list: it is derived from the kernels registered against
each type's class (inference/quants, `kernels_of("cpu")`; cpu/matmul.py's ENGINE_TYPES). Asking
imports those kernels, and numba, on the first question only, so that the model manager (`llamatui
ls`, `search`) loads them only when it asks whether something runs.
"""
from __future__ import annotations

import functools

from .catalog import ARCHITECTURES, Mix


@functools.cache
def engine_types() -> frozenset[str]:
    """The ggml types the engine computes (every layer can run on the CPU)."""
    from .cpu.matmul import ENGINE_TYPES
    return ENGINE_TYPES


def runs_here(architecture: str | None, tensor_types=()) -> bool:
    """Whether the engine runs a model of this architecture whose matrices have these types."""
    return architecture in ARCHITECTURES and frozenset(tensor_types) <= engine_types()


def mix_runs_here(mix: Mix) -> bool:
    """Whether the engine computes every type a quantization mix uses."""
    return mix.types <= engine_types()
