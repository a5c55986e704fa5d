"""ggml's tensor types: id in the GGUF file, name, and block geometry.

Every type a GGUF file may name is listed, so a file that uses one we cannot compute with still
opens; only dequantizing or running it fails (see `llamatui.inference.quants`).
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class GGMLType:
    id: int
    name: str
    block_size: int  # elements per block
    type_size: int  # bytes per block

    def row_bytes(self, n_elements: int) -> int:
        return n_elements // self.block_size * self.type_size


_QK_K = 256
GGML_TYPES_BY_ID = {t.id: t for t in (
    GGMLType(0, "F32", 1, 4),
    GGMLType(1, "F16", 1, 2),
    GGMLType(2, "Q4_0", 32, 18),
    GGMLType(3, "Q4_1", 32, 20),
    GGMLType(6, "Q5_0", 32, 22),
    GGMLType(7, "Q5_1", 32, 24),
    GGMLType(8, "Q8_0", 32, 34),
    GGMLType(9, "Q8_1", 32, 36),
    GGMLType(10, "Q2_K", _QK_K, 84),
    GGMLType(11, "Q3_K", _QK_K, 110),
    GGMLType(12, "Q4_K", _QK_K, 144),
    GGMLType(13, "Q5_K", _QK_K, 176),
    GGMLType(14, "Q6_K", _QK_K, 210),
    GGMLType(15, "Q8_K", _QK_K, 292),
    GGMLType(16, "IQ2_XXS", _QK_K, 66),
    GGMLType(17, "IQ2_XS", _QK_K, 74),
    GGMLType(18, "IQ3_XXS", _QK_K, 98),
    GGMLType(19, "IQ1_S", _QK_K, 50),
    GGMLType(20, "IQ4_NL", 32, 18),
    GGMLType(21, "IQ3_S", _QK_K, 110),
    GGMLType(22, "IQ2_S", _QK_K, 82),
    GGMLType(23, "IQ4_XS", _QK_K, 136),
    GGMLType(24, "I8", 1, 1),
    GGMLType(25, "I16", 1, 2),
    GGMLType(26, "I32", 1, 4),
    GGMLType(27, "I64", 1, 8),
    GGMLType(28, "F64", 1, 8),
    GGMLType(29, "IQ1_M", _QK_K, 56),
    GGMLType(30, "BF16", 1, 2),
    GGMLType(34, "TQ1_0", _QK_K, 54),
    GGMLType(35, "TQ2_0", _QK_K, 66),
    GGMLType(39, "MXFP4", 32, 17),
    GGMLType(40, "NVFP4", 64, 36),
    GGMLType(41, "Q1_0", 128, 18),
)}
GGML_TYPES = {t.name: t for t in GGML_TYPES_BY_ID.values()}
