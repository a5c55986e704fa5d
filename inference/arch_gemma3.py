"""`gemma3`: Gemma 3 text models (llama.cpp's src/models/gemma3.cpp, the sliding-window build).

    x = token_embd[tokens] * sqrt(n_embd)
    per layer:  q, k, v = wq · norm(x), wk · norm(x), wv · norm(x)
                q = rope(q_norm(q)) * attn_scale;  k = rope(k_norm(k))      (per-head RMS norms)
                h = x + post_attn_norm(wo · attn(q, k, v))
                x = h + post_ffw_norm(down(gelu_tanh(gate · norm(h)) * (up · norm(h))))
    logits = token_embd · norm(x)       (tied unless output.weight exists)

RoPE is NEOX. Sliding-window ("local") layers see only the last `sliding_window` positions and use
RoPE base 10000 (scale 1); the others ("global") use `rope.freq_base` and the linear scaling
factor. Layer il is local when il % 6 < 5 unless the file gives `attention.sliding_window_pattern`.
The GGUF norm weights already hold Gemma's `1 + w`. attn_scale = 1/sqrt(key_length), or
1/sqrt(n_embd / n_head) for the 27B (62 layers), as llama.cpp.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .model import (Architecture, ForwardContext, HParams, _meta, read_hparams, register,
                    swa_pattern_layers, tensor)

SWA_PATTERN_DEFAULT = 6
ROPE_FREQ_BASE_SWA = 10000.0


@dataclass
class Gemma3Layer:
    attn_norm: np.ndarray
    wq: object
    wk: object
    wv: object
    wo: object
    q_norm: np.ndarray
    k_norm: np.ndarray
    post_attn_norm: np.ndarray
    ffn_norm: np.ndarray
    w_gate: object
    w_up: object
    w_down: object
    post_ffw_norm: np.ndarray


@dataclass
class Gemma3Weights:
    tok_embd: object
    output_norm: np.ndarray
    output: object
    layers: list


class Gemma3Architecture(Architecture):
    name = "gemma3"

    def hparams(self, gguf) -> HParams:
        md = gguf.metadata
        hp = read_hparams(gguf, "gemma3", rope_neox=True)
        hp.n_swa = int(_meta(md, "gemma3.attention.sliding_window", 0))
        pattern = _meta(md, "gemma3.attention.sliding_window_pattern", SWA_PATTERN_DEFAULT)
        if isinstance(pattern, (list, tuple, np.ndarray)):
            if len(pattern) != hp.n_layer:
                raise ValueError(f"sliding_window_pattern has {len(pattern)} entries for "
                                 f"{hp.n_layer} layers")
            hp.swa_layers = tuple(bool(b) for b in pattern)
        else:
            hp.swa_layers = swa_pattern_layers(hp.n_layer, int(pattern))
        hp.rope_freq_base_swa = ROPE_FREQ_BASE_SWA
        hp.rope_freq_scale_swa = 1.0
        if hp.n_layer == 62:  # Gemma 3 27B
            hp.attn_scale = 1.0 / math.sqrt(hp.n_embd / hp.n_head)
        else:
            hp.attn_scale = 1.0 / math.sqrt(hp.head_dim_k)
        if hp.n_swa <= 0:  # llama.cpp's non-SWA build caps the final logits
            hp.final_logit_softcap = float(_meta(md, "gemma3.final_logit_softcapping", 0.0) or 0.0)
        return hp

    def load_weights(self, gguf, hp: HParams, model) -> Gemma3Weights:
        layers = []
        for il in range(hp.n_layer):
            be = model.backend_for(il)
            p = f"blk.{il}."
            layers.append(Gemma3Layer(
                attn_norm=be.vector(tensor(gguf, p + "attn_norm.weight")),
                wq=be.weight(tensor(gguf, p + "attn_q.weight")),
                wk=be.weight(tensor(gguf, p + "attn_k.weight")),
                wv=be.weight(tensor(gguf, p + "attn_v.weight")),
                wo=be.weight(tensor(gguf, p + "attn_output.weight")),
                q_norm=be.vector(tensor(gguf, p + "attn_q_norm.weight")),
                k_norm=be.vector(tensor(gguf, p + "attn_k_norm.weight")),
                post_attn_norm=be.vector(tensor(gguf, p + "post_attention_norm.weight")),
                ffn_norm=be.vector(tensor(gguf, p + "ffn_norm.weight")),
                w_gate=be.weight(tensor(gguf, p + "ffn_gate.weight")),
                w_up=be.weight(tensor(gguf, p + "ffn_up.weight")),
                w_down=be.weight(tensor(gguf, p + "ffn_down.weight")),
                post_ffw_norm=be.vector(tensor(gguf, p + "post_ffw_norm.weight")),
            ))
        head = model.backend_for(hp.n_layer)
        out = tensor(gguf, "output.weight", optional=True)
        if out is None:  # tied embeddings
            out = tensor(gguf, "token_embd.weight")
        return Gemma3Weights(
            tok_embd=model.backend_for(-1).weight(tensor(gguf, "token_embd.weight")),
            output_norm=head.vector(tensor(gguf, "output_norm.weight")),
            output=head.weight(out),
            layers=layers,
        )

    def forward(self, ctx: ForwardContext, w: Gemma3Weights) -> np.ndarray:
        hp = ctx.hp
        n = ctx.n_tokens
        eps = hp.rms_eps
        be = ctx.backend(-1)
        x = be.scale(be.get_rows(w.tok_embd, ctx.tokens), math.sqrt(hp.n_embd))
        for il, L in enumerate(w.layers):
            be = ctx.backend(il)
            x = be.take(x)
            rope = hp.layer_rope(il)
            h = be.rms_norm(x, L.attn_norm, eps)
            q = be.matmul(L.wq, h).reshape(n, hp.n_head, hp.head_dim_k)
            k = be.matmul(L.wk, h).reshape(n, hp.n_head_kv, hp.head_dim_k)
            v = be.matmul(L.wv, h).reshape(n, hp.n_head_kv, hp.head_dim_v)
            q = be.rope(be.rms_norm(q, L.q_norm, eps), ctx.positions, rope)
            k = be.rope(be.rms_norm(k, L.k_norm, eps), ctx.positions, rope)
            q = be.scale(q, hp.attn_scale)
            a = ctx.attend(il, q, k, v, 1.0)
            if il == hp.n_layer - 1:  # only the rows that want logits go on
                if ctx.out_rows.size == 0:
                    return np.empty((0, hp.n_vocab), np.float32)
                a, x = a[ctx.out_rows], x[ctx.out_rows]
            a = be.rms_norm(be.matmul(L.wo, a), L.post_attn_norm, eps)
            x = be.add(x, a)
            h = be.rms_norm(x, L.ffn_norm, eps)
            ff = be.geglu(be.matmul(L.w_gate, h), be.matmul(L.w_up, h))
            ff = be.rms_norm(be.matmul(L.w_down, ff), L.post_ffw_norm, eps)
            x = be.add(x, ff)
        be = ctx.backend(hp.n_layer)
        x = be.rms_norm(be.take(x), w.output_norm, eps)
        logits = be.to_host(be.matmul(w.output, x))
        if hp.final_logit_softcap:
            c = np.float32(hp.final_logit_softcap)
            logits = np.tanh(logits / c) * c
        return logits


ARCH = register(Gemma3Architecture())
