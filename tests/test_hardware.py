"""Hardware detection: real values here, parsed values from fake sources, and never an error."""
import json
import subprocess
import sys
import types

from llamatui.app.cli import main
from llamatui.models import hardware
from llamatui.models.hardware import detect


def test_detect_this_machine(tmp_path):
    hw = detect(store=tmp_path / "models")  # a store that does not exist yet
    assert hw.ram_total and hw.ram_available and 0 < hw.ram_available <= hw.ram_total
    assert hw.logical_cores >= 1 and (hw.physical_cores or 1) <= hw.logical_cores
    assert hw.disk_free and hw.disk_total >= hw.disk_free
    assert hw.disk_path == str(tmp_path / "models")
    assert isinstance(hw.simd, list) and isinstance(hw.gpus, list)
    if hw.machine == "x86_64":
        assert "AVX" in hw.simd or not hw.simd  # a VM may hide flags, never invents them
    json.dumps(hw.as_dict())


def test_x86_and_arm_flags(monkeypatch):
    monkeypatch.setattr(hardware, "_cpuinfo", lambda: {
        "model name": "Intel(R) Xeon(R) Gold 6338", "flags": "fpu sse4_2 avx f16c fma avx2 "
        "avx512f avx512bw avx512vl avx512_vnni avx512_bf16 amx_tile amx_int8"})
    model, simd = hardware.cpu_features()
    assert model == "Intel(R) Xeon(R) Gold 6338"
    assert simd[:5] == ["SSE4.2", "AVX", "F16C", "FMA", "AVX2"]
    assert {"AVX-512", "AVX-512-VNNI", "AVX-512-BF16", "AMX", "AMX-INT8"} <= set(simd)
    assert "AVX-VNNI" not in simd
    monkeypatch.setattr(hardware, "_cpuinfo", lambda: {
        "Features": "fp asimd evtstrm aes asimdhp asimddp sve i8mm bf16", "CPU part": "0xd40"})
    _, simd = hardware.cpu_features()
    assert simd == ["NEON", "NEON-FP16", "DOTPROD", "I8MM", "SVE", "BF16"]
    monkeypatch.setattr(hardware, "_cpuinfo", lambda: {})
    monkeypatch.setattr(hardware.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(hardware.sys, "platform", "linux")
    assert hardware.cpu_features()[1] == ["NEON"]


def test_nvml_gpus(monkeypatch):
    mem = types.SimpleNamespace(total=24 << 30, free=20 << 30, used=4 << 30)
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: b"550.54",
        nvmlDeviceGetCount=lambda: 2, nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: [b"NVIDIA GeForce RTX 4090", "NVIDIA L4"][h],
        nvmlDeviceGetMemoryInfo=lambda h: mem,
        nvmlDeviceGetCudaComputeCapability=lambda h: (8, 9))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    hw = detect()
    assert [g.name for g in hw.gpus] == ["NVIDIA GeForce RTX 4090", "NVIDIA L4"]
    assert hw.gpus[0].vram_free == 20 << 30 and hw.gpus[0].compute_capability == "8.9"
    assert hw.gpus[0].backend == "nvml" and hw.vram_free == 20 << 30


def test_nvidia_smi_fallback(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    monkeypatch.setitem(sys.modules, "cupy", None)
    monkeypatch.setattr(hardware.shutil, "which", lambda exe: "/usr/bin/nvidia-smi")
    out = "0, NVIDIA H100 80GB HBM3, 81559, 80000, 9.0, 550.90\n"
    monkeypatch.setattr(hardware.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a, 0, stdout=out, stderr=""))
    [gpu] = hardware.detect_gpus()
    assert gpu.name == "NVIDIA H100 80GB HBM3" and gpu.vram_total == 81559 << 20
    assert gpu.vram_free == 80000 << 20 and gpu.backend == "nvidia-smi"


def test_never_fails(monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("driver exploded")
    monkeypatch.setattr(hardware, "_gpus_nvml", boom)
    monkeypatch.setattr(hardware, "_gpus_cupy", boom)
    monkeypatch.setattr(hardware, "_gpus_smi", boom)
    monkeypatch.setattr(hardware, "cpu_features", boom)
    import psutil
    monkeypatch.setattr(psutil, "virtual_memory", boom)
    hw = detect()
    assert hw.gpus == [] and hw.ram_total is None and hw.simd == []
    assert any("driver exploded" in n for n in hw.notes)


def test_hw_command(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")
    assert main(["hw"]) == 0
    out = capsys.readouterr().out
    assert "RAM" in out and "Cores" in out and "SIMD" in out and "Disk" in out
    assert main(["hw", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ram_total"] > 0 and data["logical_cores"] >= 1 and "gpus" in data
