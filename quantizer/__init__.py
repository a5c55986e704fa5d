"""Quantize float32 rows to ggml's types, byte for byte as ggml does.

`quantize(type_name, rows, imatrix=None)` covers F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K,
Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS, with and without an importance matrix.

Modules: `numeric` (float32 rounding, fp16), `search` (ggml's scale searches), `legacy`, `kquants`
and `iquants` (numba row kernels), `floats` (F16/BF16), `rows` (the table of types and `quantize`).
Numba's on-disk cache (cache=True) is keyed on each kernel's own file only: after editing
`numeric.py` or `search.py`, clear quantizer/__pycache__ or the other modules' kernels stay stale.
"""
from llamatui.quantizer.rows import QUANTIZERS, quantize

__all__ = ["QUANTIZERS", "quantize"]
