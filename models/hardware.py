"""What this machine has for running models: RAM, CPU (cores, SIMD), GPUs, free disk.

    hw = detect()          # never raises; what cannot be read is None / empty
    hw.ram_available, hw.physical_cores, hw.simd, hw.gpus, hw.disk_free

GPUs come from NVML (the `pynvml` / nvidia-ml-py module) when importable, else CuPy, else
`nvidia-smi` when it is on PATH; with none of them the list is empty. `gpu_offload` is the
engine's own answer (inference.cuda.probe): whether its CUDA backend can use them, and if not
why (no CuPy, no driver, ...).
"""
from __future__ import annotations

import os
import pathlib
import platform
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field

# Flags worth showing (they decide which kernels are fast), as /proc/cpuinfo spells them.
_X86_FLAGS = {
    "sse4_2": "SSE4.2", "avx": "AVX", "f16c": "F16C", "fma": "FMA", "avx2": "AVX2",
    "avx_vnni": "AVX-VNNI", "avx512f": "AVX-512", "avx512bw": "AVX-512BW",
    "avx512vl": "AVX-512VL", "avx512_vnni": "AVX-512-VNNI", "avx512_bf16": "AVX-512-BF16",
    "avx512_fp16": "AVX-512-FP16", "amx_tile": "AMX", "amx_int8": "AMX-INT8",
    "amx_bf16": "AMX-BF16",
}
_ARM_FLAGS = {
    "asimd": "NEON", "asimdhp": "NEON-FP16", "asimddp": "DOTPROD", "i8mm": "I8MM",
    "sve": "SVE", "sve2": "SVE2", "bf16": "BF16", "sme": "SME",
}
_MAC_SYSCTL = {  # hw.optional.* on Apple silicon / Intel Macs
    "hw.optional.neon": "NEON", "hw.optional.arm.FEAT_DotProd": "DOTPROD",
    "hw.optional.arm.FEAT_I8MM": "I8MM", "hw.optional.arm.FEAT_BF16": "BF16",
    "hw.optional.avx2_0": "AVX2", "hw.optional.avx512f": "AVX-512", "hw.optional.fma": "FMA",
    "hw.optional.avx1_0": "AVX",
}


@dataclass
class GPUInfo:
    index: int
    name: str
    vram_total: int | None  # bytes
    vram_free: int | None
    backend: str  # "nvml", "cupy", "nvidia-smi"
    compute_capability: str | None = None
    driver: str | None = None


@dataclass
class HardwareInfo:
    os: str
    machine: str
    python: str
    cpu_model: str | None
    physical_cores: int | None
    logical_cores: int | None
    simd: list[str]
    ram_total: int | None
    ram_available: int | None
    gpus: list[GPUInfo] = field(default_factory=list)
    disk_path: str | None = None
    disk_free: int | None = None
    disk_total: int | None = None
    notes: list[str] = field(default_factory=list)
    # whether the engine can offload to these GPUs: "ready", or why not (its probe's one line)
    gpu_offload: str | None = None

    @property
    def vram_free(self) -> int:
        """Free memory of the best GPU (the engine uses one), 0 without GPUs."""
        return max((g.vram_free or 0 for g in self.gpus), default=0)

    @property
    def best_gpu(self) -> GPUInfo | None:
        return max(self.gpus, key=lambda g: g.vram_free or 0, default=None)

    def as_dict(self) -> dict:
        return asdict(self)


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (plus `Hardware`/`Model` lines)."""
    out: dict[str, str] = {}
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        if ":" not in line:
            continue
        k, v = (s.strip() for s in line.split(":", 1))
        out.setdefault(k, v)
    return out


def _sysctl(name: str) -> str | None:
    try:
        r = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=2)
        return r.stdout.strip() if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def cpu_features() -> tuple[str | None, list[str]]:
    """(CPU model name, SIMD features) from /proc/cpuinfo, sysctl or the platform."""
    machine = platform.machine().lower()
    info = _cpuinfo()
    model = info.get("model name") or info.get("Model") or info.get("Hardware") or None
    simd: list[str] = []
    if info:
        flags = set((info.get("flags") or info.get("Features") or "").split())
        table = _X86_FLAGS if ("flags" in info) else _ARM_FLAGS
        simd = [name for flag, name in table.items() if flag in flags]
    elif sys.platform == "darwin":
        model = _sysctl("machdep.cpu.brand_string") or model
        simd = [name for key, name in _MAC_SYSCTL.items() if _sysctl(key) == "1"]
    if not simd and machine in ("arm64", "aarch64"):
        simd = ["NEON"]  # mandatory on ARMv8-A
    if not model:
        model = platform.processor() or None
    return model, simd


def _gpus_nvml() -> list[GPUInfo]:
    import pynvml  # nvidia-ml-py
    pynvml.nvmlInit()
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else name
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            try:
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
                cc = f"{major}.{minor}"
            except Exception:  # noqa: BLE001
                cc = None
            out.append(GPUInfo(i, name, int(mem.total), int(mem.free), "nvml", cc, driver))
        return out
    finally:
        pynvml.nvmlShutdown()


def _gpus_cupy() -> list[GPUInfo]:
    import cupy
    rt = cupy.cuda.runtime
    out = []
    for i in range(rt.getDeviceCount()):
        props = rt.getDeviceProperties(i)
        name = props.get("name", b"GPU")
        name = name.decode() if isinstance(name, bytes) else str(name)
        with cupy.cuda.Device(i):
            free, total = rt.memGetInfo()
        cc = f"{props.get('major')}.{props.get('minor')}" if "major" in props else None
        out.append(GPUInfo(i, name, int(total), int(free), "cupy", cc))
    return out


def _gpus_smi() -> list[GPUInfo]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    r = subprocess.run([exe, "--query-gpu=index,name,memory.total,memory.free,compute_cap,"
                        "driver_version", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True, timeout=10)
    out = []
    if r.returncode != 0:
        return out
    for line in r.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4:
            continue

        def mib(s):
            try:
                return int(float(s)) << 20
            except ValueError:
                return None
        out.append(GPUInfo(int(parts[0]), parts[1], mib(parts[2]), mib(parts[3]), "nvidia-smi",
                           parts[4] if len(parts) > 4 and parts[4] not in ("", "[N/A]") else None,
                           parts[5] if len(parts) > 5 else None))
    return out


def detect_gpus(notes: list[str] | None = None) -> list[GPUInfo]:
    """GPUs with total/free memory; [] when none can be seen. Never raises."""
    for probe, what in ((_gpus_nvml, "pynvml"), (_gpus_cupy, "cupy"), (_gpus_smi, "nvidia-smi")):
        try:
            gpus = probe()
        except ImportError:
            continue
        except Exception as e:  # noqa: BLE001 - a broken driver must not break `hw`
            if notes is not None:
                notes.append(f"{what}: {type(e).__name__}: {e}")
            continue
        if gpus:
            return gpus
    return []


def detect(store: pathlib.Path | str | None = None, gpus: bool = True) -> HardwareInfo:
    """Everything at once; never raises. `store`: the folder whose free disk space counts
    (default: the model store)."""
    notes: list[str] = []
    try:
        model, simd = cpu_features()
    except Exception as e:  # noqa: BLE001
        model, simd = None, []
        notes.append(f"cpu: {e}")
    physical = logical = ram_total = ram_avail = None
    try:
        import psutil
        physical = psutil.cpu_count(logical=False)
        logical = psutil.cpu_count(logical=True)
        vm = psutil.virtual_memory()
        ram_total, ram_avail = int(vm.total), int(vm.available)
    except Exception as e:  # noqa: BLE001
        notes.append(f"psutil: {e}")
        logical = os.cpu_count()
    disk_path = disk_free = disk_total = None
    try:
        from .store import store_dir
        p = pathlib.Path(store) if store else store_dir()
        probe = p
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        du = shutil.disk_usage(probe)
        disk_path, disk_free, disk_total = str(p), int(du.free), int(du.total)
    except Exception as e:  # noqa: BLE001
        notes.append(f"disk: {e}")
    return HardwareInfo(
        os=f"{platform.system()} {platform.release()}", machine=platform.machine(),
        python=platform.python_version(), cpu_model=model, physical_cores=physical,
        logical_cores=logical, simd=simd, ram_total=ram_total, ram_available=ram_avail,
        gpus=detect_gpus(notes) if gpus else [], disk_path=disk_path, disk_free=disk_free,
        disk_total=disk_total, notes=notes, gpu_offload=gpu_offload() if gpus else None)


def gpu_offload() -> str:
    """'ready' when the engine's CUDA backend can run here, else its reason (never raises)."""
    from llamatui.inference.cuda.probe import probe
    found = probe()
    return "ready (CuPy and numba-cuda)" if found.available else found.reason
