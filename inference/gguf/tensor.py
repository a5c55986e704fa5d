"""One tensor of an open GGUF file: its description and zero-copy views of its bytes."""
from __future__ import annotations

import math

import numpy as np

from ..catalog import GGMLType
from .values import GGUFError


class GGUFTensor:
    """One tensor: `.type` (llama.cpp's name), `.shape` (numpy order: ggml's ne reversed; () for
    a tensor of no dimensions, one value), `.nbytes`, `.data` (zero-copy uint8 view), `.rows`
    (uint8, one row of blocks per row), `.dequantize()`; `.shard`: which file of a split model
    holds it (0 otherwise). The reader has checked the shape against the type and the file, so
    these views always have the sizes the shape says."""

    def __init__(self, name: str, ggml_type: GGMLType, shape: tuple[int, ...], offset: int,
                 buf: np.ndarray):
        self.name = name
        self.ggml_type = ggml_type
        self.shape = shape
        self.offset = offset  # absolute, in its file
        self.shard = 0
        self.n_elements = math.prod(shape)
        self.nbytes = self.n_elements // ggml_type.block_size * ggml_type.type_size
        self._buf = buf

    @property
    def type(self) -> str:
        return self.ggml_type.name

    @property
    def row_length(self) -> int:
        """Values per row: ggml's ne[0] (1 for a tensor of no dimensions)."""
        return self.shape[-1] if self.shape else 1

    @property
    def data(self) -> np.ndarray:
        if self._buf is None or self.offset + self.nbytes > len(self._buf):
            raise GGUFError(f"tensor {self.name!r}: data is not available (file closed, or only "
                            "its header was read)")
        return self._buf[self.offset:self.offset + self.nbytes]

    @property
    def rows(self) -> np.ndarray:
        return self.data.reshape(-1, self.ggml_type.row_bytes(self.row_length))

    def dequantize(self) -> np.ndarray:
        """float32 values in `shape`; a GGUFError names the tensor when llamatui has no
        dequantizer for its type (its data stays readable through `data` and `rows`)."""
        from ..quants import UnsupportedTypeError, dequantize
        try:
            values = dequantize(self.type, self.data, self.n_elements)
        except UnsupportedTypeError as e:
            raise GGUFError(f"tensor {self.name!r}: {e}") from e
        return values.reshape(self.shape)

    def __repr__(self):
        return f"GGUFTensor({self.name!r}, {self.type}, shape={self.shape})"
