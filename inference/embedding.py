"""Pooling and normalizing embeddings, as llama.cpp does after its embedding decode.

- `pool`: llama.cpp's build_pooling over the hidden states of each sequence (rows in order,
  positions 0, 1, ...): "mean" (llm_graph_input_mean: the average of every token's state),
  "cls" (the first token's: BERT's [CLS]), "last" (the last token's: a decoder has read the whole
  text there). "none" (a state per token) and "rank" (a reranker's score) are not offered.
- `normalize`: common_embd_normalize, the `embd_normalize` of llama-embedding and llama-server:
  -1 none, 0 max-absolute scaled to int16 range, 2 Euclidean (the default), p > 0 a p-norm.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["EUCLIDEAN", "POOLINGS", "normalize", "pool"]

POOLINGS = ("mean", "cls", "last")
EUCLIDEAN = 2  # llama-server's default embd_normalize


def pool(hidden: np.ndarray, lengths: Sequence[int], pooling: str) -> np.ndarray:
    """float32 (len(lengths), n_embd) from hidden (sum(lengths), n_embd): each sequence's
    consecutive rows pooled."""
    hidden = np.asarray(hidden, dtype=np.float32)
    ends = np.cumsum(lengths)
    starts = ends - np.asarray(lengths)
    if pooling == "mean":
        sums = np.add.reduceat(hidden.astype(np.float64), starts, axis=0)
        return (sums / np.asarray(lengths, np.float64)[:, None]).astype(np.float32)
    if pooling == "cls":
        return hidden[starts]
    if pooling == "last":
        return hidden[ends - 1]
    raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, not {pooling!r}")


def normalize(x: np.ndarray, norm: int = EUCLIDEAN) -> np.ndarray:
    """Each row of x scaled as common_embd_normalize(norm) does; a zero row stays zero."""
    x = np.asarray(x, dtype=np.float32)
    if isinstance(norm, bool) or not isinstance(norm, (int, np.integer)) or norm < -1:
        raise ValueError(f"embedding normalization must be -1 (none), 0 (max absolute, int16 "
                         f"range), 2 (Euclidean) or another p > 0, not {norm!r}")
    x64 = x.astype(np.float64)
    if norm == -1:
        return x.copy()
    if norm == 0:
        size = np.abs(x64).max(axis=-1, keepdims=True) / 32760.0
    else:
        size = (np.abs(x64) ** norm).sum(axis=-1, keepdims=True) ** (1.0 / norm)
    with np.errstate(divide="ignore"):
        scale = np.where(size > 0, 1.0 / size, 0.0)
    return (x64 * scale).astype(np.float32)
