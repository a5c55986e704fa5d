"""Importance matrices like llama-imatrix: collect, save, load.

    imatrix, ppl = collect_imatrix("model.gguf", text, n_ctx=512)
    imatrix.save("imatrix.gguf")
    Imatrix.load("imatrix.gguf").importance()   # tensor name → float32 per input column

While the model reads a text, every matrix product of a block weight (`blk.*`) adds, for each
input column, the squares of the activations that column multiplies (llama-imatrix's `in_sum2`),
and counts the activation rows (`counts`). Products of fewer than 16 rows are skipped, as
llama.cpp does. The text is cut into chunks of n_ctx tokens, each evaluated as a fresh sequence
that starts with BOS (when the model adds one), exactly as llama-perplexity cuts it; the
perplexity of those chunks comes for free.

The file format is llama.cpp's GGUF imatrix (tools/imatrix/imatrix.cpp): `general.type` =
"imatrix", `imatrix.datasets` (string array), `imatrix.chunk_count` and `imatrix.chunk_size`
(u32), and per weight two F32 tensors `<name>.in_sum2` (n_cols × n_mat) and `<name>.counts`
(1 × n_mat), names sorted. `Imatrix.load` also reads llama.cpp's legacy `.dat` format. Quantizing
uses in_sum2 / counts, the mean squared activation of each column.
"""
from __future__ import annotations

import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from llamatui.inference.backend import Backend, QWeight
from llamatui.inference.cpu.backend import CPUBackend
from llamatui.inference.gguf import GGUF_MAGIC, GGUFFile, GGUFValueType, GGUFWriter, ValueType

__all__ = ["Imatrix", "ImatrixCollector", "ImatrixEntry", "ImatrixError", "collect_imatrix"]

KV_DATASETS = "imatrix.datasets"
KV_CHUNK_COUNT = "imatrix.chunk_count"
KV_CHUNK_SIZE = "imatrix.chunk_size"
MIN_ROWS = 16  # llama-imatrix ignores matrix products of smaller batches


class ImatrixError(ValueError):
    """An imatrix file that cannot be read, or a collection that cannot be done."""


@dataclass
class ImatrixEntry:
    """One weight's statistics: `sums` (n_mat, n_cols) of squared activations per input column,
    `counts` (n_mat,) activation rows seen (n_mat > 1 only for stacked expert weights)."""
    sums: np.ndarray
    counts: np.ndarray

    def __post_init__(self):
        self.counts = np.asarray(self.counts, np.int64).reshape(-1)
        self.sums = np.asarray(self.sums, np.float32).reshape(len(self.counts), -1)

    def importance(self, legacy: bool = False) -> np.ndarray:
        """The per-column importance llama-quantize uses: sums / counts (flattened over the
        matrices). A matrix never seen gets 1 (GGUF) or its raw values (legacy), as in
        llama.cpp."""
        counts = self.counts.astype(np.float32)[:, None]
        if legacy:
            out = np.where(counts > 0, self.sums / np.maximum(counts, 1), self.sums)
        else:
            out = np.where(counts > 0, self.sums / np.maximum(counts, 1), np.float32(1))
        return np.ascontiguousarray(out, np.float32).reshape(-1)


@dataclass
class Imatrix:
    entries: dict[str, ImatrixEntry]
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0
    chunk_size: int = 0
    is_legacy: bool = False  # read from a legacy .dat file (sums are already averages × ncall)

    def importance(self) -> dict[str, np.ndarray]:
        """tensor name → float32 importance per input column (as `quantize(..., imatrix=)`
        takes), for the entries that have data."""
        return {name: e.importance(self.is_legacy) for name, e in self.entries.items()
                if e.counts.size and e.sums.size}

    # ---------------------------------------------------------------- GGUF

    def save(self, path) -> None:
        """Writes llama.cpp's GGUF imatrix format (atomically)."""
        w = GGUFWriter(path)
        w.add("general.type", "imatrix", GGUFValueType.STRING)
        w.add(KV_DATASETS, list(self.datasets),
              ValueType(GGUFValueType.ARRAY, ValueType(GGUFValueType.STRING)))
        w.add(KV_CHUNK_COUNT, int(self.chunk_count), GGUFValueType.UINT32)
        w.add(KV_CHUNK_SIZE, int(self.chunk_size), GGUFValueType.UINT32)
        for name in sorted(self.entries):
            e = self.entries[name]
            n_mat = len(e.counts)
            if not n_mat or not e.sums.size:
                continue
            w.add_tensor(f"{name}.in_sum2", "F32", (n_mat, e.sums.shape[1]),
                         np.ascontiguousarray(e.sums, np.float32))
            w.add_tensor(f"{name}.counts", "F32", (n_mat, 1),
                         e.counts.astype(np.float32).reshape(n_mat, 1))
        w.write()

    @classmethod
    def load(cls, path) -> "Imatrix":
        """Reads a GGUF imatrix (llama-imatrix's or ours) or a legacy `.dat` imatrix."""
        path = os.fspath(path)
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic == GGUF_MAGIC:
            return cls._load_gguf(path)
        return cls._load_legacy(path)

    @classmethod
    def _load_gguf(cls, path: str) -> "Imatrix":
        with GGUFFile.open(path) as g:
            md = g.metadata
            kind = md.get("general.type")
            if kind is not None and kind != "imatrix":
                raise ImatrixError(f"{path}: a GGUF file of type {kind!r}, not an imatrix")
            parts: dict[str, dict[str, np.ndarray]] = {}
            for tname, t in g.tensors.items():
                for suffix in (".in_sum2", ".counts"):
                    if tname.endswith(suffix):
                        if t.type != "F32":
                            raise ImatrixError(f"{path}: {tname} is {t.type}, expected F32")
                        parts.setdefault(tname[:-len(suffix)], {})[suffix] = \
                            np.array(t.data.view(np.float32))
                        break
            entries = {}
            for name in sorted(parts):
                p = parts[name]
                if ".in_sum2" not in p or ".counts" not in p:
                    raise ImatrixError(f"{path}: mismatched sums and counts for {name}")
                counts = p[".counts"]
                if not counts.size or p[".in_sum2"].size % counts.size:
                    raise ImatrixError(f"{path}: {name} has {p['.in_sum2'].size} sums for "
                                       f"{counts.size} counts")
                entries[name] = ImatrixEntry(p[".in_sum2"], np.rint(counts).astype(np.int64))
            if not entries:
                raise ImatrixError(f"{path}: no imatrix data (no <name>.in_sum2 tensors)")
            datasets = md.get(KV_DATASETS, [])
            return cls(entries, [str(d) for d in datasets] if isinstance(datasets, list) else [],
                       int(md.get(KV_CHUNK_COUNT, 0)), int(md.get(KV_CHUNK_SIZE, 0)))

    # ---------------------------------------------------------------- legacy .dat

    @classmethod
    def _load_legacy(cls, path: str) -> "Imatrix":
        """int32 n_entries; per entry: int32 name length, name, int32 ncall, int32 nval,
        nval float32 (mean of squares × ncall); then int32 chunk count, int32 length and the
        dataset name (both optional)."""
        with open(path, "rb") as f:
            raw = f.read()
        pos = 0

        def take(n: int, what: str) -> bytes:
            nonlocal pos
            if n < 0 or pos + n > len(raw):
                raise ImatrixError(f"{path}: not an imatrix file (neither GGUF nor the legacy "
                                   f"format): truncated at {what} (offset {pos})")
            pos += n
            return raw[pos - n:pos]

        def i32(what: str) -> int:
            return struct.unpack("<i", take(4, what))[0]

        n_entries = i32("the entry count")
        if n_entries < 1 or n_entries > len(raw) // 12:
            raise ImatrixError(f"{path}: not an imatrix file (neither GGUF nor the legacy "
                               f"format: entry count {n_entries})")
        entries = {}
        for i in range(n_entries):
            name = take(i32(f"entry {i}'s name length"), f"entry {i}'s name").decode(
                "utf-8", "replace")
            ncall = i32(f"{name}'s call count")
            nval = i32(f"{name}'s value count")
            if nval < 1:
                raise ImatrixError(f"{path}: {name} has {nval} values")
            values = np.frombuffer(take(4 * nval, f"{name}'s values"), "<f4").astype(np.float32)
            entries[name] = ImatrixEntry(values.reshape(1, -1), [ncall])
        chunk_count, datasets = 0, []
        if pos + 4 <= len(raw):
            chunk_count = i32("the chunk count")
            if pos + 4 <= len(raw):
                n = i32("the dataset name length")
                if 0 <= n <= len(raw) - pos:
                    datasets.append(take(n, "the dataset name").decode("utf-8", "replace"))
        return cls(entries, datasets, chunk_count, 0, is_legacy=True)


# ----------------------------------------------------------------------------- collection


class ImatrixCollector(CPUBackend):
    """A CPU backend that records, for every block weight it multiplies, the sum of squared
    activations per input column and the number of activation rows; for a stack of experts
    (ffn_*_exps), per expert: the rows routed to it (llama-imatrix's collect_imatrix, whose
    MUL_MAT_ID case keeps one row of sums and one count per expert, at any batch size)."""

    def __init__(self, n_threads: int | None = None, process_output: bool = False):
        super().__init__(n_threads)
        self.process_output = process_output
        self.sums: dict[str, np.ndarray] = {}  # (n_mat, n_in) float64
        self.counts: dict[str, np.ndarray] = {}  # (n_mat,) int64

    def wants(self, name: str) -> bool:
        return name.startswith("blk.") or (self.process_output and name == "output.weight")

    def matmul(self, w: QWeight, x: np.ndarray) -> np.ndarray:
        y = super().matmul(w, x)
        if x.shape[0] >= MIN_ROWS and self.wants(w.name):
            x64 = np.asarray(x, np.float64)
            self._add(w.name, 1, np.zeros(x.shape[0], np.int64), x64 * x64)
        return y

    # one product per matrix, each recorded by matmul above (the CPU's fused products of Q, K, V
    # and of gate, up would pass them by)
    matmul_many = Backend.matmul_many

    def matmul_id(self, w, x: np.ndarray, ids: np.ndarray) -> np.ndarray:
        y = super().matmul_id(w, x, ids)
        if self.wants(w.name):
            ids = np.asarray(ids, np.int64)
            x64 = np.asarray(x, np.float64)
            if x64.ndim == 2:  # one input for all of a token's experts (gate, up)
                x64 = np.broadcast_to(x64[:, None, :], (*ids.shape, x64.shape[-1]))
            self._add(w.name, w.n_expert, ids.reshape(-1), (x64 * x64).reshape(ids.size, -1))
        return y

    def _add(self, name: str, n_mat: int, mats: np.ndarray, squares: np.ndarray) -> None:
        """Adds each row of `squares` to the sums of matrix mats[row]."""
        sums = np.zeros((n_mat, squares.shape[1]))
        if n_mat == 1:
            sums[0] = squares.sum(axis=0)
        else:
            for m in np.unique(mats):
                sums[m] = squares[mats == m].sum(axis=0)
        if not np.all(np.isfinite(sums)):
            raise ImatrixError(f"non-finite activations entering {name}")
        counts = np.bincount(mats, minlength=n_mat)
        if name in self.sums:
            self.sums[name] += sums
            self.counts[name] += counts
        else:
            self.sums[name], self.counts[name] = sums, counts

    def imatrix(self, datasets=(), chunk_count: int = 0, chunk_size: int = 0) -> Imatrix:
        entries = {name: ImatrixEntry(self.sums[name], self.counts[name])
                   for name in sorted(self.sums)}
        return Imatrix(entries, list(datasets), chunk_count, chunk_size)


def collect_imatrix(model_path, text: str, n_ctx: int = 512, n_chunks: int | None = None,
                    threads: int | None = None, process_output: bool = False,
                    dataset: str | None = None,
                    on_chunk: Callable[[int, int, float], None] | None = None):
    """Runs the model over `text` in chunks of `n_ctx` tokens (at most `n_chunks`) and returns
    (Imatrix, PerplexityResult). `dataset` is the name recorded in the file (llama-imatrix
    records the text file's path). `on_chunk(i, n, running_ppl)` reports progress."""
    from llamatui.inference.config import LoadConfig
    from llamatui.inference.model import Model
    from llamatui.inference.perplexity import perplexity
    from llamatui.inference.tokenizers.tokenizer import Tokenizer

    if n_ctx < 2 * MIN_ROWS:
        raise ImatrixError(f"a context of {n_ctx} tokens is too small; use at least "
                           f"{2 * MIN_ROWS}")
    if n_chunks is not None and n_chunks < 1:
        raise ImatrixError("--chunks must be at least 1")
    gguf = GGUFFile.open(model_path)
    try:
        tok = Tokenizer.from_metadata(gguf.metadata)
        tokens = tok.encode(text, add_special=True, parse_special=False)
        if len(tokens) < n_ctx:
            raise ImatrixError(f"the text has {len(tokens)} tokens; a context of {n_ctx} needs "
                               f"at least {n_ctx} (use a longer text or a smaller -c)")
        collector = ImatrixCollector(threads, process_output)
        model = Model.load(gguf, LoadConfig(n_ctx=n_ctx), backend=collector)
        bos = tok.bos_id if tok.add_bos else None
        result = perplexity(model.logits_for, tokens, n_ctx, bos, n_chunks, on_chunk)
        imatrix = collector.imatrix([dataset] if dataset else [], result.n_chunks, n_ctx)
    finally:
        gguf.close()
    if not imatrix.entries:
        raise ImatrixError("no block weight was multiplied; nothing collected")
    return imatrix, result

