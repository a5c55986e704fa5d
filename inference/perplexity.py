"""Perplexity the way llama-perplexity measures it.

The text is tokenized once (BOS at the start when the model adds one) and cut into chunks of
n_ctx tokens; each chunk is evaluated as a fresh sequence, its first token replaced by BOS when
the model adds one, and only its second half is scored: the logits at positions n_ctx/2 ..
n_ctx-2 predicting the next token. PPL = exp(mean NLL), with llama.cpp's standard error.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass
class PerplexityResult:
    ppl: float
    stderr: float
    n_scored: int
    n_chunks: int
    chunk_ppl: list[float]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def scored_positions(n_ctx: int) -> int:
    """Positions scored per chunk: its second half, but for the last (nothing follows it)."""
    return n_ctx - 1 - n_ctx // 2


def count_chunks(n_tokens: int, n_ctx: int, n_chunks: int | None = None) -> int:
    """How many chunks of n_ctx tokens are scored (at most `n_chunks` when given)."""
    total = n_tokens // n_ctx
    if total < 1:
        raise ValueError(f"the text has {n_tokens} tokens; at least n_ctx = {n_ctx} are "
                         "needed for one chunk")
    return min(total, n_chunks) if n_chunks else total


def chunk_inputs(tokens: Sequence[int], n_ctx: int, n_chunks: int,
                 bos_id: int | None) -> list[list[int]]:
    """The chunks llama-perplexity evaluates: n_ctx tokens each, the first replaced by BOS when
    the model adds one."""
    chunks = []
    for c in range(n_chunks):
        chunk = [int(t) for t in tokens[c * n_ctx:(c + 1) * n_ctx]]
        if bos_id is not None:
            chunk[0] = bos_id
        chunks.append(chunk)
    return chunks


def perplexity(evaluate: Callable[[list[int]], np.ndarray], tokens: Sequence[int], n_ctx: int,
               bos_id: int | None, n_chunks: int | None = None,
               on_chunk: Callable[[int, int, float], None] | None = None,
               on_scored: Callable[[np.ndarray], None] | None = None) -> PerplexityResult:
    """`evaluate(ids)` returns logits (len(ids), n_vocab) for a fresh sequence; `bos_id` is None
    when the model adds no BOS. `on_chunk(i, n, running_ppl)` reports progress; `on_scored`
    receives each chunk's scored logits (kl_divergence's base file writer takes them)."""
    n = count_chunks(len(tokens), n_ctx, n_chunks)
    first = n_ctx // 2
    nll = nll2 = 0.0
    count = 0
    chunk_ppl = []
    for c, chunk in enumerate(chunk_inputs(tokens, n_ctx, n, bos_id)):
        scored = evaluate(chunk)[first:n_ctx - 1]
        if on_scored:
            on_scored(scored)
        logp = log_softmax(scored)
        targets = np.asarray(chunk[first + 1:n_ctx])
        v = -logp[np.arange(len(targets)), targets]
        nll += float(v.sum())
        nll2 += float((v * v).sum())
        count += len(v)
        chunk_ppl.append(math.exp(nll / count))
        if on_chunk:
            on_chunk(c + 1, n, chunk_ppl[-1])
    mean = nll / count
    var = nll2 / count - mean * mean
    unc = math.sqrt(max(0.0, var) / (count - 1)) if count > 1 else 0.0
    return PerplexityResult(math.exp(mean), math.exp(mean) * unc, count, n, chunk_ppl)
