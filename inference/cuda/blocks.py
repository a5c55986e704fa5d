"""What the CUDA kernels know of a weight type: `DeviceType` (its 16-value decoder and the block
it walks by) and `@decoder(<type class>)`, which registers a device function as the type's "cuda"
kernels. The decoders themselves are in dequant.py and decoders_<family>.py.
"""
from __future__ import annotations

from dataclasses import dataclass

CHUNK = 16  # values decoded at a time


@dataclass(frozen=True)
class DeviceType:
    """How the kernels read one weight type: its 16-value decoder and the block it walks by."""
    name: str
    decoder: object  # a device function (w, row, offset, chunk, vals)
    block_values: int
    block_bytes: int

    @property
    def chunks_per_block(self) -> int:
        return self.block_values // CHUNK

    def row_bytes(self, n_values: int) -> int:
        return n_values // self.block_values * self.block_bytes


def decoder(quant):
    """Registers the device function below it as `quant`'s "cuda" kernels: a DeviceType walking
    the type's blocks (16-value runs of the float types), geometry from the type's class."""
    def register(fn):
        quant.register_kernels("cuda", DeviceType(quant.name, fn, *quant.span(CHUNK)))
        return fn
    return register
