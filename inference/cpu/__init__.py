"""The CPU backend: numba kernels on the GGUF bytes in place.

- `backend`: CPUBackend, the Backend interface on numpy and numba.
- `matmul`: quantized matrix products and their paths (decode, batch decode, prompt, packed);
  `matmul_kernels` (the float32 kernels' skeletons, the GEMMs), `matmul_floats`,
  `matmul_legacy`, `matmul_kquants`, `matmul_iquants` (each type's float32 kernels, registered
  against its class in inference/quants), `matmul_int8` (8-bit activations, integer dots),
  `matmul_packed` (interleaved rows for VNNI), `simd` (16-lane vectors and CPU features).
- `ops`: norms, RoPE, activations, softmax; `attention`: the attention kernels.
"""
