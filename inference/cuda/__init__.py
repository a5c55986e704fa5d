"""GPU offload through CUDA: device kernels (numba `@cuda.jit`), the device probe, and a model's
backends placed on the GPUs as the device-neutral plan (`inference/placement.py`, llama.cpp's
`-ngl`, `-mg`, `-ts`, `--no-kv-offload`) says.

- `probe` (probe.py): is there a usable GPU, and why not: cached, never raises, imports nothing
  heavy when CuPy is absent.
- `place` (offload.py): a model's backends from those options and the probe, the CPU with one
  line saying why when there is no usable GPU.
- `CUDABackend` (backend.py): the Backend of one GPU: weights uploaded as GGUF blocks, its
  layers' KV rows, every op of a layer; through `runtime.py`'s device seam (CuPy on a GPU,
  numba's simulator in CI); `graphs.py` replays decode steps as CUDA graphs.
- kernels: `dequant.py` (per-type block decoders, dequantize / get-rows), `matvec.py` (fused
  dequantize-dot for decoding), `attention.py` (softmax attention over the f32 / f16 / q8_0 KV
  cache), `elementwise.py` (RMS norm, RoPE, SwiGLU, GeGLU), `kv.py` (K/V rows written in
  the cache's type), `sampling.py` (greedy tokens, so that a greedy step downloads token ids); `device.py` holds what the GPU and numba's CUDA simulator do differently.

This package imports numba.cuda only through the kernel and backend modules; `probe` and
`place` are importable on any machine (`place` imports the backend only when
a GPU is there). The kernels and the backend run unchanged under `NUMBA_ENABLE_CUDASIM=1`, which
is how CI checks them against the CPU backend without a GPU.
"""
from .probe import GPUDevice, GPUProbe, probe

__all__ = ["GPUDevice", "GPUProbe", "probe"]
