"""Every CUDA kernel and device function of llamatui.inference.cuda compiled to PTX for sm_80 and
sm_90 by numba-cuda's compile_ptx, with NVVM from the CUDA toolkit wheels (no GPU needed).

The simulator suites (test_cuda_kernels.py, test_cuda_backend.py) run the kernels as Python: they
never type or lower them, so a kernel that numba-cuda cannot compile (an unsupported construct,
a float64 constant, a numba-cuda that breaks on the installed numpy) passes there and fails on
the first GPU. Here each kernel is compiled with the argument types its launcher gives it: the
launchers run on small host arrays with the launch intercepted (`recorded_launches`), once per
weight type of the registry (dequant.DEVICE_TYPES, so a new decoder is compiled as soon as it
registers) and per KV cache type. Walking the package's modules then checks that no kernel was
left out and that every device function was compiled through some kernel.

Skipped where numba-cuda or NVVM is not installed (`pip install '.[gpu-cuda13]'` brings both);
CI runs these in a Python 3.12 environment with that extra (.ci/run).
"""
from __future__ import annotations

import importlib
import importlib.util
import itertools
import os
import pkgutil
import types

import numpy as np
import pytest

CCS = ((8, 0), (9, 0))
PACKAGE = "llamatui.inference.cuda"


def _unavailable() -> str:
    """Why PTX cannot be compiled here, or ''."""
    if importlib.util.find_spec("numba_cuda") is None:
        return "numba-cuda is not installed (pip install '.[gpu-cuda13]')"
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        return "numba's CUDA simulator is on (NUMBA_ENABLE_CUDASIM): it compiles nothing"
    from numba.cuda.cudadrv import nvvm
    if not nvvm.is_available():
        return "NVVM is not installed (the nvidia-nvvm wheel of numba-cuda[cu13])"
    return ""


pytestmark = pytest.mark.skipif(bool(_unavailable()), reason=_unavailable() or "-")


def package_modules() -> list[types.ModuleType]:
    """Every module of llamatui.inference.cuda, imported."""
    package = importlib.import_module(PACKAGE)
    return [importlib.import_module(f"{PACKAGE}.{m.name}")
            for m in pkgutil.iter_modules(package.__path__)]


def package_dispatchers() -> tuple[dict, dict]:
    """({name: kernel}, {name: device function}): the numba-cuda functions defined at module level
    in the package (kernels made by a factory, per weight type, are compiled through the
    registry instead)."""
    from numba.cuda.dispatcher import CUDADispatcher
    kernels, device_functions = {}, {}
    for module in package_modules():
        for value in vars(module).values():
            if isinstance(value, CUDADispatcher) and value.py_func.__module__ == module.__name__:
                name = f"{module.__name__.rsplit('.', 1)[1]}.{value.py_func.__name__}"
                is_device = value.targetoptions.get("device", False)
                (device_functions if is_device else kernels)[name] = value
    return kernels, device_functions


def launch_everything() -> None:
    """Every kernel launcher once, with the argument types the CUDA backend passes (int64 ids and
    positions, float32 activations, float16 tiles): per weight type of the registry, per KV cache
    type and pair of them, and the elementwise kernels."""
    from llamatui.inference.cuda import attention, dequant, elementwise, kv, matvec, sampling
    from llamatui.inference.rope import RopeSpec
    f32, i64 = np.float32, np.int64
    for name, dt in dequant.DEVICE_TYPES.items():
        n = dt.block_values
        w = np.zeros((2, dt.row_bytes(n)), np.uint8)
        for out_type in (np.float32, np.float16):  # rows, and a prompt's fp16 tiles
            dequant.dequantize_rows(name, w, np.zeros(2, i64), np.zeros((2, n), out_type))
        matvec.matvec(name, w, np.zeros((1, n), f32), np.zeros((1, 2), f32))
    x = np.zeros((2, 32), f32)
    elementwise.rms_norm(x, np.ones(32, f32), 1e-6, np.zeros_like(x))
    elementwise.rope(np.zeros((1, 2, 32), f32), np.zeros(1, i64), RopeSpec(32, 1e4),
                     np.ones(16, f32))
    elementwise.swiglu(x, x, np.zeros_like(x))
    elementwise.swiglu_oai(x, x, 1.702, 7.0, np.zeros_like(x))
    elementwise.geglu(x, x, np.zeros_like(x), elementwise.GELU_TABLE)
    sampling.greedy_tokens(x, np.zeros(2, np.int32))
    rows = {}
    for cache_type in attention.KV_TYPES:
        dtype, width = kv.storage(cache_type, 32)
        rows[cache_type] = np.zeros((4, width), dtype)
        kv.write_rows(cache_type, np.zeros((1, 32), f32), np.zeros(1, i64), rows[cache_type])
    # as the backend's batch buffers hold them: n_kv an int64 device value
    cells = attention.CellMask(np.zeros(4, np.int32), np.zeros((4, 1), np.bool_), np.zeros(1, i64),
                               np.zeros(1, i64), 0, n_kv=np.ones(1, i64))
    for k_type, v_type in itertools.product(attention.KV_TYPES, repeat=2):
        k = attention.DeviceKV(rows[k_type].view(np.uint8), k_type, 1, 32)
        v = attention.DeviceKV(rows[v_type].view(np.uint8), v_type, 1, 32)
        attention.attention(np.zeros((1, 2, 32), f32), k, v, cells, 0.125,
                            np.zeros((1, 2, 32), f32), sinks=np.zeros(2, f32))


def recorded_launches(monkeypatch) -> dict:
    """{kernel: {argument types}} of launch_everything, nothing launched."""
    from numba.cuda.dispatcher import CUDADispatcher
    launches: dict = {}

    def configure(self, griddim, blockdim, stream=0, sharedmem=0):
        def launch(*args):
            launches.setdefault(self, set()).add(tuple(self.typeof_pyval(a) for a in args))
        return launch
    monkeypatch.setattr(CUDADispatcher, "configure", configure)
    launch_everything()
    monkeypatch.undo()
    return launches


def compile_all(launches: dict, cc: tuple[int, int], monkeypatch) -> dict[str, str]:
    """{kernel and argument types: the error} of compiling every launch to PTX for `cc`
    (empty when all compile). Device functions compile inside the kernels that call them, for
    the device numba-cuda asks for: here one of capability `cc`."""
    import numba.cuda.dispatcher as dispatcher
    from numba import cuda
    device = types.SimpleNamespace(compute_capability=cc)
    monkeypatch.setattr(dispatcher, "get_current_device", lambda: device)
    _, device_functions = package_dispatchers()
    for fn in device_functions.values():  # compiled afresh for this capability
        fn.overloads.clear()
    errors = {}
    for kernel, signatures in launches.items():
        for sig in signatures:
            try:
                ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=cc,
                                          fastmath=kernel.targetoptions.get("fastmath", False))
                assert f".target sm_{cc[0]}{cc[1]}" in ptx
            except Exception as e:  # noqa: BLE001 -- every failure reported at once
                text = str(e).strip().splitlines()
                errors[f"{kernel.py_func.__qualname__}{sig}"] = \
                    f"{type(e).__name__}: {text[0] if text else ''}"
    return errors


@pytest.fixture(scope="module")
def launches():
    with pytest.MonkeyPatch.context() as mp:
        return recorded_launches(mp)


@pytest.mark.parametrize("cc", CCS, ids=lambda cc: f"sm_{cc[0]}{cc[1]}")
def test_every_kernel_compiles_to_ptx(launches, cc, monkeypatch):
    errors = compile_all(launches, cc, monkeypatch)
    assert not errors, "\n".join(f"{k}: {v}" for k, v in errors.items())
    _, device_functions = package_dispatchers()
    unreached = sorted(n for n, fn in device_functions.items() if not fn.overloads)
    assert not unreached, f"device functions no compiled kernel calls: {unreached}"


def test_every_kernel_and_weight_type_is_launched(launches):
    """The launches cover every module-level kernel of the package, and the matvec and
    dequantize kernels of every registered weight type."""
    from llamatui.inference.cuda import dequant, matvec
    kernels, _ = package_dispatchers()
    launched = set(launches)
    missing = sorted(n for n, k in kernels.items() if k not in launched)
    assert not missing, f"kernels launch_everything does not launch: {missing}"
    for name in dequant.DEVICE_TYPES:
        assert matvec.matvec_kernel(name) in launched
        assert dequant.dequantize_kernel(name) in launched


def test_numpy_is_left_as_it_was():
    """The numba-cuda workaround (cuda/compat.py) puts np.row_stack back only while numba-cuda's
    array module imports."""
    had = hasattr(np, "row_stack")
    importlib.import_module(f"{PACKAGE}.device")
    from numba.cuda.np import arrayobj  # noqa: F401 -- imported, as a first compile would
    assert hasattr(np, "row_stack") == had
