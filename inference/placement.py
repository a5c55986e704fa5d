"""Which layers go to which GPU: llama.cpp's `-ngl`, `-sm`, `-mg`, `-ts` and `--no-kv-offload`.

The rules are those of llama_model::load_tensors (src/llama-model.cpp) and llama_model_load
(src/llama.cpp):

- The model has n_layer repeating layers and an output layer (output norm and matrix), counted
  as layer n_layer. With `-ngl N`, layers from `i_gpu_start = max(n_layer + 1 - N, 0)` on are
  offloaded: the output layer goes first (N = 1 offloads it alone), then the last N - 1
  repeating layers. `-ngl all` or a negative N offloads every layer and the output.
- The input layer (token embeddings) always stays on the CPU. When the output matrix is the
  token embedding (tied embeddings) an offloaded output layer gets its own copy on the device,
  so `output_bytes` is that matrix's size either way.
- Split mode `layer` (llama.cpp's default) spreads the offloaded layers over all devices in
  proportion to `-ts` (or, without it, to each device's free memory): layer il goes to the first
  device whose cumulative share exceeds (il - i_gpu_start) / n_offloaded. Split mode `none` puts
  them all on `-mg`.
- The KV cache of a layer lives with the layer unless `--no-kv-offload`.
- `-ngl auto`: the most layers that fit, each device keeping `margin` bytes free (llama.cpp's
  --fit keeps 1 GiB per device by default; `auto_margin` adds the working memory of a forward
  pass on the device, `device_work_bytes`). The engine's loader and the recommender's labels
  both plan through `plan_offload` with `auto_margin`, so a label ("partial GPU offload (N
  layers)") is the plan the loader follows with -ngl auto.

The options arrive checked, as one `OffloadOptions` (config.py, built once where they come in);
`plan_offload` checks only what needs the devices: that `-mg` names one, and that `-ts` gives one
non-negative share per device.

`Placement` is the outcome: the backend of every part of a model (the CPU's, or a GPU's from
`cuda.offload.place`), with `model_sizes` and `work_bytes` measuring a model for the plan.

Pure Python: it imports no GPU library, so it is tested with simulated devices.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .config import OffloadError, OffloadOptions
from .memory import CACHE_BYTES_PER_VALUE, kv_cell_bytes, kv_cell_values

__all__ = ["DEFAULT_MARGIN", "CACHE_BYTES_PER_VALUE", "ModelDims", "OffloadError", "OffloadPlan",
           "Placement", "auto_margin", "cpu_only", "device_work_bytes", "model_sizes",
           "plan_offload", "work_bytes"]

DEFAULT_MARGIN = 1 << 30  # llama.cpp's fit_params_target: 1 GiB per device
# the CUDA backend's working-memory caps (inference/cuda/backend.py: TILE_VALUES, SCORE_VALUES)
TILE_BYTES = (64 << 20) * 2
SCORE_BYTES = (32 << 20) * 4


@dataclass(frozen=True)
class OffloadPlan:
    """Where each part of the model lives: a device index, or None for the CPU."""
    layer_device: tuple[int | None, ...]  # per repeating layer
    output_device: int | None
    kv_device: tuple[int | None, ...]  # per layer: its K and V cache
    device_bytes: tuple[int, ...]  # per device: weights and KV cache planned there
    n_gpu_layers: int  # the resolved -ngl: layers offloaded, the output layer counted

    @property
    def n_layer(self) -> int:
        return len(self.layer_device)

    def describe(self) -> str:
        """llama.cpp's summary line, with the per-device counts."""
        per_device: dict[int, int] = {}
        for d in self.layer_device:
            if d is not None:
                per_device[d] = per_device.get(d, 0) + 1
        where = ", ".join(f"GPU {d}: {n}" for d, n in sorted(per_device.items()))
        output = "CPU" if self.output_device is None else f"GPU {self.output_device}"
        return (f"offloaded {self.n_gpu_layers}/{self.n_layer + 1} layers to GPU "
                f"(repeating layers {where or 'none'}; output layer on {output})")


def _per_layer(name: str, value, n_layer: int) -> list[int]:
    if isinstance(value, (int, np.integer)):
        values = [int(value)] * n_layer
    else:
        values = [int(v) for v in value]
    if len(values) != n_layer or any(v < 0 for v in values):
        raise OffloadError(f"{name}: expected {n_layer} non-negative sizes (or one), got {value!r}")
    return values


def _cumulative_splits(devices_free: Sequence[int], tensor_split) -> list[np.float32]:
    """llama.cpp's split points: cumulative shares in float32, the last one exactly 1."""
    n = len(devices_free)
    if tensor_split is None or all(float(s) == 0.0 for s in tensor_split):
        shares = [np.float32(f) for f in devices_free]
    else:
        if len(tensor_split) != n or any(float(s) < 0 for s in tensor_split):
            raise OffloadError(f"-ts: expected {n} non-negative shares (one per device), "
                               f"got {list(tensor_split)!r}")
        shares = [np.float32(s) for s in tensor_split]
    total = np.float32(0.0)
    cumulative = []
    for s in shares:
        total = np.float32(total + s)
        cumulative.append(total)
    if total <= 0:  # no free memory reported anywhere: split evenly
        return [np.float32(i + 1) / np.float32(n) for i in range(n)]
    return [np.float32(c / total) for c in cumulative]


def _assign(n_layer: int, n_gpu: int, devices: list[int], splits) -> list[int | None]:
    """Device of layers 0..n_layer (the last is the output layer) for -ngl n_gpu."""
    i_gpu_start = max(n_layer + 1 - n_gpu, 0)
    n_offloaded = min(n_gpu, n_layer + 1)
    placement: list[int | None] = []
    for il in range(n_layer + 1):
        if not devices or il < i_gpu_start:
            placement.append(None)
            continue
        fraction = np.float32(il - i_gpu_start) / np.float32(n_offloaded)
        k = next(i for i, s in enumerate(splits) if s > fraction)  # std::upper_bound
        placement.append(devices[k])
    return placement


def _plan(n_layer, n_gpu, devices, splits, layer_bytes, output_bytes, kv_bytes, offload_kv,
          n_devices) -> OffloadPlan:
    placement = _assign(n_layer, n_gpu, devices, splits)
    layers, output = placement[:n_layer], placement[n_layer]
    kv = [d if offload_kv else None for d in layers]
    used = [0] * n_devices
    for il, d in enumerate(layers):
        if d is not None:
            used[d] += layer_bytes[il]
        if kv[il] is not None:
            used[kv[il]] += kv_bytes[il]
    if output is not None:
        used[output] += output_bytes
    offloaded = sum(d is not None for d in placement)
    return OffloadPlan(tuple(layers), output, tuple(kv), tuple(used), offloaded)


def plan_offload(n_layer: int, layer_bytes, output_bytes: int, kv_bytes_per_layer,
                 devices_free: Sequence[int], options: OffloadOptions,
                 margin: int = DEFAULT_MARGIN) -> OffloadPlan:
    """Place the layers of a model of `n_layer` repeating layers on the devices, as
    llama_model::load_tensors does for the offload options (see the module docstring).

    layer_bytes / kv_bytes_per_layer: bytes of each repeating layer's weights and of its KV
    cache (one int for all layers, or one per layer); output_bytes: the output norm and matrix
    (the token embedding's size when they are tied); devices_free: free bytes per device
    (cudaMemGetInfo), which also sets the default split; options: -ngl, -mg, -ts, -sm and
    --no-kv-offload, already checked (OffloadOptions); margin: bytes `auto` leaves free on each
    device. Here the options meet the devices: OffloadError for a -mg device that does not
    exist, or -ts shares that are not one non-negative number per device.
    """
    n_layer = int(n_layer)
    if n_layer < 0:
        raise OffloadError(f"n_layer must be >= 0, got {n_layer}")
    layer_bytes = _per_layer("layer_bytes", layer_bytes, n_layer)
    kv_bytes = _per_layer("kv_bytes_per_layer", kv_bytes_per_layer, n_layer)
    free = [int(f) for f in devices_free]
    if free and options.main_gpu >= len(free):
        raise OffloadError(f"-mg: device {options.main_gpu} does not exist "
                           f"({len(free)} device(s): 0..{len(free) - 1})")
    by_layer = options.split_mode == "layer"
    devices = list(range(len(free))) if by_layer else [options.main_gpu] if free else []
    splits = _cumulative_splits([free[d] for d in devices],
                                options.tensor_split if by_layer else None) if devices else []

    def plan(n_gpu: int) -> OffloadPlan:
        return _plan(n_layer, n_gpu, devices, splits, layer_bytes, int(output_bytes), kv_bytes,
                     options.offload_kv, len(free))

    ngl = options.n_gpu_layers
    if ngl == "all" or (isinstance(ngl, int) and ngl < 0):
        return plan(n_layer + 1)
    if ngl != "auto":
        return plan(ngl)
    for n_gpu in range(n_layer + 1, 0, -1):  # -ngl auto: the most layers that fit
        candidate = plan(n_gpu)
        if all(used + margin <= f or used == 0 for used, f in zip(candidate.device_bytes, free)):
            return candidate
    return plan(0)


@dataclass(frozen=True)
class ModelDims:
    """The widths a forward pass's working memory grows with (HParams' names; n_head_kv: the
    most of any layer)."""
    n_embd: int
    n_ff: int
    n_vocab: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int

    @classmethod
    def of(cls, hp) -> "ModelDims":
        """The dims of a model's HParams."""
        return cls(hp.n_embd, hp.n_ff, hp.n_vocab, hp.n_head, hp.n_head_kv, hp.head_dim_k,
                   hp.head_dim_v)


def device_work_bytes(dims: ModelDims, n_ctx: int, n_ubatch: int = 512,
                      largest_matrix: int = 0) -> int:
    """The most device memory a forward pass uses besides weights and KV rows (the CUDA
    backend's compute buffers, as llama.cpp reserves its compute buffer): a micro-batch's
    activations and logits, the fp16 tile of the largest matrix (`largest_matrix` values,
    capped as the backend caps it), attention scores (capped) and every cell's K and V in
    float32 for a prompt's attention."""
    d = dims
    u = max(1, min(n_ubatch, n_ctx))
    width = 4 * d.n_embd + d.n_head * (d.head_dim_k + d.head_dim_v) + 3 * d.n_ff + d.n_vocab
    activations = 4 * u * width
    tile = min(2 * largest_matrix, TILE_BYTES) + 2 * u * max(d.n_embd, d.n_ff)
    scores = min(4 * d.n_head * u * n_ctx, SCORE_BYTES)
    kv_f32 = 4 * n_ctx * d.n_head_kv * (d.head_dim_k + d.head_dim_v)
    return int(activations + tile + scores + kv_f32)


def auto_margin(work_bytes: int) -> int:
    """Bytes `-ngl auto` leaves free on each device: llama.cpp's margin and the compute buffers."""
    return DEFAULT_MARGIN + int(work_bytes)


# ----------------------------------------------------------------------------- a model's placement



@dataclass
class Placement:
    """The backend of every part of a model (see the module docstring)."""
    input: object
    layers: list
    kv: list
    output: object
    plan: OffloadPlan | None = None
    note: str = ""  # why the GPU is not used (one line), or ""
    gpu_backends: list = field(default_factory=list)

    @property
    def backends(self) -> list:
        """Every distinct backend, the CPU's first."""
        seen = []
        for be in (self.input, *self.layers, *self.kv, self.output):
            if not any(be is s for s in seen):
                seen.append(be)
        return seen

    @property
    def n_gpu_layers(self) -> int:
        return self.plan.n_gpu_layers if self.plan is not None else 0

    def close(self) -> None:
        for be in self.gpu_backends:
            be.close()


def cpu_only(cpu, n_layer: int, note: str = "") -> Placement:
    return Placement(cpu, [cpu] * n_layer, [cpu] * n_layer, cpu, None, note)


def model_sizes(gguf, hp, n_ctx: int, type_k: str, type_v: str) -> tuple[list, int, list]:
    """(bytes of each repeating layer's tensors, bytes of the output layer (its norm and matrix:
    the token embedding when tied), KV bytes of each layer for n_ctx cells: none for a layer
    that keeps no K/V, memory.kv_cell_values)."""
    from .catalog import get_arch
    arch = get_arch(gguf.metadata.get("general.architecture")).load()
    layer_bytes = [0] * hp.n_layer
    for name, t in gguf.tensors.items():
        if name.startswith("blk."):
            index = name.split(".")[1]
            if index.isdigit() and int(index) < hp.n_layer:
                layer_bytes[int(index)] += t.nbytes
    output_bytes = 0
    for name in ("output.weight" if "output.weight" in gguf.tensors else "token_embd.weight",
                 "output_norm.weight"):
        if name in gguf.tensors:
            output_bytes += gguf.tensors[name].nbytes
    per_cell = kv_cell_bytes(kv_cell_values(arch, hp), type_k, type_v)
    return layer_bytes, output_bytes, [int(n_ctx * b) for b in per_cell]


def work_bytes(gguf, hp, n_ctx: int, n_ubatch: int) -> int:
    """device_work_bytes for this model."""
    largest = max((t.n_elements for t in gguf.tensors.values() if len(t.shape) == 2), default=0)
    return device_work_bytes(ModelDims.of(hp), n_ctx, n_ubatch, largest)
