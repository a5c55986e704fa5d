"""Records llama.cpp's bytes for the low-bit types into tests/golden/quant_vectors_low_bit.npz:
ggml_quantize_chunk of libggml-base (llama.cpp build 11434, CPU) on the rows and importance
matrix of golden/quant_vectors.npz (34 rows of 4096 values: real Gemma weights and edge cases).
Run by hand where that library is built, never by the test suite:

    python tests/record_quant_vectors.py path/to/libggml-base.so

Keys are as in quant_vectors.npz: `<TYPE>` without an importance matrix (only for the types
ggml quantizes without one) and `<TYPE>_imatrix` with it.
"""
from __future__ import annotations

import ctypes
import pathlib
import sys

import numpy as np

from llamatui.inference.catalog import GGML_TYPES

GOLDEN = pathlib.Path(__file__).resolve().parent / "golden"
TYPES = ("IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ3_S", "IQ2_S", "IQ1_M", "TQ1_0", "TQ2_0",
         "MXFP4")


def main(lib_path: str) -> None:
    ggml = ctypes.CDLL(lib_path)
    ggml.ggml_quantize_chunk.restype = ctypes.c_size_t
    ggml.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                         ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                         ctypes.c_void_p]
    ggml.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
    ggml.ggml_quantize_init.argtypes = [ctypes.c_int]
    with np.load(GOLDEN / "quant_vectors.npz") as z:
        x = np.ascontiguousarray(z["x"], np.float32)
        imatrix = np.ascontiguousarray(z["imatrix"], np.float32)
    n_rows, n_cols = x.shape
    vectors = {}
    for name in TYPES:
        t = GGML_TYPES[name]
        ggml.ggml_quantize_init(t.id)
        out = np.zeros((n_rows, n_cols // t.block_size * t.type_size), np.uint8)
        variants = [("_imatrix", imatrix)]
        if not ggml.ggml_quantize_requires_imatrix(t.id):
            variants.insert(0, ("", None))
        for suffix, qw in variants:
            out[:] = 0
            written = ggml.ggml_quantize_chunk(
                t.id, x.ctypes.data, out.ctypes.data, 0, n_rows, n_cols,
                None if qw is None else qw.ctypes.data)
            assert written == out.size, (name, written, out.size)
            vectors[name + suffix] = out.copy()
            print(name + suffix, out.shape)
    np.savez_compressed(GOLDEN / "quant_vectors_low_bit.npz", **vectors)


if __name__ == "__main__":
    main(sys.argv[1])
