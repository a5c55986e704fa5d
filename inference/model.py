"""The transformer forward pass: hyperparameters from GGUF metadata, batches, the KV cache, and the
architecture registry.

    gguf = GGUFFile.open(path)
    model = Model.load(gguf, LoadConfig(n_ctx=2048))
    logits = model.decode(Batch(prompt_ids))           # (1, n_vocab): the last token's row
    logits = model.decode(Batch([next_id]))            # continues sequence 0 through the cache
    all_rows = model.logits_for(token_ids)             # a fresh sequence, one row per token
    tokens = model.decode_tokens(Batch([next_id]))     # (1,) int32: greedy, where samples_greedy

`decode` works like llama_decode: the batch's tokens go through every matrix product together (cut
into micro-batches of `n_ubatch`), their K and V rows are written into free cells of the cache,
and attention looks at every cell of the token's sequence up to its position (and within the
sliding window on local layers). Only the rows that want logits leave the last layer.
`decode_tokens` runs a batch the same way for callers that sample greedily: the argmax of each
output row is taken where the logits are (on a GPU, llama.cpp's backend greedy sampler), and only
the token ids reach the host.

    vectors = model.embed([ids_a, ids_b], "mean")      # (2, n_embd): pooled, not normalized

`embed` is llama.cpp's embedding decode (`--embeddings --pooling`): whole sequences, each from
position 0, attend only to their own tokens — bidirectionally for an encoder (BERT), causally
for a decoder — without the KV cache (as llama.cpp runs its encoders), so it never touches the
sequences generations keep there. An encoder's cache holds no K/V rows at all.

GPU offload (llama.cpp's -ngl, -mg, -ts, -sm, --no-kv-offload): `Model.load(gguf,
LoadConfig(offload=OffloadOptions(n_gpu_layers=N)))` places the layers as
llama_model::load_tensors does (inference/cuda/offload.py) and runs each on its backend;
activations cross a device boundary once per boundary per batch (`Backend.take`). Without a
usable GPU, or when the device runs out of memory while loading, the model loads on the CPU and
`offload_note` says why in one line.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Sequence

import numpy as np

from .cpu import attention
from .archs.base import Architecture, WeightLoader
from .backend import KQMask, move
from .cpu.backend import CPUBackend
from .catalog import UnsupportedArchitectureError, get_arch
from .config import LoadConfig, config_or_defaults
from .embedding import POOLINGS, pool
from .hparams import HParams, ModelMetadataError, read_hparams
from .kv_cache import KVCache, KVCacheFullError, KVRows
from .memory import check_kv_fits, kv_cell_bytes, kv_cell_values

__all__ = ["Architecture", "Batch", "EmbeddingContext", "EmbeddingOnlyError", "ForwardContext",
           "HParams", "KVCacheFullError", "Model", "ModelMetadataError",
           "UnsupportedArchitectureError"]


class EmbeddingOnlyError(ValueError):
    """The model is an encoder (BERT and kin): it computes embeddings, never next-token logits,
    so it cannot generate text."""

    def __init__(self, arch: str):
        super().__init__(f"this is an embedding model ({arch}, an encoder): it computes "
                         f"embeddings, not text; use it for embeddings")


# ----------------------------------------------------------------------------- batches


class Batch:
    """Tokens to decode together (llama_batch).

    tokens:  token ids.
    pos:     positions, one per token; an int p0 for p0, p0+1, ...; None to continue each token's
             sequence after its last position in the cache.
    seq_ids: the sequences of each token: one int for all tokens, one int per token, or one
             sequence of ints per token (a token may belong to several sequences).
    logits:  which tokens want logits: None (the last one), True (all), False (none), or a bool
             per token.
    """

    def __init__(self, tokens, pos=None, seq_ids=0, logits=None):
        self.tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        n = self.tokens.size
        if n == 0:
            raise ValueError("an empty batch")
        if pos is None:
            self.pos = None
        elif np.isscalar(pos):
            self.pos = np.arange(int(pos), int(pos) + n, dtype=np.int64)
        else:
            self.pos = np.asarray(pos, dtype=np.int64).reshape(-1)
            if self.pos.size != n:
                raise ValueError(f"{self.pos.size} positions for {n} tokens")
        if np.isscalar(seq_ids):
            self.seq_ids = ((int(seq_ids),),) * n
        else:
            seq_ids = list(seq_ids)
            if len(seq_ids) != n:
                raise ValueError(f"{len(seq_ids)} sequence ids for {n} tokens")
            self.seq_ids = tuple((int(s),) if np.isscalar(s) else tuple(int(x) for x in s)
                                 for s in seq_ids)
            if any(len(s) == 0 for s in self.seq_ids):
                raise ValueError("a token without a sequence")
        if logits is None:
            self.logits = np.zeros(n, np.bool_)
            self.logits[-1] = True
        elif logits is True or logits is False:
            self.logits = np.full(n, logits, np.bool_)
        else:
            self.logits = np.asarray(logits, dtype=np.bool_).reshape(-1)
            if self.logits.size != n:
                raise ValueError(f"{self.logits.size} logits flags for {n} tokens")

    def __len__(self):
        return int(self.tokens.size)

    @property
    def n_outputs(self) -> int:
        return int(np.count_nonzero(self.logits))

    def __repr__(self):
        return f"Batch({len(self)} tokens, {self.n_outputs} outputs)"


# ----------------------------------------------------------------------------- forward context


class ForwardContext:
    """One micro-batch on its way through the layers: token positions, the cells they were given,
    the KQ masks, which rows leave the last layer; `attend` runs a layer's attention through the
    cache."""

    embeddings = False  # the forward pass returns logits (EmbeddingContext: hidden states)
    greedy = False  # ... or the greedy token of each output row (Model.decode_tokens)

    def __init__(self, model: "Model", tokens: np.ndarray, positions: np.ndarray,
                 cells: np.ndarray, seq_first: np.ndarray, out_rows: np.ndarray):
        self.model = model
        self.hp = model.hparams
        self.kv = model.kv
        self.tokens = tokens
        self.positions = positions
        self.cells = cells
        self.out_rows = out_rows
        self.n_tokens = tokens.size
        self.n_kv = self.kv.n_kv()
        self._masks = {}
        self.seq_first = seq_first
        for be in model.backends:  # the batch's inputs go to each device once
            be.begin_batch(self)

    def backend(self, il: int):
        """The backend that runs layer `il` (-1: input embedding, n_layer: output head)."""
        return self.model.backend_for(il)

    def keep_rows(self, il: int) -> np.ndarray | None:
        """On the last layer, the rows that go on to the output (llama.cpp's inp_out_ids) when
        some are dropped; None on the others, and when every row goes on."""
        if il != self.hp.n_layer - 1 or self.out_rows.size == self.n_tokens:
            return None
        return self.out_rows

    def rope(self, il: int):
        """How layer il rotates Q and K (an rope.RopeSpec; None: it does not)."""
        return self.model.layer_rope[il]

    def shared(self, key, make):
        """make(), called once per batch for `key`: what every layer of a kind reads (the masks
        and visible cells below, a backend's fused step's RoPE tables)"""
        value = self._masks.get(key)
        if value is None:
            value = self._masks[key] = make()
        return value

    def mask(self, n_swa: int) -> np.ndarray:
        return self.shared(n_swa, lambda: self.kv.mask(self.positions, self.seq_first,
                                                       self.n_kv, n_swa))

    def visible_cells(self, n_swa: int) -> tuple[np.ndarray, np.ndarray]:
        """Each token's visible cells in position order (attention.visible_cells), once per batch
        and window: the order a token's attention sums visit them, so that its result does not
        depend on where the cache put its cells (wherever other requests left room)."""
        return self.shared(("cells", n_swa),
                           lambda: attention.visible_cells(self.mask(n_swa), self.cell_order))

    def sampled_cells(self, n_swa: int) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """(out_rows, their visible cells by position): for a batch too large for the per-token
        attention kernel, the rows whose logits are sampled still take it (Backend.attention)."""
        return self.shared(("sampled", n_swa), lambda: (self.out_rows, attention.visible_cells(
            self.mask(n_swa)[self.out_rows], self.cell_order)))

    @functools.cached_property
    def cell_order(self) -> np.ndarray:
        """Cells [0, n_kv) by position (KVCache.cell_order), sorted once per batch for every
        window and row set that lists visible cells."""
        return self.kv.cell_order(self.n_kv)

    def attend(self, il: int, q, k, v, scale: float, softcap: float = 0.0, sinks=None):
        """Stores this batch's K and V (n, n_head_kv, head_dim) of layer `il` in the cache, then
        attends q (n, n_head, head_dim) over the cache: (n, n_head * head_dim_v); softcap > 0
        soft-caps the scores, sinks (the layer's per-head sink logits) join the softmax
        (Backend.attention). k and v None: a layer that reuses an earlier layer's cache
        (KVCache.kv_source) attends over those rows, storing nothing. Where the layer's cache
        is kept by another backend than the layer's (--no-kv-offload), q, k and v go there and
        the result comes back, as llama.cpp runs attention next to the cache."""
        be, kv_be = self.backend(il), self.model.kv_backends[il]
        q = move(q, be, kv_be)
        if sinks is not None:  # a weight of the layer's backend
            sinks = move(sinks, be, kv_be)
        if k is not None:
            k, v = move(k, be, kv_be), move(v, be, kv_be)
            self.kv.write(il, self.cells, k, v)  # into the rows the cache's backend keeps
        k_all, v_all = self.kv.read(il, self.n_kv)
        out = kv_be.attention(q, k_all, v_all, KQMask(self, self.hp.window(il)), scale, softcap,
                              sinks)
        return move(out, kv_be, be)


class EmbeddingContext(ForwardContext):
    """Whole sequences on their way to embeddings: their tokens attend only to each other, with
    no KV cache (llama.cpp's build_attn_inp_no_cache, which its encoders use), bidirectionally
    within a sequence unless the model is causal (a decoder's embeddings, `hp.causal`). The
    forward pass returns every token's hidden state after the final norm."""

    embeddings = True

    def __init__(self, model: "Model", tokens: np.ndarray, positions: np.ndarray,
                 seq_index: np.ndarray):
        self.model = model
        self.hp = model.hparams
        self.kv = None
        self.tokens = tokens
        self.positions = positions
        self.cells = None
        self.n_tokens = self.n_kv = tokens.size
        self.out_rows = np.arange(tokens.size)
        self._masks = {}
        self._seq_index = seq_index
        self._own_kv = {}  # layer → its (k, v), for the layers that reuse them

    def keep_rows(self, il: int) -> None:
        return None  # every token's state is pooled

    def mask(self, n_swa: int) -> np.ndarray:
        return self.shared(n_swa, lambda: _batch_kq_mask(self.positions, self._seq_index,
                                                         self.hp.causal, n_swa))

    def attend(self, il: int, q: np.ndarray, k: np.ndarray, v: np.ndarray,
               scale: float, softcap: float = 0.0, sinks=None) -> np.ndarray:
        """q over this batch's own k and v (n, heads, head_dim): (n, n_head * head_dim_v);
        k and v None: over those of the layer it reuses (Model.kv_source)."""
        if k is None:
            src = self.model.kv_source[il]
            k, v = (move(a, self.backend(src), self.backend(il)) for a in self._own_kv[src])
        else:
            self._own_kv[il] = (k, v)
        return self.backend(il).attention(q, k, v, self.mask(self.hp.window(il)), scale,
                                          softcap, sinks)


def _batch_kq_mask(positions: np.ndarray, seq_index: np.ndarray, causal: bool,
                   n_swa: int) -> np.ndarray:
    """float32 (n, n): 0 where token t sees token j of the same batch — same sequence, and
    (causal) not after it, and (sliding window) fewer than n_swa positions before — else -inf,
    as llama.cpp's no-cache mask (llm_graph_input_attn_no_cache::set_input)."""
    visible = seq_index[:, None] == seq_index[None, :]
    distance = positions[:, None] - positions[None, :]
    if causal:
        visible &= distance >= 0
    if n_swa > 0:
        visible &= distance < n_swa
    return np.where(visible, np.float32(0.0), np.float32(-np.inf)).astype(np.float32)


# ----------------------------------------------------------------------------- the model


class Model:
    """A loaded model with its KV cache. `decode(batch)` → logits of the rows that asked."""

    def __init__(self, gguf, arch: Architecture, hparams: HParams, backend, n_ctx: int,
                 config: LoadConfig | None = None, owns_file: bool = False, placement=None):
        """A model over `gguf` with a KV cache of `n_ctx` cells (resolved: never 0) in config's
        cache types, one sequence per slot (config.n_parallel), micro-batches of
        config.n_ubatch; `backend` is the CPU's, `placement` where each part runs (None: all on
        `backend`). Model.load builds these from a file."""
        from .placement import cpu_only
        config = config_or_defaults(config)
        self.gguf = gguf
        self.arch = arch
        self.hparams = hparams
        hp = hparams
        # the backend of every part: the input embedding, each layer, each layer's KV rows, the
        # output (a GPU's for the layers -ngl offloads; the CPU's everywhere without a placement)
        self.placement = placement or cpu_only(backend, hp.n_layer)
        self.backend = backend
        self.layer_backends = list(self.placement.layers)
        self.kv_backends = list(self.placement.kv)
        self.backends = self.placement.backends
        self.n_ubatch = config.n_ubatch
        self._owns_file = owns_file
        # weights first: every tensor is checked against the hyperparameters before the cache
        # (the one big allocation) is made
        self.weights = arch.load_weights(WeightLoader(gguf, self), hparams)
        cache_type_k, cache_type_v = config.cache_type_k, config.cache_type_v
        # an encoder attends without the cache (llama.cpp gives it no memory): its cache keeps
        # the cells' bookkeeping for the engine's slots but no K/V rows
        n_cached = 0 if hp.encoder else hp.n_layer
        # a layer that reuses an earlier layer's K and V (Gemma 4) attends where they are kept
        self.kv_source = [arch.kv_source(hp, il) for il in range(hp.n_layer)]
        for il, src in enumerate(self.kv_source):
            self.kv_backends[il] = self.kv_backends[src]
        shapes = [arch.kv_shape(hp, il) for il in range(n_cached)]
        recurrent = arch.recurrent_rows(hp)  # a hybrid model's recurrent layers keep no K/V
        per_cell = kv_cell_bytes(kv_cell_values(arch, hp), cache_type_k, cache_type_v)
        check_kv_fits(n_ctx, sum(b for il, b in enumerate(per_cell)
                                 if self.kv_backends[il].device is None),
                      sum(t.nbytes for t in gguf.tensors.values())
                      - sum(getattr(be, "weight_bytes", 0) for be in self.backends))
        # how each layer rotates Q and K: attention and the cache's position shift share it
        self.layer_rope = [arch.layer_rope(hp, il, n_ctx) for il in range(hp.n_layer)]
        rows = KVRows(hp.n_head_kv, hp.head_dim_k, hp.head_dim_v, cache_type_k, cache_type_v)
        if any(shape != shapes[0] for shape in shapes):  # layers of different head sizes
            rows = [KVRows(*shape, cache_type_k, cache_type_v) for shape in shapes]
        if recurrent is None:
            self.kv = KVCache(n_ctx, n_cached, rows, n_seq_max=config.n_parallel,
                              layer_rope=self.layer_rope[:n_cached],
                              layer_backends=self.kv_backends[:n_cached],
                              kv_source=self.kv_source[:n_cached])
        else:  # a hybrid model: recurrent states beside the attention layers' cells
            from .recurrent import HybridCache
            self.kv = HybridCache(n_ctx, n_cached, rows, recurrent, n_seq_max=config.n_parallel,
                                  layer_rope=self.layer_rope[:n_cached],
                                  layer_backends=self.kv_backends[:n_cached])
        self._graphs = self._decode_graphs()

    @classmethod
    def load(cls, gguf_file, config: LoadConfig | None = None, backend=None) -> "Model":
        """A model from an open GGUFFile (or a path), loaded as `config` says (LoadConfig: the
        KV cache's n_ctx cells, 0 for the model's training context, its cache types, one
        sequence per slot, micro-batches of n_ubatch, and the GPU offload options, llama.cpp's
        -ngl, -mg, -ts, -sm and --no-kv-offload). `backend`: the CPU's (a CPUBackend when None).
        `offload_note` says why the GPU is not used when it is not."""
        from .cuda.offload import place
        from .cuda.runtime import DeviceOutOfMemory
        config = config_or_defaults(config)
        owns = False
        if isinstance(gguf_file, (str, os.PathLike)):
            from .gguf import GGUFFile
            gguf_file = GGUFFile.open(gguf_file)
            owns = True
        try:
            spec = get_arch(gguf_file.metadata.get("general.architecture"))
            hp = read_hparams(gguf_file, spec)
            n_ctx = config.n_ctx or hp.n_ctx_train
            cpu = backend or CPUBackend()
            placement = place(gguf_file, hp, config, n_ctx, cpu)
            args = (gguf_file, spec.load(), hp, cpu, n_ctx, config, owns)
            try:
                return cls(*args, placement=placement)
            except DeviceOutOfMemory as e:  # llama.cpp would stop; the CPU can run the model
                note = f"{e} while loading the model; running on the CPU"
            placement.close()  # (the half-loaded model's device arrays are gone by now)
            model = cls(*args)
            model.placement.note = note
            return model
        except BaseException:
            if owns:
                gguf_file.close()
            raise

    # ---------------------------------------------------------------- properties

    @property
    def n_vocab(self) -> int:
        return self.hparams.n_vocab

    @property
    def n_ctx(self) -> int:
        return self.kv.n_ctx

    @property
    def offload_note(self) -> str:
        """Why the GPU is not used (one line), or ''."""
        return self.placement.note

    @property
    def n_gpu_layers(self) -> int:
        """Layers on a GPU, the output layer counted (llama.cpp's "offloaded N/M layers")."""
        return self.placement.n_gpu_layers

    @property
    def vram_bytes(self) -> int:
        """Device memory the model's weights and KV rows take, all GPUs together."""
        return sum(be.vram_bytes for be in self.placement.gpu_backends)

    def backend_for(self, il: int):
        if 0 <= il < len(self.layer_backends):
            return self.layer_backends[il]
        return self.placement.input if il < 0 else self.placement.output

    def _decode_graphs(self):
        """CUDA graphs for decode steps when one GPU runs the whole model (cuda/graphs.py)."""
        if len(self.backends) != 1 or self.backends[0].device is None \
                or not self.arch.graph_capturable:
            return None
        from .cuda.graphs import DecodeGraphs, graphs_enabled
        return DecodeGraphs(self.backends[0]) if graphs_enabled() else None

    def close(self) -> None:
        self._graphs = None
        self.placement.close()
        if self._owns_file:
            self.gguf.close()

    def __repr__(self):
        hp = self.hparams
        return (f"Model({hp.arch}, {hp.n_layer} layers, n_embd {hp.n_embd}, vocab {hp.n_vocab}, "
                f"{self.kv!r})")

    # ---------------------------------------------------------------- decoding

    @property
    def samples_greedy(self) -> bool:
        """`decode_tokens` samples on the device that computes the logits: the output layer's
        backend can (Backend.samples_greedy: a GPU's) and the family's head gives the logits as
        the output matrix makes them (Architecture.greedy_on_device)."""
        return self.placement.output.samples_greedy and self.arch.greedy_on_device(self.hparams)

    def decode(self, batch: Batch) -> np.ndarray:
        """Runs the batch; float32 (batch.n_outputs, n_vocab), rows in batch order. Raises
        KVCacheFullError (cache unchanged) when there is no room."""
        return self._decode(batch, greedy=False)

    def decode_tokens(self, batch: Batch) -> np.ndarray:
        """Runs the batch as `decode` does and returns the greedy token of each output row
        instead of its logits: int32 (batch.n_outputs,), the lowest id of the row's largest
        logit, -1 for a row holding a NaN or an infinity. Sampled where the logits are, so that
        4 bytes per row reach the host rather than n_vocab * 4; only where `samples_greedy`."""
        if not self.samples_greedy:
            raise ValueError("this model samples on the host: its logits come from "
                             f"{self.placement.output!r} (decode_tokens needs samples_greedy)")
        return self._decode(batch, greedy=True)

    def _decode(self, batch: Batch, greedy: bool) -> np.ndarray:
        if not isinstance(batch, Batch):
            batch = Batch(batch)
        hp = self.hparams
        if hp.encoder:
            raise EmbeddingOnlyError(hp.arch)
        n = len(batch)
        self._check_tokens(batch.tokens)
        for ids in batch.seq_ids:
            for s in ids:
                if not 0 <= s < self.kv.n_seq_max:
                    raise ValueError(f"sequence id {s} out of range [0, {self.kv.n_seq_max})")
        positions = batch.pos if batch.pos is not None else self._continue_positions(batch)
        if positions.min() < 0:
            raise ValueError("negative position")
        self.kv.find_slots(n)  # all or nothing: fail before touching the cache
        seq_first = np.array([s[0] for s in batch.seq_ids], np.int64)
        self.kv.begin_decode(positions, batch.seq_ids)  # recurrent states: checked, kept
        parts, claimed = [], []
        try:
            for u0 in range(0, n, self.n_ubatch):
                u1 = min(n, u0 + self.n_ubatch)
                cells = self.kv.find_slots(u1 - u0)
                self.kv.store_cells(cells, positions[u0:u1], batch.seq_ids[u0:u1])
                claimed.append(cells)
                out_rows = np.flatnonzero(batch.logits[u0:u1])
                ctx = ForwardContext(self, batch.tokens[u0:u1], positions[u0:u1], cells,
                                     seq_first[u0:u1], out_rows)
                ctx.greedy = greedy
                part = self._forward(ctx)
                # (a micro-batch without output rows ends before the head: no tokens)
                parts.append(part if len(part) or not greedy else np.empty(0, np.int32))
        except BaseException:  # leave the cache as it was (an interrupted prompt, say)
            for cells in claimed:
                self.kv.free_cells(cells)
            self.kv.abort_decode()
            raise
        self.kv.end_decode()
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts, axis=0)

    def _forward(self, ctx: ForwardContext) -> np.ndarray:
        def forward():
            return self.arch.forward(ctx, self.weights)
        return forward() if self._graphs is None else self._graphs.run(ctx, forward)

    def _check_tokens(self, tokens: np.ndarray) -> None:
        if tokens.min() < 0 or tokens.max() >= self.hparams.n_vocab:
            raise ValueError(f"token id out of range [0, {self.hparams.n_vocab})")

    # ---------------------------------------------------------------- embeddings

    @property
    def max_embed_tokens(self) -> int:
        """The longest sequence `embed` takes: the context, and no more positions than the
        model has position embeddings for (BERT's table)."""
        limit = self.arch.max_positions(self.hparams)
        return self.n_ctx if limit is None else min(self.n_ctx, limit)

    def embed(self, sequences: Sequence[Sequence[int]], pooling: str) -> np.ndarray:
        """Pooled embeddings, float32 (len(sequences), n_embd), not normalized: each sequence
        evaluated on its own from position 0 and its hidden states after the final norm
        pooled by `pooling` ("mean", "cls": the first token's, "last"), as llama.cpp's
        build_pooling. One forward pass per sequence, never several in one batch: the matmul
        path depends on a batch's token count (short batches take the float32 batch-decode
        kernel, longer ones the bfloat16 GEMM), so batching would make a text's vector depend
        on the texts sent with it. The KV cache is not touched. ValueError for an empty or too
        long sequence, a token outside the vocabulary, or an unknown pooling."""
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, not {pooling!r}")
        seqs = [np.asarray(s, dtype=np.int64).reshape(-1) for s in sequences]
        for i, ids in enumerate(seqs):
            if not 0 < ids.size <= self.max_embed_tokens:
                raise ValueError(f"input {i} has {ids.size} tokens: expected 1 to "
                                 f"{self.max_embed_tokens}")
            self._check_tokens(ids)
        out = np.empty((len(seqs), self.hparams.n_embd), np.float32)
        for i, ids in enumerate(seqs):
            ctx = EmbeddingContext(self, ids, np.arange(ids.size, dtype=np.int64),
                                   np.zeros(ids.size, np.int64))
            out[i] = pool(self.arch.forward(ctx, self.weights), [ids.size], pooling)[0]
        return out

    def _continue_positions(self, batch: Batch) -> np.ndarray:
        nxt: dict[int, int] = {}
        pos = np.empty(len(batch), np.int64)
        for i, ids in enumerate(batch.seq_ids):
            s = ids[0]
            if s not in nxt:
                nxt[s] = self.kv.seq_pos_max(s) + 1
            pos[i] = nxt[s]
            nxt[s] += 1
        return pos

    def logits_for(self, token_ids: Sequence[int], seq_id: int = 0) -> np.ndarray:
        """Logits of every position of `token_ids` evaluated as a fresh sequence `seq_id` from
        position 0 (its old cells are dropped first): float32 (len(token_ids), n_vocab)."""
        self.kv.seq_rm(seq_id, -1, -1)
        return self.decode(Batch(token_ids, pos=0, seq_ids=seq_id, logits=True))
