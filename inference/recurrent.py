"""The memory of hybrid models (Qwen 3.5: Gated DeltaNet layers between attention layers):
llama.cpp's llama_memory_hybrid (src/llama-memory-hybrid.cpp), the KV cache of the attention
layers beside llama_memory_recurrent's per-sequence states (src/llama-memory-recurrent.cpp).

A recurrent layer keeps, per sequence, a fixed-size state — its causal convolution's last inputs
and its delta rule's matrix — that has absorbed every token of the sequence so far, in order. So,
unlike K/V rows, a state cannot drop its last tokens: removing the tail of a sequence (a chat's
second turn reusing its first) needs the state as it was at the cut. `HybridCache` keeps
*checkpoints* of each sequence's states (llama-server's context checkpoints, tools/server's
`n_ctx_checkpoints`): one after every batch that gave the sequence several tokens (a prompt or a
chunk of one), the most recent `n_checkpoints` per sequence. `reusable_prefix` tells the
scheduler how much of a cached prefix can really be kept (a checkpoint's length, the live
state's, or 0), and `seq_rm` restores that checkpoint; where none matches it refuses (returns
False, as llama_memory_recurrent::seq_rm), leaving the sequence as it was.

A sequence's tokens must come in order: a batch continues each sequence at the position its state
has reached, or starts it again at position 0 (which resets its state).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .hparams import RecurrentRows
from .kv_cache import KVCache, KVRows

__all__ = ["CHECKPOINTS_PER_SEQUENCE", "HybridCache", "RecurrentRows"]

# states kept per sequence besides its live one, so that a chat's next turn resumes from where
# the last turn's prompt ended (llama.cpp's context checkpoints); the memory estimate counts them
CHECKPOINTS_PER_SEQUENCE = 8


@dataclass
class _Checkpoint:
    n_past: int  # tokens absorbed: positions [0, n_past)
    conv: dict
    ssm: dict


class HybridCache(KVCache):
    """A KVCache whose sequences also carry recurrent states (see the module's docstring)."""

    can_shift = False  # a state cannot drop tokens from its middle (context shift)

    def __init__(self, n_ctx: int, n_layer: int, rows: KVRows, recurrent: RecurrentRows,
                 n_seq_max: int = 1, layer_rope=None, layer_backends=None,
                 n_checkpoints: int = CHECKPOINTS_PER_SEQUENCE):
        super().__init__(n_ctx, n_layer, rows, n_seq_max, layer_rope, layer_backends)
        self.recurrent = recurrent
        for il in recurrent.layers:  # a recurrent layer has no K/V rows
            if il < n_layer:
                self.k[il] = self.v[il] = None
        self.conv = {il: np.zeros((self.n_seq_max, *recurrent.conv), np.float32)
                     for il in recurrent.layers}
        self.ssm = {il: np.zeros((self.n_seq_max, *recurrent.ssm), np.float32)
                    for il in recurrent.layers}
        self.n_past = np.zeros(self.n_seq_max, np.int64)
        self.n_checkpoints = int(n_checkpoints)
        self.checkpoints: list[list[_Checkpoint]] = [[] for _ in range(self.n_seq_max)]
        self._backup = None

    @property
    def nbytes(self) -> int:
        stores = [s for s in self.k + self.v if s is not None]
        return sum(s.nbytes for s in stores) + self.state_bytes

    @property
    def state_bytes(self) -> int:
        """The recurrent states' memory, checkpoints included."""
        per_seq = sum(a[0].nbytes for a in (*self.conv.values(), *self.ssm.values()))
        return per_seq * (self.n_seq_max + sum(len(c) for c in self.checkpoints))

    # ------------------------------------------------------------------ one sequence's state

    def _copy_state(self, seq: int) -> _Checkpoint:
        return _Checkpoint(int(self.n_past[seq]),
                           {il: a[seq].copy() for il, a in self.conv.items()},
                           {il: a[seq].copy() for il, a in self.ssm.items()})

    def _set_state(self, seq: int, cp: _Checkpoint) -> None:
        self.n_past[seq] = cp.n_past
        for il, a in self.conv.items():
            a[seq] = cp.conv[il]
        for il, a in self.ssm.items():
            a[seq] = cp.ssm[il]

    def _reset(self, seq: int) -> None:
        self.n_past[seq] = 0
        for a in (*self.conv.values(), *self.ssm.values()):
            a[seq] = 0.0
        self.checkpoints[seq] = []

    # ------------------------------------------------------------------ decoding

    def begin_decode(self, positions: np.ndarray, seq_ids: Sequence[Sequence[int]]) -> None:
        """Checks that the batch continues each of its sequences where its state stands (or
        starts it again at 0), before anything changes; keeps what it changes for
        `abort_decode`. ValueError otherwise."""
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for p, ids in zip(np.asarray(positions).tolist(), seq_ids):
            if len(ids) != 1:
                raise ValueError("a token of several sequences: a recurrent model's sequences "
                                 "each need their own state")
            s = ids[0]
            if s in last and p != last[s] + 1:
                raise ValueError(f"sequence {s}: positions {last[s]} then {p}; a recurrent "
                                 f"model takes a sequence's tokens in order")
            first.setdefault(s, p)
            last[s] = p
        for s, p in first.items():
            if p != 0 and p != self.n_past[s]:
                raise ValueError(f"sequence {s} continues at position {p}, but its recurrent "
                                 f"state holds positions [0, {int(self.n_past[s])})")
        self._backup = {s: (self._copy_state(s), list(self.checkpoints[s])) for s in first}
        self._batch = last
        for s, p in first.items():
            if p == 0:
                self._reset(s)

    def end_decode(self) -> None:
        """The batch went through: each sequence's state now holds its positions up to the
        batch's last; a sequence given several tokens gets a checkpoint."""
        for s, p in self._batch.items():
            n_new = p + 1 - int(self.n_past[s])
            self.n_past[s] = p + 1
            if n_new > 1 and self.n_checkpoints > 0:
                cps = [c for c in self.checkpoints[s] if c.n_past < p + 1]
                cps.append(self._copy_state(s))
                self.checkpoints[s] = cps[-self.n_checkpoints:]
        self._backup = None

    def abort_decode(self) -> None:
        """The batch failed: every sequence it touched gets its state back."""
        for s, (state, cps) in (self._backup or {}).items():
            self._set_state(s, state)
            self.checkpoints[s] = cps
        self._backup = None

    def state_at(self, il: int, seq: int) -> tuple[np.ndarray, np.ndarray]:
        """Layer il's conv state and delta-rule state of `seq` (views, updated in place)."""
        return self.conv[il][seq], self.ssm[il][seq]

    # ------------------------------------------------------------------ sequences

    def reusable_prefix(self, seq_id: int, n: int) -> int:
        """The longest prefix of at most n tokens that `seq_id` can keep: its live state's
        length or a checkpoint's, else 0."""
        self._check_seqs((seq_id,))
        best = 0
        for m in (int(self.n_past[seq_id]), *(c.n_past for c in self.checkpoints[seq_id])):
            if best < m <= n:
                best = m
        return best

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """Removes positions [p0, p1) of `seq_id` (every sequence when < 0): the whole
        sequence, or its tail from a position where its live state or a checkpoint stands;
        False, changing nothing, for any other range (llama_memory_recurrent::seq_rm)."""
        seqs = range(self.n_seq_max) if seq_id < 0 else (seq_id,)
        if seq_id >= 0:
            self._check_seqs((seq_id,))
        p0 = max(0, p0 if p0 is not None else 0)
        plan = []
        for s in seqs:
            end = int(self.n_past[s])
            if p1 is not None and 0 <= p1 < end and p1 > p0:
                return False  # the middle of a state cannot go
            if p0 >= end:
                continue
            if p0 == 0:
                plan.append((s, None))
                continue
            cp = next((c for c in self.checkpoints[s] if c.n_past == p0), None)
            if cp is None:
                return False
            plan.append((s, cp))
        super().seq_rm(seq_id, p0, p1)
        for s, cp in plan:
            if cp is None:
                self._reset(s)
            else:
                self._set_state(s, cp)
                self.checkpoints[s] = [c for c in self.checkpoints[s] if c.n_past <= p0]
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """`dst` shares `src`'s cells and gets a copy of its state (llama_memory_recurrent's
        seq_cp copies the whole sequence)."""
        super().seq_cp(src, dst, p0, p1)
        if src != dst:
            self._set_state(dst, self._copy_state(src))
            self.checkpoints[dst] = []

    def seq_keep(self, seq_id: int) -> None:
        super().seq_keep(seq_id)
        for s in range(self.n_seq_max):
            if s != seq_id:
                self._reset(s)

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """Shifts positions of the attention layers' cells; the states hold no positions, only
        how many tokens they absorbed, which a shift of the tail moves along (its checkpoints
        no longer match positions and are dropped)."""
        super().seq_add(seq_id, p0, p1, delta)
        if delta == 0:
            return
        for s in range(self.n_seq_max) if seq_id < 0 else (seq_id,):
            end = int(self.n_past[s])
            if end and (p0 is None or p0 < 0 or p0 < end) and (p1 is None or p1 < 0 or p1 >= end):
                self.n_past[s] = max(0, end + delta)
                self.checkpoints[s] = []

    def clear(self) -> None:
        super().clear()
        for s in range(self.n_seq_max):
            self._reset(s)

    def __repr__(self):
        return (f"HybridCache(n_ctx={self.n_ctx}, used={self.used_cells}, "
                f"{len(self.recurrent.layers)} recurrent layers, n_seq_max={self.n_seq_max}, "
                f"{self.nbytes / 2**20:.1f} MiB)")
