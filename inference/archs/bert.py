"""`bert`: BERT sentence encoders — MiniLM, BGE, E5, GTE... (llama.cpp's src/models/bert.cpp).

    x = LayerNorm(token_embd[tokens] + token_types[0] + position_embd[positions])
    per layer:  h = LayerNorm(x + wo · attn(wq · x, wk · x, wv · x) + bo)       (no mask inside
                                                                                a sequence)
                x = LayerNorm(h + down(gelu(up · h + b_up)) + b_down)
    the output is every token's x; embeddings pool it (mean or [CLS], `bert.pooling_type`)

An encoder: attention is bidirectional, post-norm (LayerNorm with bias after each residual add),
Q/K/V with biases (or one fused `attn_qkv`), plain GELU (ggml's fp16 table), absolute position
embeddings (so a sequence has at most `context_length` tokens). Every token is "sentence A":
llama.cpp adds row 0 of the token-type table, and so do we. It runs without a KV cache and
computes no logits (model.py's EmbeddingContext). `nomic-bert` (archs/nomic_bert.py) is this
graph with RoPE instead of position embeddings and a SwiGLU FFN.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from ..hparams import HParams, Meta, ModelMetadataError
from .base import Architecture, LayerTensors, WeightLoader, Weights, _linear

MAX_TOKEN_TYPES = 1 << 16


class Bert(Architecture):
    name = "bert"
    absolute_positions = True  # position_embd.weight (nomic-bert: RoPE)
    gated_ffn = False  # down(gelu(up · h)) with biases (nomic-bert: down(silu(gate · h) * up · h))
    rope_scalings = ("none", "linear")  # for the families that rotate Q and K

    # ------------------------------------------------------------------ hyperparameters

    def read_hparams(self, meta: Meta, hp: HParams) -> None:
        # required, as llama.cpp's load_arch_hparams reads it
        hp.norm_eps = meta.float("attention.layer_norm_epsilon", lo=0.0, hi=1.0, lo_open=True)
        n_types = meta.int("tokenizer.ggml.token_type_count", 0, lo=0, hi=MAX_TOKEN_TYPES)
        if n_types == 0:
            raise ModelMetadataError(f"a {self.name} model needs tokenizer.ggml.token_type_count "
                                     f"(its number of token types), which this file lacks")
        hp.extra["n_token_types"] = n_types
        if hp.n_ff <= 0:
            raise ModelMetadataError(f"GGUF metadata lacks {meta.key('feed_forward_length')}")
        if hp.head_dim_k != hp.head_dim_v:
            raise ModelMetadataError(f"{self.name}: key length {hp.head_dim_k} differs from value "
                                     f"length {hp.head_dim_v}")
        if hp.pooling == "rank":
            raise ModelMetadataError(f"{meta.key('pooling_type')} = 4 (rank): reranking models "
                                     f"are not supported, only embedding models")
        if not self.absolute_positions and hp.rope_scaling not in self.rope_scalings:
            raise ModelMetadataError(
                f"{meta.key('rope.scaling.type')} = {hp.rope_scaling!r} is not supported for "
                f"{self.name} (supported: {', '.join(self.rope_scalings)})")

    def max_positions(self, hp: HParams) -> int | None:
        return hp.n_ctx_train if self.absolute_positions else None

    # ------------------------------------------------------------------ weights

    def load_weights(self, loader: WeightLoader, hp: HParams) -> Weights:
        e = hp.n_embd
        extra = dict(type_row=self._sentence_a_row(loader, hp),
                     norm=loader.vector("token_embd_norm.weight", e),
                     norm_b=loader.vector("token_embd_norm.bias", e),
                     pos_embd=loader.matrix("position_embd.weight", hp.n_ctx_train, e)
                     if self.absolute_positions else None)
        return Weights(tok_embd=loader.matrix("token_embd.weight", hp.n_vocab, e),
                       output_norm=None, output=None, extra=extra,
                       layers=[self.load_layer(loader.layer(il), hp) for il in range(hp.n_layer)])

    @staticmethod
    def _sentence_a_row(loader: WeightLoader, hp: HParams):
        """Row 0 of token_types.weight, which llama.cpp adds to every token; None without it."""
        table = loader.matrix("token_types.weight", hp.extra["n_token_types"], hp.n_embd,
                              optional=True)
        if table is None:
            return None
        return loader.model.backend_for(-1).get_rows(table, np.zeros(1, np.int64))[0]

    def load_layer(self, t: LayerTensors, hp: HParams) -> SimpleNamespace:
        e, f = hp.n_embd, hp.n_ff
        n_q, n_kv = hp.n_head * hp.head_dim_k, hp.n_head_kv * hp.head_dim_k
        ffn = dict(w_gate=t.matrix("ffn_gate.weight", f, e), b_up=None, b_down=None) \
            if self.gated_ffn else \
            dict(w_gate=None, b_up=t.vector("ffn_up.bias", f, optional=True),
                 b_down=t.vector("ffn_down.bias", e, optional=True))
        return SimpleNamespace(
            **self._load_qkv(t, e, n_q, n_kv),
            wo=t.matrix("attn_output.weight", e, n_q),
            bo=t.vector("attn_output.bias", e, optional=True),
            attn_out_norm=t.vector("attn_output_norm.weight", e),
            attn_out_norm_b=t.vector("attn_output_norm.bias", e),
            w_up=t.matrix("ffn_up.weight", f, e),
            w_down=t.matrix("ffn_down.weight", e, f),
            **ffn,
            out_norm=t.vector("layer_output_norm.weight", e),
            out_norm_b=t.vector("layer_output_norm.bias", e),
        )

    @staticmethod
    def _load_qkv(t: LayerTensors, e: int, n_q: int, n_kv: int) -> dict:
        """One fused `attn_qkv` (Q, K, V rows in that order) or separate Q, K, V, each with
        its bias when the file has one (create_tensor_qkv); a fused matrix with separate biases
        gets them joined, as build_qkv concatenates them."""
        wqkv = t.matrix("attn_qkv.weight", n_q + 2 * n_kv, e, optional=True)
        if wqkv is None:
            return dict(wqkv=None, bqkv=None,
                        wq=t.matrix("attn_q.weight", n_q, e), wk=t.matrix("attn_k.weight", n_kv, e),
                        wv=t.matrix("attn_v.weight", n_kv, e),
                        bq=t.vector("attn_q.bias", n_q, optional=True),
                        bk=t.vector("attn_k.bias", n_kv, optional=True),
                        bv=t.vector("attn_v.bias", n_kv, optional=True))
        bqkv = t.vector("attn_qkv.bias", n_q + 2 * n_kv, optional=True)
        if bqkv is None:
            loader, p = t.loader, f"blk.{t.il}."
            parts = [loader.host_vector(p + name, n, optional=True)
                     for name, n in (("attn_q.bias", n_q), ("attn_k.bias", n_kv),
                                     ("attn_v.bias", n_kv))]
            if all(b is not None for b in parts):
                bqkv = loader.model.backend_for(t.il).take(np.concatenate(parts))
        return dict(wqkv=wqkv, bqkv=bqkv)

    # ------------------------------------------------------------------ forward

    def forward(self, ctx, w: Weights) -> np.ndarray:
        """Every token's output state, float32 (n_tokens, n_embd)."""
        hp, be = ctx.hp, ctx.backend(-1)
        x = self.embed(ctx, w)
        x = be.layer_norm(x, w.extra["norm"], w.extra["norm_b"], hp.norm_eps)
        for il, layer in enumerate(w.layers):
            x = self.block(ctx, il, layer, ctx.backend(il).take(x))
        return ctx.backend(hp.n_layer - 1).to_host(x)

    def embed(self, ctx, w: Weights):
        be = ctx.backend(-1)
        x = be.get_rows(w.tok_embd, ctx.tokens)
        if w.extra["type_row"] is not None:
            x = be.add(x, w.extra["type_row"])
        if w.extra["pos_embd"] is not None:
            x = be.add(x, be.get_rows(w.extra["pos_embd"], ctx.positions))
        return x

    def block(self, ctx, il: int, L, x):
        hp, be = ctx.hp, ctx.backend(il)
        q, k, v = self.project_qkv(ctx, il, L, x)
        q, k = self.rotate(ctx, il, q, k)
        a = _linear(be, L.wo, ctx.attend(il, q, k, v, hp.kq_scale), L.bo)
        h = be.layer_norm(be.add(a, x), L.attn_out_norm, L.attn_out_norm_b, hp.norm_eps)
        return be.layer_norm(be.add(self.ffn(be, L, h), h), L.out_norm, L.out_norm_b,
                             hp.norm_eps)

    def project_qkv(self, ctx, il: int, L, x):
        """(q, k, v) as (n, heads, head_dim), biases added."""
        hp, be, n = ctx.hp, ctx.backend(il), ctx.n_tokens
        n_q, n_kv = hp.n_head * hp.head_dim_k, hp.n_head_kv * hp.head_dim_k
        if L.wqkv is not None:
            qkv = _linear(be, L.wqkv, x, L.bqkv)
            q, k, v = qkv[:, :n_q], qkv[:, n_q:n_q + n_kv], qkv[:, n_q + n_kv:]
        else:
            q, k, v = (_linear(be, L.wq, x, L.bq), _linear(be, L.wk, x, L.bk),
                       _linear(be, L.wv, x, L.bv))
        return (q.reshape(n, hp.n_head, hp.head_dim_k), k.reshape(n, hp.n_head_kv, hp.head_dim_k),
                v.reshape(n, hp.n_head_kv, hp.head_dim_v))

    def rotate(self, ctx, il: int, q, k):
        """Q and K at their positions: as they are here (the positions were added to the input)."""
        return q, k

    def ffn(self, be, L, h):
        if self.gated_ffn:
            return be.matmul(L.w_down, be.swiglu(be.matmul(L.w_gate, h), be.matmul(L.w_up, h)))
        return _linear(be, L.w_down, be.gelu(_linear(be, L.w_up, h, L.b_up)), L.b_down)


ARCH = Bert()
