"""A model's backends from llama.cpp's offload options (`-ngl`, `-mg`, `-ts`, `-sm`,
`--no-kv-offload`, a LoadConfig's `offload`): which layers run on the CPU and which on which GPU.

`place(...)` follows llama_model::load_tensors through `plan_offload` (placement.py) with the
sizes of this model's tensors (`model_sizes`) and, for `-ngl auto`, each device's free memory
as cudaMemGetInfo reports it now. It never raises for want of a GPU: without CuPy, a driver or a
device it returns the CPU-only placement with `note` saying why in one line (llama.cpp prints
"no usable GPU found, --gpu-layers option will be ignored"). Nor for a CUDA toolchain that cannot
build or run kernels (a numba-cuda that breaks on the installed numpy, an NVVM newer than the
driver): each device compiles and runs a first kernel before anything is placed on it
(`first_kernel`), and when that fails the note names the error instead.

The input layer (token embeddings) stays on the CPU, as in llama.cpp, with one exception: when
every layer and the output run on one device and the output matrix is the token embedding
(tied), that device holds the matrix anyway (llama.cpp duplicates it there), so the lookup runs
there too and a decode step never leaves the device (which lets it run as one CUDA graph).
"""
from __future__ import annotations

import numpy as np

from ..config import LoadConfig
from ..placement import (Placement, auto_margin, cpu_only, model_sizes, plan_offload,
                         work_bytes)
from .probe import _one_line, probe


def place(gguf, hp, config: LoadConfig, n_ctx: int, cpu) -> Placement:
    """The placement of a model's parts (see the module docstring) for `config.offload`, with
    the KV cache of `n_ctx` cells in config's cache types and its micro-batches of
    config.n_ubatch tokens (the memory -ngl auto plans for); `cpu` is the CPU's backend. An -mg
    or -ts that does not match the devices found raises placement.OffloadError (a ValueError)."""
    options = config.offload
    if not options.uses_gpu:
        return cpu_only(cpu, hp.n_layer)
    found = probe()
    if not found.available:
        return cpu_only(cpu, hp.n_layer, found.describe())
    try:
        runtimes = _warm_runtimes(found.devices)
    except Exception as e:  # noqa: BLE001 -- the CPU runs the model; the note says why
        return cpu_only(cpu, hp.n_layer, "GPU offload unavailable: the first CUDA kernel failed "
                        f"to compile or run ({_one_line(e)}); running on the CPU")
    from .backend import CUDABackend
    free = [rt.mem_info()[0] for rt in runtimes]
    layer_bytes, output_bytes, kv_bytes = model_sizes(gguf, hp, n_ctx, config.cache_type_k,
                                                      config.cache_type_v)
    plan = plan_offload(hp.n_layer, layer_bytes, output_bytes, kv_bytes, free, options,
                        margin=auto_margin(work_bytes(gguf, hp, n_ctx, config.n_ubatch)))
    if plan.n_gpu_layers == 0:
        return cpu_only(cpu, hp.n_layer, "" if options.n_gpu_layers != "auto" else
                        "not enough free GPU memory for any layer with -ngl auto; running on "
                        "the CPU")
    backends = {}
    for d in sorted({d for d in (*plan.layer_device, plan.output_device) if d is not None}):
        backends[d] = CUDABackend(runtimes[d])
    peers = {d: be.rt for d, be in backends.items()}
    for be in backends.values():
        be.peers = peers

    def on(device):
        return cpu if device is None else backends[device]

    layers = [on(d) for d in plan.layer_device]
    output = on(plan.output_device)
    tied = "output.weight" not in gguf.tensors
    one_device = len(backends) == 1 and all(be is output for be in layers)
    kv = [on(d) for d in plan.kv_device]
    input_be = output if tied and one_device and all(be is output for be in kv) else cpu
    return Placement(input_be, layers, kv, output, plan, "", list(backends.values()))


def _warm_runtimes(devices) -> list:
    """The runtime of each device, each having run `first_kernel`."""
    from .runtime import make_runtime
    runtimes = [make_runtime(d.index, d.total_bytes) for d in devices]
    for rt in runtimes:
        first_kernel(rt)
    return runtimes


def first_kernel(rt) -> None:
    """Compiles and runs the RMS norm of a row of ones on device `rt` (what every layer runs
    first), raising whatever stops it: numba-cuda's typing, NVVM, the driver's loading of the
    PTX, the launch, or a wrong result."""
    from .device import WARP
    from .elementwise import rms_norm
    ones = np.ones((1, WARP), np.float32)
    x, w, out = rt.upload(ones), rt.upload(ones[0]), rt.empty(ones.shape, np.float32)
    rt.op(rms_norm, x, w, 1e-6, out, stream=rt.kernel_stream)
    got = rt.download(out)
    if not np.allclose(got, 1.0, rtol=1e-5):
        raise RuntimeError(f"the RMS norm of ones came back as {got.ravel()[:4]}, not ones")
