"""The host's time per decode step of a fully offloaded model, the device's work stubbed out, with
what the step asks of the device (runtime.DeviceCounters): no GPU needed.

    python benchmarks/bench_cuda_host.py [--models smollm2-135m gemma3-270m qwen2.5-0.5b]
                                         [--steps 50] [--json OUT.json]

A decode step on a GPU costs the longer of the device's time and the host's; issue 28 wants the
host's out of the way (tg128 >= 1.2x llama.cpp's ~780 tok/s on the SmolLM2 shape leaves about
1 ms per token for everything). This measures the host's part alone: the engine runs under
numba's CUDA simulator on `StubRuntime`, a simulated device whose kernels return at once
(FakeCUDAKernel's launch is a no-op), whose GEMMs compute nothing and whose captured graphs
replay nothing, so what is timed is our Python around the device: Model.decode, the forward
pass's launchers and array operations, the batch inputs' copies, the graph bookkeeping.
Values on the device are garbage; the counters are those of a real device, counted at the same
seam. Not included: numba-cuda's own dispatch per kernel launch and CuPy's per operation on a
GPU (tens of microseconds each), so the eager figure is a lower bound, and a graph's launch.

Per model (stand-ins of the starter models' shapes from gpu_models.py, and Qwen2.5-0.5B's shape
from bench_archs.py) two rows: `graphs` (the steady state: each step one graph replay) and
`eager` (LLAMATUI_CUDA_GRAPHS=0: every operation launched from Python, as the first steps of a
shape and partial offload run). Each step is a one-token decode of sequence 0; the median of
--steps steps after three warm-up steps (eager, captured, replayed) is printed.
"""
from __future__ import annotations

import os

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # before numba is first imported

import argparse
import contextlib
import json
import pathlib
import sys
import tempfile
import time
import warnings

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

PROMPT = 16
WARMUP = 3  # eager, captured, replayed
MODELS = ("smollm2-135m", "gemma3-270m", "qwen2.5-0.5b")
DEVICE_BYTES = 64 << 30  # the simulated device's memory: room for any of the shapes


def stub_runtime_class():
    """SimulatedRuntime with the device's work taken out (see the module docstring)."""
    from llamatui.inference.cuda.runtime import CapturedGraph, SimulatedRuntime

    def nothing(*args, **kwargs):
        pass

    class StubRuntime(SimulatedRuntime):
        def gemm(self, x, w, out):
            self.op(nothing, x, w, out)

        def _end_capture(self):
            graph = CapturedGraph(nothing, self._keep, self._outputs)
            self.capturing, self._ops, self._keep = False, None, []
            return graph
    return StubRuntime


@contextlib.contextmanager
def stubbed_device():
    """Model.load places layers on StubRuntime devices whose kernel launches do nothing."""
    from cuda_backend_checks import simulated_devices
    from llamatui.inference.cuda import offload, runtime
    from numba.cuda.simulator.kernel import FakeCUDAKernel
    stub = stub_runtime_class()
    launch = FakeCUDAKernel.__call__

    def no_launch(self, *args):
        return launch(self, *args) if self._device else None
    saved = runtime.make_runtime, offload.first_kernel, FakeCUDAKernel.__call__
    runtime.make_runtime = lambda index, total_bytes=None: stub(index, DEVICE_BYTES)
    offload.first_kernel = lambda rt: None  # its check reads a result the stub never computes
    FakeCUDAKernel.__call__ = no_launch
    try:
        with simulated_devices(DEVICE_BYTES):
            yield
    finally:
        runtime.make_runtime, offload.first_kernel, FakeCUDAKernel.__call__ = saved


def model_path(name: str, scratch: pathlib.Path) -> pathlib.Path:
    if name == "qwen2.5-0.5b":
        from bench_archs import cached_model
        return cached_model(name, scratch)
    from gpu_models import write_stand_in
    return write_stand_in(name, scratch)


def measure(path: pathlib.Path, graphs: bool, steps: int) -> dict:
    """The model fully offloaded to a stubbed device, with graphs or without: _steps."""
    from llamatui.inference import LoadConfig, OffloadOptions
    from llamatui.inference.model import Model
    os.environ["LLAMATUI_CUDA_GRAPHS"] = "1" if graphs else "0"
    with stubbed_device():
        model = Model.load(path, LoadConfig(n_ctx=PROMPT + WARMUP + steps + 8, offload=(
            OffloadOptions(n_gpu_layers=-1))))
        try:
            return _steps(model, steps)
        finally:
            model.close()


def _steps(model, steps: int) -> dict:
    """A prompt, the warm-up steps, then `steps` timed one-token steps: their median time and
    the last one's counters."""
    from llamatui.inference.model import Batch
    (be,) = model.placement.gpu_backends
    ids = np.random.default_rng(0).integers(0, model.n_vocab, PROMPT + WARMUP + steps)
    model.decode(Batch(ids[:PROMPT].tolist(), pos=0))
    for t in ids[PROMPT:PROMPT + WARMUP]:
        model.decode(Batch([int(t)]))
    times, counters = [], {}
    for t in ids[PROMPT + WARMUP:]:
        be.rt.counters.reset()
        t0 = time.perf_counter()
        model.decode(Batch([int(t)]))
        times.append(time.perf_counter() - t0)
        counters = be.rt.counters.take()
    return {"host_ms": float(np.median(times)) * 1e3, "layers_on_gpu": model.n_gpu_layers,
            **counters}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--cache", default=None, help="where the stand-ins are written (and reused)")
    p.add_argument("--json", default=None, help="also write the rows here")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore", RuntimeWarning)  # garbage values on the stubbed device
    scratch = pathlib.Path(args.cache or tempfile.gettempdir()) / "llamatui-host-bench"
    rows = []
    print(f"{'model':14} {'mode':6} {'host ms':>8} {'ceiling t/s':>11} {'launches':>8} "
          f"{'replays':>7} {'syncs':>5} {'H2D copies/B':>13} {'D2H copies/B':>13}", flush=True)
    for name in args.models:
        path = model_path(name, scratch)
        for mode in ("graphs", "eager"):
            r = {"model": name, "mode": mode, **measure(path, mode == "graphs", args.steps)}
            rows.append(r)
            print(f"{name:14} {mode:6} {r['host_ms']:8.3f} {1e3 / r['host_ms']:11.0f} "
                  f"{r['launches']:8d} {r['graph_replays']:7d} {r['syncs']:5d} "
                  f"{r['h2d_copies']:>4d}/{r['h2d_bytes']:<8d} "
                  f"{r['d2h_copies']:>4d}/{r['d2h_bytes']:<8d}", flush=True)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
