"""The KV cache: n_ctx cells allocated once, shared by up to n_seq_max sequences.

Like llama.cpp's unified cache (src/llama-kv-cache.cpp, llama-kv-cells.h), every cell holds one
position and the set of sequences it belongs to; a cell with no sequence is free. K and V rows of
every layer live at the cell's index, stored as

- ``f32``: float32 rows,
- ``f16`` (default): fp16 rows (round to nearest even on write),
- ``q8_0``: Q8_0 blocks, quantized on write like ggml's quantize_row_q8_0_ref (roundf) and
  dequantized on read.

Attention masks by position and sequence (and by window on sliding-window layers), so sequences
share the cells freely. `seq_add` shifts positions and re-ropes the stored K by the shift, as
llama.cpp's K-shift does (a rotation by `delta` with the layer's RoPE parameters), so a shifted
sequence continues as if its tokens had been evaluated at their new positions.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .cpu import attention, ops
from .config import check_cache_type
from .cpu.backend import HostKVStore
from .rope import RopeSpec


class KVCacheFullError(RuntimeError):
    """No room in the cache for a batch (as llama_decode's return value 1)."""


@dataclass(frozen=True)
class KVRows:
    """What every cached layer keeps per cell: K as n_head_kv heads of head_dim_k values and V
    as n_head_kv heads of head_dim_v values (None: head_dim_k), stored as type_k and type_v
    (llama.cpp's -ctk / -ctv: 'f32', 'f16' or 'q8_0')."""
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int | None = None
    type_k: str = "f16"
    type_v: str = "f16"

    def __post_init__(self):
        head_dim_v = self.head_dim_k if self.head_dim_v is None else self.head_dim_v
        for name, value in (("n_head_kv", int(self.n_head_kv)),
                            ("head_dim_k", int(self.head_dim_k)), ("head_dim_v", int(head_dim_v)),
                            ("type_k", check_cache_type(self.type_k)),
                            ("type_v", check_cache_type(self.type_v))):
            object.__setattr__(self, name, value)


class KVCache:
    """Cells [0, n_ctx) with (position, sequence set), and per layer K and V rows.

    rows: what each of the n_layer layers keeps per cell (`KVRows`: heads, head sizes, types),
    or one `KVRows` per layer where layers differ (Gemma 4's sliding-window and global layers).
    n_seq_max: the sequences the cells may belong to (the engine's slots).
    layer_rope: one `RopeSpec` per layer (None for a layer without RoPE, whose K is left as
    it is), used to re-rope K when positions are shifted (`seq_add`); without it, shifting
    raises.
    layer_backends: the backend of each layer, which allocates and keeps that layer's K and V
    rows (`backend.kv_store`); None: host memory.
    kv_source: per layer, the layer whose K and V rows it attends over: its own index, or an
    earlier layer's for a layer that keeps none and reuses that one's (llama_kv_cache's
    layer_reuse_cb: Gemma 3n / Gemma 4's shared-KV layers); None: every layer its own.
    """

    def __init__(self, n_ctx: int, n_layer: int, rows: KVRows | Sequence[KVRows],
                 n_seq_max: int = 1, layer_rope: Sequence[RopeSpec] | None = None,
                 layer_backends: Sequence | None = None,
                 kv_source: Sequence[int] | None = None):
        if n_ctx <= 0:
            raise ValueError(f"n_ctx must be positive, got {n_ctx}")
        if n_seq_max <= 0:
            raise ValueError(f"n_seq_max must be positive, got {n_seq_max}")
        if layer_rope is not None and len(layer_rope) != n_layer:
            raise ValueError(f"{len(layer_rope)} RoPE specs for {n_layer} layers")
        self._n_ctx = int(n_ctx)
        self.n_layer = int(n_layer)
        layer_rows = list(rows) if not isinstance(rows, KVRows) else [rows] * self.n_layer
        if len(layer_rows) != self.n_layer:
            raise ValueError(f"{len(layer_rows)} KV row shapes for {n_layer} layers")
        rows = layer_rows[0] if layer_rows else rows
        self.kv_source = list(range(self.n_layer)) if kv_source is None else \
            [int(s) for s in kv_source]
        if len(self.kv_source) != self.n_layer or \
                any(not 0 <= s <= il or self.kv_source[s] != s
                    for il, s in enumerate(self.kv_source)):
            raise ValueError(f"kv_source {self.kv_source}: each layer must name itself or an "
                             f"earlier layer with rows of its own")
        self.rows = rows
        self.n_head_kv = rows.n_head_kv
        self.head_dim_k, self.head_dim_v = rows.head_dim_k, rows.head_dim_v
        self.type_k, self.type_v = rows.type_k, rows.type_v
        self.n_seq_max = int(n_seq_max)
        self.layer_rope = list(layer_rope) if layer_rope is not None else None
        if layer_backends is not None and len(layer_backends) != n_layer:
            raise ValueError(f"{len(layer_backends)} backends for {n_layer} layers")

        def store(il, kind):
            r = layer_rows[il]
            type_name, head_dim = (r.type_k, r.head_dim_k) if kind == "k" else \
                (r.type_v, r.head_dim_v)
            if layer_backends is None:
                return HostKVStore(type_name, self._n_ctx, r.n_head_kv, head_dim)
            return layer_backends[il].kv_store(type_name, self._n_ctx, r.n_head_kv, head_dim)

        # a layer that reuses another's rows reads that layer's stores (the same objects)
        self.k, self.v = [], []
        for il, src in enumerate(self.kv_source):
            self.k.append(store(il, "k") if src == il else self.k[src])
            self.v.append(store(il, "v") if src == il else self.v[src])
        self.pos = np.full(self._n_ctx, -1, np.int32)  # -1: empty cell
        self.seq = np.zeros((self._n_ctx, self.n_seq_max), np.bool_)

    # ------------------------------------------------------------------ accounting

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def used_cells(self) -> int:
        return int(np.count_nonzero(self.pos >= 0))

    @property
    def nbytes(self) -> int:
        own = [il for il, src in enumerate(self.kv_source) if src == il]
        return sum(self.k[il].nbytes + self.v[il].nbytes for il in own)

    def n_kv(self) -> int:
        """Cells the attention has to look at: one past the highest used cell."""
        used = np.flatnonzero(self.pos >= 0)
        return int(used[-1]) + 1 if used.size else 0

    def clear(self) -> None:
        self.pos[:] = -1
        self.seq[:] = False

    # ------------------------------------------------------------------ decode hooks
    # (what a hybrid model's memory, recurrent.HybridCache, does around a batch; nothing here)

    can_shift = True  # context shift (seq_rm of a middle range, then seq_add) is possible

    def begin_decode(self, positions: np.ndarray, seq_ids) -> None:
        """Before a batch's first micro-batch runs."""

    def end_decode(self) -> None:
        """After a batch went through."""

    def abort_decode(self) -> None:
        """After a batch failed (its cells are freed by the caller)."""

    def reusable_prefix(self, seq_id: int, n: int) -> int:
        """How much of a cached prefix of n tokens `seq_id` can keep: all of it here."""
        return n

    # ------------------------------------------------------------------ slots for a batch

    def find_slots(self, batch) -> np.ndarray:
        """Free cells for the batch's tokens (lowest indices first), int64 (n_tokens,); changes
        nothing. `batch` is a Batch or a token count. Raises KVCacheFullError."""
        n = int(batch) if isinstance(batch, (int, np.integer)) else len(batch)
        free = np.flatnonzero(self.pos < 0)
        if free.size < n:
            raise KVCacheFullError(f"KV cache full: {n} tokens need cells, {free.size} of "
                                   f"{self._n_ctx} are free")
        return free[:n].astype(np.int64)

    def store_cells(self, cells: np.ndarray, positions: np.ndarray,
                    seq_ids: Sequence[Sequence[int]]) -> None:
        """Claims `cells` for tokens at `positions` belonging to `seq_ids` (one tuple per token)."""
        cells = np.asarray(cells, dtype=np.int64)
        if np.any(self.pos[cells] >= 0):
            raise ValueError("store_cells: a cell is already in use")
        for c, p, ids in zip(cells.tolist(), np.asarray(positions).tolist(), seq_ids):
            self._check_seqs(ids)
            self.pos[c] = p
            self.seq[c, :] = False
            self.seq[c, list(ids)] = True

    def free_cells(self, cells: np.ndarray) -> None:
        cells = np.asarray(cells, dtype=np.int64)
        self.pos[cells] = -1
        self.seq[cells] = False

    def mask(self, positions: np.ndarray, seq_ids: np.ndarray, n_kv: int,
             n_swa: int = 0) -> np.ndarray:
        """KQ mask (n_tokens, n_kv): 0 / -inf; a token sees the cells of its (first) sequence at
        positions ≤ its own, and within `n_swa` positions when n_swa > 0."""
        return attention.build_kq_mask(self.pos, self.seq, positions, seq_ids, n_kv, n_swa)

    def cell_order(self, n_kv: int) -> np.ndarray:
        """Cells [0, n_kv) by position (int64): the order attention visits a token's cells in,
        so that its sums do not depend on where the cache put them (a request's cells sit
        wherever other requests left room)."""
        return np.argsort(self.pos[:n_kv], kind="stable")

    # ------------------------------------------------------------------ K / V rows

    def write(self, il: int, cells: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        """Stores the K and V rows of layer `il` for `cells`: (n, n_head_kv, head_dim)."""
        if self.kv_source[il] != il:
            raise ValueError(f"layer {il} reuses layer {self.kv_source[il]}'s K and V: it "
                             f"stores none of its own")
        self.k[il].write(cells, k)
        self.v[il].write(cells, v)

    def read(self, il: int, n_kv: int) -> tuple[np.ndarray, np.ndarray]:
        """K (n_kv, n_head_kv, head_dim_k) and V (n_kv, n_head_kv, head_dim_v) of layer `il`,
        cells [0, n_kv), as attention takes them: float32, or uint16 fp16 bit patterns (zero-copy)
        for an f16 cache."""
        return self.k[il].read(n_kv), self.v[il].read(n_kv)

    def read_f32(self, il: int, n_kv: int) -> tuple[np.ndarray, np.ndarray]:
        """K and V of layer `il`, cells [0, n_kv), as float32."""
        return self.k[il].read_f32(n_kv), self.v[il].read_f32(n_kv)

    # ------------------------------------------------------------------ sequences

    def _check_seqs(self, ids) -> None:
        for s in ids:
            if not 0 <= s < self.n_seq_max:
                raise ValueError(f"sequence id {s} out of range [0, {self.n_seq_max})")

    def _range(self, seq_id: int, p0, p1) -> np.ndarray:
        """Mask of used cells of `seq_id` (any sequence when < 0) with p0 ≤ pos < p1."""
        p0 = 0 if p0 is None or p0 < 0 else p0
        p1 = np.iinfo(np.int32).max if p1 is None or p1 < 0 else p1
        sel = (self.pos >= p0) & (self.pos < p1) & (self.pos >= 0)
        if seq_id >= 0:
            self._check_seqs((seq_id,))
            sel &= self.seq[:, seq_id]
        return sel

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """Removes `seq_id` (every sequence when < 0) from cells with p0 ≤ pos < p1 (negative
        bounds: open); cells left without a sequence are freed."""
        sel = self._range(seq_id, p0, p1)
        if seq_id < 0:
            self.seq[sel] = False
        else:
            self.seq[sel, seq_id] = False
        self.pos[sel & ~self.seq.any(axis=1)] = -1
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Makes `dst` share the cells of `src` in [p0, p1)."""
        self._check_seqs((dst,))
        if src == dst:
            return
        self.seq[self._range(src, p0, p1), dst] = True

    def seq_keep(self, seq_id: int) -> None:
        """Drops every sequence but `seq_id`; cells not in it are freed."""
        self._check_seqs((seq_id,))
        keep = self.seq[:, seq_id] & (self.pos >= 0)
        self.seq[:] = False
        self.seq[keep, seq_id] = True
        self.pos[~keep] = -1

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """Adds `delta` to the positions of `seq_id`'s cells in [p0, p1) and re-ropes their K;
        cells pushed below position 0 are freed (as llama.cpp's pos_add)."""
        if delta == 0 or (p0 is not None and p0 >= 0 and p0 == p1):
            return
        sel = np.flatnonzero(self._range(seq_id, p0, p1))
        if sel.size == 0:
            return
        new_pos = self.pos[sel].astype(np.int64) + delta
        gone = sel[new_pos < 0]
        moved = sel[new_pos >= 0]
        self.free_cells(gone)
        if moved.size:
            if self.layer_rope is None:
                raise ValueError("seq_add: this cache has no RoPE parameters to re-rope K with")
            self.pos[moved] = new_pos[new_pos >= 0]
            shift = np.full(moved.size, delta, np.int64)
            for il in range(self.n_layer):
                if self.layer_rope[il] is None:  # llama_hparams::has_rope: nothing to turn
                    continue
                if self.kv_source[il] != il:  # another layer's rows: turned with that layer
                    continue
                k = np.ascontiguousarray(self.k[il].read_cells(moved))
                ops.rope_apply(k, shift, self.layer_rope[il], magnitude=False)
                self.k[il].write(moved, k)

    def seq_pos_max(self, seq_id: int) -> int:
        """Highest position of `seq_id` in the cache, -1 when it has none."""
        sel = self._range(seq_id, -1, -1)
        return int(self.pos[sel].max()) if sel.any() else -1

    def seq_pos_min(self, seq_id: int) -> int:
        """Lowest position of `seq_id` in the cache, -1 when it has none."""
        sel = self._range(seq_id, -1, -1)
        return int(self.pos[sel].min()) if sel.any() else -1

    def __repr__(self):
        return (f"KVCache(n_ctx={self._n_ctx}, used={self.used_cells}, k={self.type_k}, "
                f"v={self.type_v}, n_seq_max={self.n_seq_max}, {self.nbytes / 2**20:.1f} MiB)")
