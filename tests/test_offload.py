"""GPU offload without a GPU: device boundaries counted with fake devices, the fail-soft paths,
the offload flags of the CLI, and where a user sees the GPU (bench, hw, the engine panel).

The CUDA backend itself runs under numba's simulator in tests/test_cuda_backend.py; here the
"devices" are CPU backends whose arrays carry their device, so that any activation used by a
backend it does not belong to, or computed on outside a backend, fails the test.
"""
import importlib
import json
import types
from collections import Counter

import numpy as np
import pytest
from synthetic_models import TOKENS, write_model

from llamatui.inference import LoadConfig, OffloadOptions
from llamatui.app.cli import main
from llamatui.inference.backend import Backend
from llamatui.inference.cpu.backend import CPUBackend
from llamatui.inference.catalog import get_arch
from llamatui.inference.placement import Placement, model_sizes
from llamatui.inference.placement import OffloadError
from llamatui.inference.gguf import GGUFFile
from llamatui.inference.hparams import read_hparams
from llamatui.inference.cpu.backend import HostKVStore
from llamatui.inference.model import Batch, Model

probe_mod = importlib.import_module("llamatui.inference.cuda.probe")  # (not the function)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("synthetic")
    return {family: write_model(family, "Q8_0", d) for family in ("llama", "gemma3")}


# ----------------------------------------------------------------------------- fake devices


class OnDevice(np.ndarray):
    """An activation on a fake device: numpy memory that refuses numpy math (a GPU array cannot
    be computed on by the host); only its own backend, which unwraps it, computes with it."""

    device = None

    def __array_finalize__(self, obj):
        self.device = getattr(obj, "device", None)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        raise AssertionError(f"numpy {ufunc.__name__} on an array of device {self.device} "
                             f"outside its backend")


class FakeDevice(CPUBackend):
    """The CPU's kernels behind a device boundary: inputs must be this device's arrays (device
    None: plain host arrays), outputs are tagged; take and to_host count what crosses."""

    def __init__(self, device):
        super().__init__()
        self.device = device
        self.crossings = Counter()

    def own(self, x):
        here = isinstance(x, OnDevice) and x.device == self.device
        if self.device is None and not isinstance(x, OnDevice) or here:
            return x.view(np.ndarray) if here else x
        raise AssertionError(f"device {self.device} got an array of device "
                             f"{getattr(x, 'device', None)} without take()")

    def tag(self, y):
        if self.device is None:
            return y
        y = np.asarray(y).view(OnDevice)
        y.device = self.device
        return y

    def take(self, x):
        if isinstance(x, OnDevice) and x.device == self.device or \
                self.device is None and not isinstance(x, OnDevice):
            return x
        self.crossings["in"] += 1
        return self.tag(np.array(x.view(np.ndarray), dtype=np.float32))

    def to_host(self, x):
        self.crossings["out"] += 1
        return np.array(self.own(x))

    def vector(self, tensor):
        return self.tag(super().vector(tensor))

    def kv_store(self, type_name, n_ctx, n_head, head_dim):
        backend = self

        class Store(HostKVStore):
            def write(self, cells, x):  # this device's K and V (or the host's, shifting K)
                super().write(cells, backend.own(x) if isinstance(x, OnDevice) else x)
        return Store(type_name, n_ctx, n_head, head_dim)

    def get_rows(self, w, ids):
        return self.tag(super().get_rows(w, ids))

    def matmul(self, w, x):
        return self.tag(super().matmul(w, self.own(x)))

    # one product per matrix through matmul above (the plain CPU model these are compared with
    # fuses Q, K, V and gate, up: the logits must not differ by a bit)
    matmul_many = Backend.matmul_many

    def rms_norm(self, x, w, eps):
        return self.tag(super().rms_norm(self.own(x), self.own(w), eps))

    def rope(self, x, pos, spec):
        return self.tag(super().rope(self.own(x), pos, spec))

    def attention(self, q, k, v, mask, scale, softcap=0.0, sinks=None):
        return self.tag(super().attention(self.own(q), k, v, mask, scale, softcap,
                                          None if sinks is None else self.own(sinks)))

    def swiglu(self, gate, up):
        return self.tag(super().swiglu(self.own(gate), self.own(up)))

    def geglu(self, gate, up):
        return self.tag(super().geglu(self.own(gate), self.own(up)))

    def add(self, a, b):
        return self.tag(super().add(self.own(a), self.own(b)))

    def scale(self, x, s):
        return self.tag(super().scale(self.own(x), s))


def split_model(path, layer_devices, output_device, kv_devices=None):
    """A model whose layers run on fake devices (None: the host), input on the host."""
    host = FakeDevice(None)
    devices = {None: host}
    for d in (*layer_devices, output_device, *(kv_devices or ())):
        devices.setdefault(d, FakeDevice(d))
    gguf = GGUFFile.open(path)
    spec = get_arch(gguf.metadata["general.architecture"])
    hp = read_hparams(gguf, spec)
    layers = [devices[d] for d in layer_devices]
    kv = [devices[d] for d in (kv_devices or layer_devices)]
    placement = Placement(host, layers, kv, devices[output_device])
    model = Model(gguf, spec.load(), hp, host, 128, owns_file=True, placement=placement)
    return model, devices


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_hidden_states_cross_each_boundary_once_per_batch(models, family):
    """Layers on the host, device 0 and device 1: the logits are the CPU's bit for bit, and a
    batch enters device 0 once, device 1 once, and leaves once; no layer copies to the host."""
    path = models[family]
    n_layer = {"llama": 3, "gemma3": 4}[family]
    cpu = Model.load(path, LoadConfig(n_ctx=128))
    model, devices = split_model(path, [None] + [0] + [1] * (n_layer - 2), 1)
    for batch in (Batch(TOKENS[:12], pos=0), Batch([TOKENS[12]]), Batch([TOKENS[13]])):
        for d in devices.values():
            d.crossings.clear()
        np.testing.assert_array_equal(model.decode(batch), cpu.decode(batch))
        assert {d: dict(be.crossings) for d, be in devices.items()} == \
            {None: {}, 0: {"in": 1}, 1: {"in": 1, "out": 1}}
    model.close()


def test_without_kv_offload_attention_runs_next_to_the_cache(models):
    """--no-kv-offload: each offloaded layer sends q, k, v to the host's cache and gets the
    attention back (llama.cpp runs attention where the cache is). They leave the device through
    its own to_host (a GPU's arrays cannot be converted by the host: CuPy refuses)."""
    cpu = Model.load(models["llama"], LoadConfig(n_ctx=128))
    model, devices = split_model(models["llama"], [0, 0, 0], 0, kv_devices=[None] * 3)
    batch = Batch(TOKENS[:9], pos=0)
    np.testing.assert_array_equal(model.decode(batch), cpu.decode(batch))
    assert dict(devices[None].crossings) == {}
    assert dict(devices[0].crossings) == {"in": 1 + 3, "out": 3 * 3 + 1}
    model.close()


def test_the_fake_device_catches_host_math_on_device_arrays():
    """The check above can fail: numpy math on a device array is refused."""
    be = FakeDevice(0)
    x = be.take(np.ones((2, 4), np.float32))
    with pytest.raises(AssertionError, match="outside its backend"):
        x + 1
    with pytest.raises(AssertionError, match="without take"):
        FakeDevice(1).matmul(None, x)


def test_model_sizes_count_every_tensor_once(models):
    for family, tied in (("llama", False), ("gemma3", True)):
        with GGUFFile.open(models[family]) as g:
            hp = read_hparams(g, get_arch(family))
            layers, output, kv = model_sizes(g, hp, 100, "f16", "q8_0")
            embd = g.tensors["token_embd.weight"].nbytes
            total = sum(t.nbytes for t in g.tensors.values())
            norm = g.tensors["output_norm.weight"].nbytes
            if tied:  # the output layer is a copy of the embedding on the device
                assert output == embd + norm and sum(layers) + norm + embd == total
            else:
                assert sum(layers) + output + embd == total
            per_cell = hp.n_head_kv * (hp.head_dim_k * 2 + hp.head_dim_v * 34 / 32)
            assert kv == [int(100 * per_cell)] * hp.n_layer


# ----------------------------------------------------------------------------- fail soft


@pytest.fixture
def probe_says(monkeypatch):
    def set_probe(found):
        monkeypatch.setattr(probe_mod, "_cached", found)
        return found
    yield set_probe


@pytest.mark.parametrize("reason", [
    "CuPy is not installed (install it with: pip install 'llamatui[gpu]')",
    "the NVIDIA driver is missing or older than CuPy's CUDA runtime",
    "no CUDA device found",
    "the GPU probe failed: RuntimeError: device fell off the bus",
])
def test_no_usable_gpu_means_the_cpu_with_one_line(models, probe_says, reason):
    found = probe_says(probe_mod.GPUProbe(False, (), reason))
    for ngl in (-1, 99, "all", "auto", 2):
        model = Model.load(models["llama"], LoadConfig(n_ctx=64, offload=OffloadOptions(
            n_gpu_layers=ngl)))
        assert model.n_gpu_layers == 0 and model.backends == [model.backend]
        assert model.offload_note == found.describe() and "\n" not in model.offload_note
        assert reason in model.offload_note and model.offload_note.endswith("on the CPU")
        assert model.decode(TOKENS[:3]).shape == (1, 512)
        model.close()


@pytest.mark.filterwarnings("ignore:.*Grid size")  # numba's note on the one-block launch
def test_a_kernel_that_fails_to_compile_means_the_cpu_with_one_line(models, probe_says,
                                                                    monkeypatch):
    """A GPU is there but its first kernel does not compile (numba-cuda 0.30 on numpy 2.5 raised
    AttributeError at the first compile): Model.load and Engine.load run on the CPU and say
    why in one line, with -ngl 99 and with auto."""
    from numba.cuda.dispatcher import CUDADispatcher

    from llamatui.inference import Engine
    runtime = importlib.import_module("llamatui.inference.cuda.runtime")
    probe_says(probe_mod.GPUProbe(True, (probe_mod.GPUDevice(0, "a GPU", 1 << 34, 1 << 34,
                                                              (9, 0)),)))
    monkeypatch.setattr(runtime, "make_runtime",
                        lambda index, total=None: runtime.SimulatedRuntime(index, total))

    def compile_fails(self, *args, **kwargs):
        raise AttributeError("module 'numpy' has no attribute 'row_stack'")
    monkeypatch.setattr(CUDADispatcher, "compile", compile_fails)
    note = ("GPU offload unavailable: the first CUDA kernel failed to compile or run "
            "(AttributeError: module 'numpy' has no attribute 'row_stack'); running on the CPU")
    for ngl in (99, "auto"):
        model = Model.load(models["llama"], LoadConfig(n_ctx=64, offload=OffloadOptions(
            n_gpu_layers=ngl)))
        assert (model.n_gpu_layers, model.offload_note) == (0, note)
        assert model.decode(TOKENS[:3]).shape == (1, 512)
        model.close()
    config = LoadConfig(n_ctx=64, offload=OffloadOptions(n_gpu_layers=99))  # warm-up decode on
    with Engine.load(models["llama"], config) as engine:
        assert (engine.info.n_gpu_layers, engine.info.gpu_note) == (0, note)


def test_ngl_0_never_probes(models, monkeypatch):
    monkeypatch.setattr("llamatui.inference.cuda.offload.probe",
                        lambda: pytest.fail("probed with -ngl 0"))
    model = Model.load(models["llama"], LoadConfig(n_ctx=64, offload=OffloadOptions(
        n_gpu_layers=0)))
    assert model.n_gpu_layers == 0 and model.offload_note == ""
    model.close()


def test_a_bad_ngl_is_refused_by_name(models):
    with pytest.raises(OffloadError, match="-ngl: 'lots' is not a layer count"):
        Model.load(models["llama"], LoadConfig(n_ctx=64, offload=OffloadOptions(
            n_gpu_layers="lots")))


def test_engine_info_says_why_the_gpu_is_not_used(models, probe_says):
    from llamatui.inference import Engine
    probe_says(probe_mod.GPUProbe(False, (), "no CUDA device found"))
    config = LoadConfig(n_ctx=64, warmup=False, offload=OffloadOptions(n_gpu_layers=-1))
    with Engine.load(models["llama"], config) as engine:
        info = engine.info
    assert (info.n_gpu_layers, info.vram_bytes, info.offload) == (0, 0, "")
    assert info.gpu_note == "GPU offload unavailable: no CUDA device found; running on the CPU"


# ----------------------------------------------------------------------------- the CLI


@pytest.mark.parametrize("flags, words", [
    ("-ngl lots", "argument -ngl/--gpu-layers/--n-gpu-layers: must be a number of layers, "
                  "'auto' or 'all', got lots"),
    ("-ts 1,x", "argument -ts/--tensor-split: must be comma-separated proportions"),
    ("-ts 0,0", "proportions must be non-negative and not all 0, got 0,0"),
    ("-sm row", "argument -sm/--split-mode: invalid choice: 'row'"),
    ("-mg -1", "argument -mg/--main-gpu: must be a GPU index (0 or more), got -1"),
])
def test_offload_flags_are_checked_as_parsed(capsys, flags, words):
    for command in ("run", "bench", "perplexity"):
        assert main([command, "-m", "x.gguf", *flags.split()]) == 2
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1, err


def test_offload_flags_reach_the_engine(monkeypatch):
    from llamatui.app.cli import engine_args
    from llamatui.app.cli import build_parser
    args = build_parser({"run"}).parse_args(
        ["run", "-m", "x", "-ngl", "-1", "-mg", "1", "-ts", "3/1", "-sm", "none", "-nkvo"])
    assert engine_args.load_config(args).offload == OffloadOptions(
        n_gpu_layers=-1, main_gpu=1, tensor_split=(3.0, 1.0), offload_kv=False,
        split_mode="none")
    default = build_parser({"run"}).parse_args(["run", "-m", "x"])
    assert engine_args.load_config(default).offload.n_gpu_layers == "auto"


def test_run_without_a_gpu_says_why_once(smollm2_path, probe_says, capsys):
    probe_says(probe_mod.GPUProbe(False, (), "no CUDA device found"))
    assert main(["run", "-m", str(smollm2_path), "-p", "Hi", "-n", "2", "-ngl", "99",
                 "--temp", "0"]) == 0
    err = capsys.readouterr().err
    assert err.count("GPU offload unavailable: no CUDA device found; running on the CPU") == 1
    assert "Traceback" not in err
    # the default (-ngl auto) on a CPU-only install says nothing about GPUs
    probe_says(probe_mod.GPUProbe(False, (), "CuPy is not installed (install it with: ...)"))
    assert main(["run", "-m", str(smollm2_path), "-p", "Hi", "-n", "1", "--temp", "0"]) == 0
    assert "GPU" not in capsys.readouterr().err


def test_bench_prints_llama_bench_ngl_column(smollm2_path, probe_says, capsys):
    probe_says(probe_mod.GPUProbe(False, (), "no CUDA device found"))
    args = ["bench", "-m", str(smollm2_path), "-p", "8", "-n", "2", "-r", "1"]
    assert main(args + ["-ngl", "0"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].split("|")[1:-1]]
    assert header == ["model", "size", "params", "backend", "ngl", "threads", "test", "t/s"]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in lines[2:]]
    assert [(r[3], r[4], r[6]) for r in rows] == [("CPU", "0", "pp8"), ("CPU", "0", "tg2")]
    assert main(args + ["-o", "json"]) == 0
    assert {(r["backends"], r["n_gpu_layers"]) for r in json.loads(capsys.readouterr().out)} \
        == {("CPU", 0)}


def test_hw_lists_each_gpu_with_what_fits(monkeypatch, capsys, tmp_path):
    from llamatui.models import hardware
    from llamatui.models.hardware import GPUInfo, HardwareInfo
    monkeypatch.setenv("LLAMATUI_HOME", str(tmp_path))
    hw = HardwareInfo(os="Linux", machine="x86_64", python="3.12", cpu_model="cpu",
                      physical_cores=8, logical_cores=16, simd=["AVX2"], ram_total=64 << 30,
                      ram_available=48 << 30,
                      gpus=[GPUInfo(0, "Big GPU", 80 << 30, 79 << 30, "nvml", "9.0"),
                            GPUInfo(1, "Small GPU", 2 << 30, 1 << 30, "nvml", "8.6")],
                      disk_path=str(tmp_path), disk_free=1 << 40, disk_total=2 << 40,
                      gpu_offload="ready (CuPy and numba-cuda)")
    monkeypatch.setattr(hardware, "detect", lambda *a, **k: hw)
    assert main(["hw", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    big, small = (g["fits"] for g in data["gpus"])
    assert big == "SmolLM2 135M Instruct (Q4_1): all layers; Gemma 3 270M (Q4_K_M): all layers"
    assert small == "no model's layers"  # 1 GiB free is the margin -ngl auto keeps
    assert data["gpu_offload"] == "ready (CuPy and numba-cuda)"
    assert main(["hw"]) == 0
    out = capsys.readouterr().out
    assert "Big GPU: 84.8 GB free of 85.9 GB, compute 9.0" in out
    assert "GPU offload" in out and "fits" in out


def test_engine_panel_gpu_line():
    from llamatui.app.tui.widgets.engine_panel import gpu_fact
    on_gpu = types.SimpleNamespace(n_layer=30, n_gpu_layers=31, vram_bytes=150_000_000,
                                   gpu_note="")
    assert gpu_fact(on_gpu) == "31/31 layers, 150.0 MB VRAM"
    no_cupy = types.SimpleNamespace(n_layer=30, n_gpu_layers=0, gpu_note=(
        "GPU offload unavailable: CuPy is not installed (...); running on the CPU"))
    assert gpu_fact(no_cupy) == ""
    oom = types.SimpleNamespace(n_layer=30, n_gpu_layers=0, gpu_note=(
        "out of memory on GPU 0: 90 MiB asked for, 10 MiB free while loading the model; "
        "running on the CPU"))
    assert gpu_fact(oom) == oom.gpu_note
    assert gpu_fact(types.SimpleNamespace(n_layer=2)) == ""  # an info without GPU fields
