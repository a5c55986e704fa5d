"""Is there a GPU the CUDA backend can use, and if not, why: one cached answer, never an error.

`probe()` answers once per process (`refresh=True` asks again): `available`, the `devices`
(name, total and free memory from cudaMemGetInfo, compute capability) and, when unavailable,
`reason`: one line for the user (no CuPy installed, no driver, no device, numba's CUDA compiler
missing, or the error met), never a traceback. Without CuPy it returns at once: it looks the
package up without importing anything. This is the check llama.cpp makes when it lists the
backend's devices (ggml_backend_cuda_reg), on which `-ngl` falls back to the CPU.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass

GIB = 1 << 30
INSTALL_HINT = "pip install 'llamatui[gpu]', or 'llamatui[gpu-cuda13]' for CUDA 13"
CUPY_MISSING = "CuPy is not installed"

# cudaError_t values that have a plainer meaning than CuPy's message
_RUNTIME_REASONS = {
    35: "the NVIDIA driver is missing or older than CuPy's CUDA runtime",
    34: "no NVIDIA driver is loaded (only the CUDA stub library was found)",
    100: "no CUDA device found",
    3: "the CUDA driver failed to initialize",
}


@dataclass(frozen=True)
class GPUDevice:
    index: int
    name: str
    total_bytes: int
    free_bytes: int
    compute_capability: tuple[int, int]

    def describe(self) -> str:
        major, minor = self.compute_capability
        return (f"GPU {self.index}: {self.name} ({self.total_bytes / GIB:.1f} GiB, "
                f"{self.free_bytes / GIB:.1f} GiB free, compute {major}.{minor})")


@dataclass(frozen=True)
class GPUProbe:
    available: bool
    devices: tuple[GPUDevice, ...] = ()
    reason: str = ""  # why not, when unavailable

    def describe(self) -> str:
        """One line: the devices, or why the CPU path is used."""
        if self.available:
            return "; ".join(d.describe() for d in self.devices)
        return f"GPU offload unavailable: {self.reason}; running on the CPU"


_cached: GPUProbe | None = None


def probe(refresh: bool = False) -> GPUProbe:
    """The GPUs usable for offload (cached; `refresh` probes again). Never raises."""
    global _cached
    if _cached is None or refresh:
        try:
            _cached = _probe()
        except Exception as e:  # noqa: BLE001 -- a probe must never take the program down
            _cached = GPUProbe(False, (), f"the GPU probe failed: {_one_line(e)}")
    return _cached


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _installed(name: str) -> bool:
    if name in sys.modules:
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _probe() -> GPUProbe:
    if not _installed("cupy"):
        return GPUProbe(False, (), f"{CUPY_MISSING} (install it with: {INSTALL_HINT})")
    try:
        cupy = importlib.import_module("cupy")
    except Exception as e:  # noqa: BLE001 -- a broken install: CuPy's own message says what
        return GPUProbe(False, (), f"CuPy failed to import ({_one_line(e)})")
    runtime = cupy.cuda.runtime
    try:
        count = runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 -- CUDARuntimeError, or a missing libcudart
        status = getattr(e, "status", None)
        return GPUProbe(False, (), _RUNTIME_REASONS.get(status) or
                        f"the CUDA runtime is unusable ({_one_line(e)})")
    if count == 0:
        return GPUProbe(False, (), _RUNTIME_REASONS[100])
    devices = tuple(_device(cupy, runtime, i) for i in range(count))
    missing = _kernel_compiler_missing()
    if missing:
        return GPUProbe(False, devices, missing)
    return GPUProbe(True, devices, "")


def _device(cupy, runtime, index: int) -> GPUDevice:
    props = runtime.getDeviceProperties(index)
    name = props.get("name", b"CUDA device")
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    with cupy.cuda.Device(index):
        free, total = runtime.memGetInfo()
    return GPUDevice(index, str(name), int(total), int(free),
                     (int(props.get("major", 0)), int(props.get("minor", 0))))


def _kernel_compiler_missing() -> str:
    """Why numba cannot compile the kernels for a real device, or ''."""
    if not _installed("numba"):
        return "numba is not installed"
    from numba.core import config
    if config.ENABLE_CUDASIM:
        return "numba's CUDA simulator is on (NUMBA_ENABLE_CUDASIM=1), not a device"
    try:
        from numba.cuda.cudadrv import nvvm
        if not nvvm.is_available():
            return ("numba cannot find NVVM, the CUDA compiler its kernels need "
                    f"(install it with: {INSTALL_HINT})")
    except Exception as e:  # noqa: BLE001
        return f"numba's CUDA support is unusable ({_one_line(e)})"
    return ""
