"""How much memory a model will take in OUR engine, and which quantization this machine can run.

    est = estimate_file(path, n_ctx=4096)                # a local GGUF file
    est = estimate_remote(repo, filename, n_ctx=4096)    # the first bytes of a Hub file (Range)
    est = estimate_hub_info(listing.gguf, size)          # the Hub's `gguf` summary (approximate)
    fit = assess(est, hardware.detect())                 # "fits in GPU", "fits in RAM", ...
    plan = offload_plan(est, [g.vram_free for g in hw.gpus])   # what -ngl auto will offload
    rec = recommend(listing, hw, n_ctx=4096)             # every quantization, and the best one

The estimate is what the engine's process holds at its peak (resident memory), in parts:

- weights: the GGUF file, memory-mapped; running the model touches every page of it.
- KV cache: the engine allocates n_ctx cells on every layer that keeps K/V (`inference/kv_cache.py`),
  sliding-window layers included: per layer n_ctx * n_head_kv * (head_dim_k + head_dim_v) * bytes
  per value (f32 4, f16 2, q8_0 34/32), as the family defines it (memory.kv_cell_values: Gemma 4's
  layers that reuse an earlier layer's KV and Qwen 3.5's recurrent layers keep none). llama.cpp caps a sliding-window layer at
  pad(n_swa + n_ubatch, 256) cells; its smaller figure is `kv_bytes_llama_cpp` (Gemma 3).
  The cache's pages become resident as tokens fill it: `resident_at(n_tokens)`.
- compute: the largest transient buffers of a forward pass, a micro-batch of u = min(n_ubatch,
  n_ctx) tokens against a full cache: activations (u rows of embedding/FFN width), attention
  scores (n_head * u * n_kv floats, capped by memory.ATTENTION_SCORE_FLOATS), the KQ masks (one per
  window kind), the dequantized weight tile (and its bfloat16 copy), and the logits and sampler
  over the vocabulary.
- overhead: the Python process with numpy, numba and llvmlite initialised (measured), numba's
  compiled kernels (per ggml type in use), the tokenizer's tables (per token and per merge), and
  model bookkeeping. The run that first compiles the kernels (after installing) peaks
  `first_run_extra_bytes` higher, once; that is not in `total_bytes`.

GPU labels are plans: "fits in GPU" and "partial GPU offload (N layers)" come from the engine's
own planner (`inference.placement.plan_offload`, llama.cpp's -ngl rule, the output layer
counted as a layer) with the margin -ngl auto keeps, so N is what the loader offloads with
-ngl auto on the same free memory.

The constants were measured on x86-64 Linux (Python 3.11, numba 0.61, NumPy 2) with
benchmarks/bench_memory.py, which prints estimate against peak RSS for the starter models; the
test suite checks they stay within 15 %. The app's own UI (Textual) is not included.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from llamatui.inference.catalog import ARCHITECTURES, MIXES_BY_NAME, Arch
from llamatui.inference.config import OffloadOptions
from llamatui.inference.placement import (ModelDims, OffloadPlan, auto_margin, device_work_bytes,
                                          plan_offload)
from llamatui.inference.hparams import ModelMetadataError, read_hparams
from llamatui.inference.memory import (ATTENTION_SCORE_FLOATS, CACHE_BYTES_PER_VALUE,
                                       DEQUANT_TILE_BYTES, kv_cell_bytes, kv_cell_values)
from llamatui.inference.recurrent import CHECKPOINTS_PER_SEQUENCE
from llamatui.inference.support import engine_types, runs_here

MiB = 1 << 20

# --- measured (benchmarks/bench_memory.py): the process before any model is opened: CPython,
# numpy, numba + llvmlite with LLVM initialised, llamatui.inference imported.
RUNTIME_BYTES = 165 * MiB
# numba kernels for one ggml type (decode matvec + dequantizing tile), loaded from numba's cache
KERNEL_BYTES_PER_TYPE = 6 * MiB
# tokenizer tables: per vocabulary entry (packed texts, hash table, scores, attributes: 6 MiB +
# 3 MiB for Gemma 3's 262,144), per BPE merge
TOKEN_BYTES = 36
MERGE_BYTES = 180
# The first run after installing (or upgrading) compiles the kernels: LLVM's working memory
# adds this much to that run's peak, once (measured: 45-70 MiB for the starter models).
FIRST_RUN_EXTRA_BYTES = 70 * MiB
# Model bookkeeping (norm vectors as float32, RoPE tables, cell arrays, batch arrays)
MODEL_MISC_BYTES = 4 * MiB
# logits row, sampler candidates (ids, probabilities, sort buffers), per vocabulary entry
VOCAB_WORK_BYTES = 24
# Defaults of the engine, read from it when importable
DEFAULT_N_UBATCH = 512
RAM_USABLE_FRACTION = 0.9  # of psutil's "available"


# ----------------------------------------------------------------------------- model shape


def _layer_of(tensor_name: str) -> int | None:
    """The layer of a `blk.N.*` tensor; None for the others."""
    if not tensor_name.startswith("blk."):
        return None
    index = tensor_name.split(".")[1]
    return int(index) if index.isdigit() else None


def _array_len(md, key: str) -> int:
    """An array's element count (0 when absent or not an array), undecoded when md can."""
    if key not in md:
        return 0
    if hasattr(md, "length"):
        return md.length(key) or 0
    value = md[key]
    return len(value) if hasattr(value, "__len__") and not isinstance(value, (str, bytes)) else 0


@dataclass
class ModelShape:
    """What the estimate needs from a model: hyperparameters and where the bytes are."""
    architecture: str | None
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: list[int]  # per layer
    head_dim_k: int
    head_dim_v: int
    n_vocab: int
    n_merges: int
    n_ctx_train: int | None
    n_params: int | None
    file_bytes: int
    layer_bytes: list[int]  # tensor bytes of each blk.{i}
    other_bytes: int  # token_embd, output, norms outside the blocks
    tensor_types: frozenset[str] = frozenset()
    n_swa: int = 0
    swa_layers: tuple[bool, ...] = ()
    approximate: bool = False
    source: str = "header"  # "header", "remote header", "hub info"
    output_bytes: int = 0  # the output layer: its norm and matrix (token_embd's when tied)
    largest_matrix: int = 0  # values of the largest weight matrix
    encoder: bool = False  # an embedding model (BERT): the engine gives it no KV cache
    # per layer, the K and V values a cache cell holds, from the family (memory.kv_cell_values);
    # empty: n_head_kv * head_dim_k / _v on every layer (a shape from the Hub's summary)
    kv_values: tuple = ()
    state_bytes_per_sequence: int = 0  # a hybrid model's recurrent states (Qwen 3.5)

    @classmethod
    def from_gguf(cls, g, file_bytes: int | None = None, source: str = "header"
                  ) -> "ModelShape":
        """The shape from a GGUF header, through the engine's own hyperparameter reader (every
        value checked: a broken file raises ModelMetadataError, a ValueError). A family the
        engine does not run is read by the keys all families share."""
        name = g.metadata.get("general.architecture")
        if not isinstance(name, str):
            raise ModelMetadataError(f"general.architecture = {name!r}: expected a string")
        spec = ARCHITECTURES.get(name)
        hp = read_hparams(g, spec or Arch(name, "", name), family=False)
        layer_bytes = [0] * hp.n_layer
        other = 0
        for tname, t in g.tensors.items():
            il = _layer_of(tname)
            if il is not None and il < hp.n_layer:
                layer_bytes[il] += t.nbytes
            else:
                other += t.nbytes
        fsize = file_bytes if file_bytes is not None else getattr(g, "file_size", 0)
        output = "output.weight" if "output.weight" in g.tensors else "token_embd.weight"
        output_bytes = sum(g.tensors[n].nbytes for n in (output, "output_norm.weight")
                           if n in g.tensors)
        return cls(
            architecture=name, n_layer=hp.n_layer, n_embd=hp.n_embd,
            n_ff=max(hp.n_ff, hp.n_ff_exp * max(1, hp.n_expert_used) + hp.n_ff_shexp),
            n_head=hp.n_head, n_head_kv=[hp.n_head_kv] * hp.n_layer, head_dim_k=hp.head_dim_k,
            head_dim_v=hp.head_dim_v, n_vocab=hp.n_vocab,
            n_merges=_array_len(g.metadata, "tokenizer.ggml.merges"),
            n_ctx_train=hp.n_ctx_train if f"{name}.context_length" in g.metadata else None,
            n_params=int(sum(t.n_elements for t in g.tensors.values())),
            file_bytes=int(fsize), layer_bytes=layer_bytes, other_bytes=other,
            tensor_types=frozenset(t.type for t in g.tensors.values() if len(t.shape) >= 2),
            n_swa=hp.n_swa if hp.swa_layers else 0, swa_layers=hp.swa_layers, source=source,
            output_bytes=output_bytes,
            largest_matrix=max((t.n_elements for t in g.tensors.values() if len(t.shape) == 2),
                               default=0),
            encoder=hp.encoder, **_family_memory(g, spec))

    def cell_values(self) -> list[tuple[int, int]]:
        """Per layer, the K and V values one cache cell holds."""
        if self.kv_values:
            return list(self.kv_values)
        return [(0, 0) if self.encoder else (h * self.head_dim_k, h * self.head_dim_v)
                for h in self.n_head_kv]

    @classmethod
    def from_hub_info(cls, summary, file_bytes: int) -> "ModelShape":
        """A rough shape from the Hub's gguf summary (parameters, architecture, context) and the
        file size, by the proportions of common GQA transformers (Llama 3, Qwen 2.5, Gemma 3).
        Marked approximate: KV and compute may be off by 2x for unusual models."""
        params = int(getattr(summary, "parameters", None) or max(file_bytes * 2, 1))
        # n_layer ~ 16 at 1B, 32 at 8B, 80 at 70B; width from 12 * n_layer * n_embd^2 = params
        n_layer = max(4, round(32 * (params / 8e9) ** 0.36))
        n_embd = max(256, int(math.sqrt(params / (12 * n_layer)) // 64 * 64))
        head_dim = 128 if n_embd >= 2048 else 64
        n_head = max(1, n_embd // head_dim)
        n_head_kv = max(1, n_head // 4)
        n_vocab = 151_936 if params > 1e9 else 65_536
        embd_bytes = int(file_bytes * min(0.3, n_vocab * n_embd / params)) if params else 0
        per_layer = (file_bytes - embd_bytes) // n_layer
        return cls(
            architecture=getattr(summary, "architecture", None), n_layer=n_layer, n_embd=n_embd,
            n_ff=int(n_embd * 3.5), n_head=n_head, n_head_kv=[n_head_kv] * n_layer,
            head_dim_k=head_dim, head_dim_v=head_dim, n_vocab=n_vocab, n_merges=n_vocab,
            n_ctx_train=getattr(summary, "context_length", None), n_params=params,
            file_bytes=int(file_bytes), layer_bytes=[per_layer] * n_layer,
            other_bytes=embd_bytes, tensor_types=frozenset(), approximate=True,
            source="hub info", output_bytes=embd_bytes, largest_matrix=n_vocab * n_embd)

    def with_file_bytes(self, file_bytes: int, tensor_types: frozenset | None = None
                        ) -> "ModelShape":
        """The same model at another quantization: bytes scaled to the new file size."""
        scale = file_bytes / self.file_bytes if self.file_bytes else 1.0
        return ModelShape(**{**self.__dict__, "file_bytes": int(file_bytes),
                             "layer_bytes": [int(b * scale) for b in self.layer_bytes],
                             "other_bytes": int(self.other_bytes * scale),
                             "output_bytes": int(self.output_bytes * scale),
                             "tensor_types": tensor_types if tensor_types is not None
                             else self.tensor_types})

    @property
    def engine_supported(self) -> bool | None:
        """Whether our engine can run it (architecture and every tensor type); None unknown."""
        if self.approximate:
            return None if self.architecture is None else \
                (self.architecture in ARCHITECTURES or None)
        return runs_here(self.architecture, self.tensor_types)


# ----------------------------------------------------------------------------- the estimate


@dataclass
class MemoryEstimate:
    shape: ModelShape
    n_ctx: int
    n_ubatch: int
    cache_type_k: str
    cache_type_v: str
    weights_bytes: int
    kv_bytes: int  # as the engine allocates it (every layer n_ctx cells)
    kv_bytes_llama_cpp: int  # sliding-window layers capped, as llama.cpp does
    kv_bytes_per_token: int
    compute_bytes: int  # peak transient buffers at a full micro-batch against a full cache
    runtime_bytes: int
    kernels_bytes: int
    tokenizer_bytes: int
    misc_bytes: int
    score_budget: int = ATTENTION_SCORE_FLOATS
    tile_bytes: int = DEQUANT_TILE_BYTES
    state_bytes: int = 0  # recurrent states: one sequence's live ones and its checkpoints

    @property
    def approximate(self) -> bool:
        return self.shape.approximate

    @property
    def overhead_bytes(self) -> int:
        return self.runtime_bytes + self.kernels_bytes + self.tokenizer_bytes + self.misc_bytes

    @property
    def total_bytes(self) -> int:
        """Peak resident memory with the whole context in use (kernels already compiled)."""
        return (self.weights_bytes + self.kv_bytes + self.state_bytes + self.compute_bytes
                + self.overhead_bytes)

    @property
    def first_run_extra_bytes(self) -> int:
        """More, once, on the run that compiles the kernels (numba's cache empty)."""
        return FIRST_RUN_EXTRA_BYTES

    def compute_at(self, n_tokens: int, n_kv: int | None = None) -> int:
        """Transient buffers of a micro-batch of `n_tokens` against `n_kv` cells."""
        s = self.shape
        u = max(1, min(n_tokens, self.n_ubatch))
        n_kv = max(u, n_kv if n_kv is not None else u)
        width = (4 * s.n_embd + s.n_head * (s.head_dim_k + s.head_dim_v)
                 + 2 * max(s.n_head_kv or [1]) * s.head_dim_k + 3 * s.n_ff)
        activations = 4 * u * width
        scores = 4 * min(u * s.n_head * n_kv, self.score_budget) if u > 8 else \
            4 * u * s.n_head * n_kv
        n_masks = 2 if s.n_swa else 1
        masks = 4 * u * n_kv * n_masks
        kv_f32 = 4 * n_kv * max(s.n_head_kv or [1]) * (s.head_dim_k + s.head_dim_v) if u > 8 else 0
        vocab = VOCAB_WORK_BYTES * s.n_vocab
        tile = self.tile_bytes * 3 // 2 if u > 4 else 0  # the float32 tile and its bf16 copy
        return int(activations + scores + masks + kv_f32 + vocab + tile)

    def resident_at(self, n_tokens: int) -> int:
        """Expected peak resident memory once `n_tokens` are in the cache, having been processed
        in micro-batches of n_ubatch (a chat prompt, then generated tokens)."""
        n = max(0, min(n_tokens, self.n_ctx))
        u = min(n, self.n_ubatch) if n else 1
        return (self.weights_bytes + self.kv_bytes_per_token * n + self.state_bytes
                + self.compute_at(u, n) + self.overhead_bytes)

    def breakdown(self) -> list[tuple[str, int, str]]:
        """(part, bytes, note) rows, for display."""
        s = self.shape
        swa_note = ""
        if s.n_swa and self.kv_bytes_llama_cpp < self.kv_bytes:
            swa_note = (f"; llama.cpp: {self.kv_bytes_llama_cpp / MiB:.0f} MiB with the "
                        f"{s.n_swa}-token window")
        rows = [
            ("weights (mmap'd file)", self.weights_bytes,
             f"{s.n_params / 1e6:.0f}M parameters" if s.n_params else ""),
            ("KV cache", self.kv_bytes,
             f"{self.n_ctx} tokens × {sum(v != (0, 0) for v in s.cell_values())} layers, "
             f"{self.cache_type_k}/{self.cache_type_v}" + swa_note),
            ("compute buffers", self.compute_bytes,
             f"micro-batch of {min(self.n_ubatch, self.n_ctx)} tokens, logits over "
             f"{s.n_vocab} tokens"),
            ("runtime (Python, numba)", self.runtime_bytes, "measured"),
            ("kernels", self.kernels_bytes, ", ".join(sorted(s.tensor_types)) or "estimated"),
            ("tokenizer", self.tokenizer_bytes, f"{s.n_vocab} tokens"
             + (f", {s.n_merges} merges" if s.n_merges else "")),
            ("model bookkeeping", self.misc_bytes, ""),
        ]
        if self.state_bytes:
            rows.insert(2, ("recurrent states", self.state_bytes,
                            f"one sequence and {CHECKPOINTS_PER_SEQUENCE} checkpoints"))
        # (not in the total) the first run compiles the kernels: FIRST_RUN_EXTRA_BYTES more
        return rows

    def as_dict(self) -> dict:
        return {"n_ctx": self.n_ctx, "total_bytes": self.total_bytes,
                "approximate": self.approximate, "source": self.shape.source,
                "parts": {k: v for k, v, _ in self.breakdown()},
                "kv_bytes_llama_cpp": self.kv_bytes_llama_cpp,
                "engine_supported": self.shape.engine_supported}

    # GPU planning
    def layer_bytes(self, il: int) -> int:
        """Weights and KV of layer `il` (what offloading it moves to the GPU)."""
        return self.shape.layer_bytes[il] + self._kv_layer(il)

    @property
    def gpu_work_bytes(self) -> int:
        """The CUDA backend's compute buffers on a device (placement.device_work_bytes)."""
        s = self.shape
        dims = ModelDims(s.n_embd, s.n_ff, s.n_vocab, s.n_head, max(s.n_head_kv or [1]),
                         s.head_dim_k, s.head_dim_v)
        return device_work_bytes(dims, self.n_ctx, self.n_ubatch,
                                 s.largest_matrix or s.n_vocab * s.n_embd)

    def _kv_layer(self, il: int) -> int:
        per = kv_cell_bytes(self.shape.cell_values()[il:il + 1], self.cache_type_k,
                            self.cache_type_v)[0]
        return int(per * self.n_ctx)


def _family_memory(g, spec) -> dict:
    """ModelShape's kv_values and state_bytes_per_sequence as the family itself allocates them
    (memory.kv_cell_values and the family's recurrent_rows, from its own hyperparameter keys;
    imports the family's module); nothing for a family the engine does not know."""
    if spec is None:
        return {}
    family, hp = spec.load(), read_hparams(g, spec)
    recurrent = family.recurrent_rows(hp)
    return {"kv_values": tuple(kv_cell_values(family, hp)),
            "state_bytes_per_sequence": recurrent.bytes_per_sequence if recurrent else 0}


def estimate(shape: ModelShape, n_ctx: int = 4096, cache_type_k: str = "f16",
             cache_type_v: str = "f16", n_ubatch: int = DEFAULT_N_UBATCH,
             threads: int | None = None) -> MemoryEstimate:
    """The memory estimate for `shape` at context `n_ctx` (0: the model's training context)."""
    for t in (cache_type_k, cache_type_v):
        if t not in CACHE_BYTES_PER_VALUE:
            raise ValueError(f"unknown KV cache type {t!r}")
    n_ctx = int(n_ctx) if n_ctx and n_ctx > 0 else int(shape.n_ctx_train or 4096)
    s = shape
    per_layer_token = kv_cell_bytes(s.cell_values(), cache_type_k, cache_type_v)
    per_token = sum(per_layer_token)
    kv = int(per_token * n_ctx)
    # llama.cpp: a sliding-window layer holds pad(n_swa + n_ubatch, 256) cells at most
    swa_cells = min(n_ctx, -(-(s.n_swa + n_ubatch) // 256) * 256) if s.n_swa else n_ctx
    kv_llama = int(sum(b * (swa_cells if (il < len(s.swa_layers) and s.swa_layers[il])
                            else n_ctx) for il, b in enumerate(per_layer_token)))
    n_types = len(s.tensor_types & engine_types()) if s.tensor_types else 3
    budget, tile = ATTENTION_SCORE_FLOATS, DEQUANT_TILE_BYTES
    est = MemoryEstimate(
        shape=s, n_ctx=n_ctx, n_ubatch=n_ubatch, cache_type_k=cache_type_k,
        cache_type_v=cache_type_v, weights_bytes=s.file_bytes, kv_bytes=kv,
        kv_bytes_llama_cpp=kv_llama, kv_bytes_per_token=int(per_token),
        compute_bytes=0, runtime_bytes=RUNTIME_BYTES,
        kernels_bytes=KERNEL_BYTES_PER_TYPE * max(1, n_types),
        tokenizer_bytes=TOKEN_BYTES * s.n_vocab + MERGE_BYTES * s.n_merges,
        misc_bytes=MODEL_MISC_BYTES + 4 * s.n_embd * 6 * s.n_layer,
        score_budget=budget, tile_bytes=tile,
        state_bytes=s.state_bytes_per_sequence * (1 + CHECKPOINTS_PER_SEQUENCE))
    est.compute_bytes = est.compute_at(min(n_ubatch, n_ctx), n_ctx)
    return est


def estimate_file(path, n_ctx: int = 4096, cache_type_k: str = "f16", cache_type_v: str = "f16",
                  n_ubatch: int = DEFAULT_N_UBATCH, threads: int | None = None
                  ) -> MemoryEstimate:
    """Estimate for a local GGUF file (its header only is read). A split model's first shard
    opens the whole model, so every shard's tensors and bytes count."""
    from llamatui.inference.gguf import GGUFFile
    with GGUFFile.open(path) as g:
        shape = ModelShape.from_gguf(g)
    return estimate(shape, n_ctx, cache_type_k, cache_type_v, n_ubatch, threads)


def estimate_remote(repo: str, filename: str, revision: str | None = None, *,
                    file_bytes: int | None = None, n_ctx: int = 4096,
                    cache_type_k: str = "f16", cache_type_v: str = "f16",
                    n_ubatch: int = DEFAULT_N_UBATCH) -> MemoryEstimate:
    """Estimate for a Hub file from its header (fetched with Range requests). `file_bytes`: the
    model's full size (all shards) when known; else the file's own size."""
    from . import hub
    g = hub.fetch_header(repo, filename, revision)
    if file_bytes is None:
        file_bytes = hub.file_metadata(repo, filename, revision).size or 0
    shape = ModelShape.from_gguf(g, file_bytes=file_bytes, source="remote header")
    listed = sum(shape.layer_bytes) + shape.other_bytes
    if file_bytes and listed and file_bytes > 1.5 * listed and shape.n_layer:
        # a split model's first shard: its layers are elsewhere; spread the rest evenly
        per = max(0, file_bytes - shape.other_bytes) // shape.n_layer
        shape.layer_bytes = [per] * shape.n_layer
    return estimate(shape, n_ctx, cache_type_k, cache_type_v, n_ubatch)


def estimate_hub_info(summary, file_bytes: int, n_ctx: int = 4096, cache_type_k: str = "f16",
                      cache_type_v: str = "f16") -> MemoryEstimate:
    """Approximate estimate from the Hub's `gguf` summary when no header can be read."""
    return estimate(ModelShape.from_hub_info(summary, file_bytes), n_ctx, cache_type_k,
                    cache_type_v)


# ----------------------------------------------------------------------------- fitting


FITS_GPU = "fits in GPU"
FITS_RAM = "fits in RAM"
TOO_LARGE = "too large"


@dataclass
class Fit:
    """Where a model can run on this machine."""
    kind: str  # "gpu", "partial", "ram", "too_large"
    label: str  # "fits in GPU", "partial GPU offload (N layers)", "fits in RAM", "too large"
    gpu_layers: int  # what -ngl auto offloads (llama.cpp's count: the output layer is one)
    ram_bytes: int  # host memory needed in that configuration
    vram_bytes: int
    estimate: MemoryEstimate
    quant: str | None = None
    file: str | None = None
    supported: bool | None = None  # by our engine
    note: str = ""

    @property
    def fits(self) -> bool:
        return self.kind != "too_large"


def offload_plan(est: MemoryEstimate, devices_free) -> OffloadPlan:
    """What `-ngl auto` offloads on devices with these free bytes (the loader's own rule)."""
    s = est.shape
    return plan_offload(s.n_layer, s.layer_bytes, s.output_bytes or s.other_bytes,
                        [est._kv_layer(il) for il in range(s.n_layer)], list(devices_free),
                        OffloadOptions(n_gpu_layers="auto"),
                        margin=auto_margin(est.gpu_work_bytes))


def _devices_free(hw) -> list[int]:
    gpus = getattr(hw, "gpus", None)
    if gpus is not None:
        return [int(g.vram_free or 0) for g in gpus]
    free = int(getattr(hw, "vram_free", 0) or 0)
    return [free] if free else []


def assess(est: MemoryEstimate, hw, *, quant: str | None = None, file: str | None = None
           ) -> Fit:
    """Labels an estimate against a HardwareInfo (or any object with ram_available and either
    gpus or vram_free). gpu_layers is -ngl auto's count, the output layer included."""
    ram_budget = int((getattr(hw, "ram_available", None) or 0) * RAM_USABLE_FRACTION)
    s = est.shape
    common = dict(estimate=est, quant=quant, file=file, supported=s.engine_supported)
    free = _devices_free(hw)
    plan = offload_plan(est, free) if any(free) else None
    n_gpu = plan.n_gpu_layers if plan is not None else 0
    if n_gpu:
        offloaded = sum(plan.device_bytes)
        vram = offloaded + est.gpu_work_bytes
        host_side = est.overhead_bytes  # what stays on the host with every layer on the GPU
        if n_gpu == s.n_layer + 1 and host_side <= ram_budget:
            return Fit("gpu", FITS_GPU, n_gpu, host_side, vram, **common)
        ram_need = est.total_bytes - offloaded
        if n_gpu <= s.n_layer and ram_need <= ram_budget:
            return Fit("partial", f"partial GPU offload ({n_gpu} layer{'s' * (n_gpu != 1)})",
                       n_gpu, ram_need, vram, **common)
    if est.total_bytes <= ram_budget:
        return Fit("ram", FITS_RAM, 0, est.total_bytes, 0, **common)
    return Fit("too_large", TOO_LARGE, 0, est.total_bytes, 0, note=(
        f"needs {est.total_bytes / 2**30:.1f} GiB, {ram_budget / 2**30:.1f} GiB usable"),
        **common)


@dataclass
class Recommendation:
    repo: str | None
    fits: list[Fit]  # one per quantization, listing order
    best: Fit | None  # the highest-quality quantization that fits (and the engine runs)
    n_ctx: int
    shape_source: str
    notes: list[str] = field(default_factory=list)


def recommend(listing, hw, n_ctx: int = 4096, *, cache_type_k: str = "f16",
              cache_type_v: str = "f16", fetch_header: bool = True) -> Recommendation:
    """Labels every quantization of a repository listing and picks the best that fits. One
    header is read (the default quantization's first file, by Range request) and its shape
    reused for the others with their own sizes; failing that, the Hub's gguf summary."""
    from . import hub
    notes: list[str] = []
    groups = [g for g in listing.groups if g.size]
    if not groups:
        return Recommendation(listing.repo, [], None, n_ctx, "none",
                              ["no GGUF model files with known sizes"])
    base_group = listing.default_group()
    shape = None
    if fetch_header and not listing.offline:
        try:
            est0 = estimate_remote(listing.repo, base_group.first.path, listing.revision,
                                   file_bytes=base_group.size, n_ctx=n_ctx,
                                   cache_type_k=cache_type_k, cache_type_v=cache_type_v)
            shape = est0.shape
        except Exception as e:  # noqa: BLE001 - fall back to the Hub's summary
            notes.append(f"header of {base_group.first.path} unreadable: {e}")
    if shape is None and listing.offline:
        from .store import hub_target
        local = hub_target(listing.repo, base_group.first.path)
        if local.is_file():
            shape = estimate_file(local, n_ctx).shape
    if shape is None:
        if listing.gguf is None:
            notes.append("no header and no gguf summary: sizes only")
        shape = ModelShape.from_hub_info(listing.gguf, base_group.size)
    fits = []
    for g in listing.groups:
        if not g.size:
            continue
        types = None
        if g is not base_group and not shape.approximate:
            types = _mix_types(g.quant) or shape.tensor_types
        s = shape if g is base_group else shape.with_file_bytes(g.size, types)
        est = estimate(s, n_ctx, cache_type_k, cache_type_v)
        fit = assess(est, hw, quant=g.quant, file=g.first.path)
        name_ok = hub.engine_supports(g.quant)
        if name_ok is False:
            fit.supported = False
        elif fit.supported is None:
            fit.supported = name_ok
        if not g.complete:
            fit.note = (fit.note + "; " if fit.note else "") + \
                f"only {len(g.files)} of its {g.first.shard[1]} shards are listed"
            fit.supported = False
        fits.append(fit)
    ok = [f for f in fits if f.fits and f.supported is not False]
    best = min(ok, key=lambda f: (hub.quality_rank(f.quant), -f.estimate.weights_bytes),
               default=None)
    return Recommendation(listing.repo, fits, best, n_ctx, shape.source, notes)


def _mix_types(quant: str | None) -> frozenset[str] | None:
    """The ggml types a llama.cpp mix uses for its matrices (for the kernel count)."""
    from .hub import base_quant
    mix = MIXES_BY_NAME.get(base_quant(quant) or "")
    return mix.types if mix else None
