"""GGUF files: read by mmap (zero-copy tensors), validated, and written back byte for byte.

Layout (v2/v3, little-endian): magic "GGUF", u32 version, u64 tensor count, u64 metadata count;
metadata as (string key, u32 value type, value); tensor infos as (string name, u32 n_dims,
u64 ne[n_dims], u32 ggml type, u64 offset); then, at the next multiple of `general.alignment`,
the data section that every tensor offset is relative to. A string is a u64 length and its bytes.

The modules, in the order a file goes through them:

    values.py    the format's constants, GGUFError, metadata value types
    reader.py    parsing and validating an image: header, metadata, tensor infos
    metadata.py  metadata values, string arrays decoded on first use
    tensor.py    GGUFTensor: one tensor's views of the mapped bytes
    file.py      GGUFFile: an open file or split model; shard names; page release
    writer.py    GGUFWriter: one file or llama.cpp's split layout, written atomically
    partial.py   the writer's partial files, and finding those a dead writer left
"""
from .file import GGUFFile, release_pages, split_path, split_prefix
from .metadata import Metadata
from .partial import (ABANDONED_AFTER, OLD_ABANDONED_AFTER, PartialWrite, partial_writes,
                      remove_abandoned_writes)
from .tensor import GGUFTensor
from .values import (DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_NESTING, MAX_DIMS, MAX_SPLITS,
                     SPLIT_COUNT, SPLIT_NO, SPLIT_TENSORS_COUNT, SUPPORTED_VERSIONS, GGUFError,
                     GGUFValueType, ValueType)
from .writer import GGUFWriter, infer_value_type

__all__ = [
    "ABANDONED_AFTER", "DEFAULT_ALIGNMENT", "GGUF_MAGIC", "MAX_ARRAY_NESTING", "MAX_DIMS",
    "MAX_SPLITS", "OLD_ABANDONED_AFTER", "SPLIT_COUNT", "SPLIT_NO", "SPLIT_TENSORS_COUNT",
    "SUPPORTED_VERSIONS", "GGUFError", "GGUFFile", "GGUFTensor", "GGUFValueType", "GGUFWriter",
    "Metadata", "PartialWrite", "ValueType", "infer_value_type", "partial_writes",
    "release_pages", "remove_abandoned_writes", "split_path", "split_prefix",
]
