"""Whole-model quantization like llama-quantize, and importance matrices like llama-imatrix.

Modules: `model` (llama.cpp's mixes: each tensor's type, conversion, the output file) and
`imatrix` (collecting, reading and writing importance matrices). The per-type row quantizers
(ggml's quantize_row_*) live with the types themselves: `llamatui.inference.quants.quantize`.
"""
