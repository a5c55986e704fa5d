"""llama.cpp's quantized rows, the one loader of golden/quant_vectors*.npz.

`quant_vectors.npz` (copied from shared/golden) holds the rows `x` (34 x 4096: real Gemma weights
and edge cases), the importance matrix `imatrix`, and ggml_quantize_chunk's bytes per type
(`<TYPE>`, and `<TYPE>_imatrix` with the importance matrix); `quant_vectors_low_bit.npz`
(tests/record_quant_vectors.py, llama.cpp 11434) adds the low-bit types on the same rows, some
only with the importance matrix (those ggml will not quantize without one).
"""
import pathlib

import numpy as np

GOLDEN = pathlib.Path(__file__).resolve().parent / "golden"
FILES = ("quant_vectors.npz", "quant_vectors_low_bit.npz")


def load_quant_vectors(golden_dir: pathlib.Path = GOLDEN) -> dict[str, np.ndarray]:
    vectors = {}
    for name in FILES:
        with np.load(golden_dir / name) as z:
            vectors.update({key: z[key] for key in z.files})
    return vectors


def rows_of(vectors: dict[str, np.ndarray], type_name: str) -> np.ndarray:
    """llama.cpp's rows of `type_name`: without an importance matrix where ggml writes them so,
    else with one."""
    return vectors[type_name] if type_name in vectors else vectors[type_name + "_imatrix"]
