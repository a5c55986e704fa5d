"""The GPU probe fails soft: without CuPy, a driver or a device it says why in one line, never
raises, and answers from its cache the second time."""
import importlib
import sys
import time
import types

import pytest

# the module (the package's `probe` attribute is the function)
probe_mod = importlib.import_module("llamatui.inference.cuda.probe")


@pytest.fixture(autouse=True)
def fresh_probe(monkeypatch):
    monkeypatch.setattr(probe_mod, "_cached", None)
    yield
    probe_mod._cached = None


class FakeRuntimeError(Exception):
    def __init__(self, status):
        super().__init__(f"cudaError {status}")
        self.status = status


def fake_cupy(monkeypatch, count=2, count_error=None, props_error=None):
    """A stand-in `cupy` module with `count` devices (or getDeviceCount raising)."""
    calls = {"getDeviceCount": 0}

    def get_device_count():
        calls["getDeviceCount"] += 1
        if count_error is not None:
            raise count_error
        return count

    current = {"device": 0}

    class Device:
        def __init__(self, index):
            self.index = index

        def __enter__(self):
            current["device"] = self.index

        def __exit__(self, *exc):
            current["device"] = 0

    def get_device_properties(index):
        if props_error is not None:
            raise props_error
        return {"name": f"Fake GPU {index}".encode(), "major": 9, "minor": 0}

    def mem_get_info():
        return (10 + current["device"]) << 30, 16 << 30

    runtime = types.SimpleNamespace(getDeviceCount=get_device_count,
                                    getDeviceProperties=get_device_properties,
                                    memGetInfo=mem_get_info)
    module = types.ModuleType("cupy")
    module.cuda = types.SimpleNamespace(runtime=runtime, Device=Device)
    monkeypatch.setitem(sys.modules, "cupy", module)
    monkeypatch.setattr(probe_mod, "_kernel_compiler_missing", lambda: "")
    return calls


def test_without_cupy_it_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # what an absent package looks like
    found = probe_mod.probe()
    assert not found.available and found.devices == ()
    assert "CuPy is not installed" in found.reason and "llamatui[gpu]" in found.reason
    assert found.describe().count("\n") == 0 and "running on the CPU" in found.describe()


def test_without_cupy_it_looks_without_importing(monkeypatch):
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    monkeypatch.setattr(probe_mod.importlib.util, "find_spec",
                        lambda name: None if name == "cupy" else pytest.fail(name))
    start = time.perf_counter()
    found = probe_mod.probe()
    assert time.perf_counter() - start < 1.0
    assert "CuPy is not installed" in found.reason


def test_a_broken_cupy_install_is_reported_in_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", types.ModuleType("cupy"))

    def broken(name):
        raise ImportError("libcudart.so.12: cannot open shared object file\nmore detail")

    monkeypatch.setattr(probe_mod.importlib, "import_module", broken)
    found = probe_mod.probe()
    assert not found.available
    assert found.reason == ("CuPy failed to import (ImportError: libcudart.so.12: cannot open "
                            "shared object file)")


@pytest.mark.parametrize("status, words", [(35, "driver is missing"), (100, "no CUDA device"),
                                           (999, "cudaError 999")])
def test_no_driver_or_no_device_is_named(monkeypatch, status, words):
    fake_cupy(monkeypatch, count_error=FakeRuntimeError(status))
    found = probe_mod.probe()
    assert not found.available and words in found.reason


def test_zero_devices(monkeypatch):
    fake_cupy(monkeypatch, count=0)
    assert probe_mod.probe().reason == "no CUDA device found"


def test_devices_are_listed_with_their_free_memory(monkeypatch):
    fake_cupy(monkeypatch, count=2)
    found = probe_mod.probe()
    assert found.available and found.reason == ""
    assert [(d.index, d.name, d.free_bytes >> 30, d.total_bytes >> 30, d.compute_capability)
            for d in found.devices] == [(0, "Fake GPU 0", 10, 16, (9, 0)),
                                        (1, "Fake GPU 1", 11, 16, (9, 0))]
    assert "GPU 1: Fake GPU 1 (16.0 GiB, 11.0 GiB free, compute 9.0)" in found.describe()


def test_the_answer_is_cached_until_refreshed(monkeypatch):
    calls = fake_cupy(monkeypatch)
    first = probe_mod.probe()
    assert probe_mod.probe() is first and calls["getDeviceCount"] == 1
    probe_mod.probe(refresh=True)
    assert calls["getDeviceCount"] == 2


def test_an_unexpected_error_becomes_a_reason(monkeypatch):
    fake_cupy(monkeypatch, props_error=RuntimeError("device fell off the bus\ntrace"))
    found = probe_mod.probe()
    assert not found.available
    assert found.reason == "the GPU probe failed: RuntimeError: device fell off the bus"


def test_devices_without_a_kernel_compiler_are_not_usable(monkeypatch):
    fake_cupy(monkeypatch)
    monkeypatch.setattr(probe_mod, "_kernel_compiler_missing", lambda: "numba cannot find NVVM")
    found = probe_mod.probe()
    assert not found.available and len(found.devices) == 2 and "NVVM" in found.reason


def test_this_machine_gets_an_answer():
    found = probe_mod.probe()
    assert found.available or found.reason
