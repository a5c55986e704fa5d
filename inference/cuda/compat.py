"""numba-cuda on today's numpy: the one workaround the kernels need, applied before any compiles.

numba-cuda 0.30.4, its last release (the project is in maintenance mode and will not follow newer
numpy: NVIDIA/numba-cuda#907, #916), registers an overload of `np.row_stack` when its array
module is first imported, which happens at the first kernel compile. numpy 2.5 removed
`np.row_stack` (an alias of `np.vstack`), so on numpy >= 2.5 that import raises AttributeError and
no kernel compiles. numba itself guards the same line since 0.67 (numba/numba#10645).

`load_array_overloads()` imports that module with the alias put back for the duration of the
import only, so numba-cuda registers its overload (of `np.vstack`, which it overloads anyway) and
numpy's namespace is left as it was. Pinning numpy below 2.5 in the `gpu` extras instead would
hold every user of the extra back on numpy forever, since no numba-cuda release will lift it.
Nothing is done where numpy still has the alias or under numba's CUDA simulator, which never
imports the module.
"""
from __future__ import annotations

import importlib

import numpy as np

_ARRAY_MODULE = "numba.cuda.np.arrayobj"  # numba-cuda's module that overloads np.row_stack


def load_array_overloads() -> None:
    """Imports numba-cuda's array overloads with `np.row_stack` present (see the module
    docstring); a no-op where numpy has it or numba-cuda has no such module."""
    if hasattr(np, "row_stack"):
        return
    np.row_stack = np.vstack
    try:
        importlib.import_module(_ARRAY_MODULE)
    except ModuleNotFoundError as e:  # a numba-cuda laid out otherwise: nothing to work around
        if e.name is None or not _ARRAY_MODULE.startswith(e.name):
            raise
    finally:
        del np.row_stack
