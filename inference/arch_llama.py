"""`llama`: Llama 1/2/3, Mistral, TinyLlama, SmolLM2 (llama.cpp's src/models/llama.cpp).

    x = token_embd[tokens]
    per layer:  h = x + wo · attn(rope(wq · norm(x)), rope(wk · norm(x)), wv · norm(x))
                x = h + down(silu(gate · norm(h)) * (up · norm(h)))
    logits = output · norm(x)          (output tied to token_embd when output.weight is absent)

RoPE is the NORM variant (consecutive pairs, the converter permuted Q/K rows into that order);
attention scale 1/sqrt(head_dim). Linear RoPE scaling and Llama 3.1's rope_freqs are honoured;
optional Q/K/V/O biases are added when the file has them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .model import Architecture, ForwardContext, HParams, read_hparams, register, tensor


@dataclass
class LlamaLayer:
    attn_norm: np.ndarray
    wq: object
    wk: object
    wv: object
    wo: object
    ffn_norm: np.ndarray
    w_gate: object
    w_up: object
    w_down: object
    bq: np.ndarray | None = None
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None
    bo: np.ndarray | None = None


@dataclass
class LlamaWeights:
    tok_embd: object
    output_norm: np.ndarray
    output: object
    layers: list


class LlamaArchitecture(Architecture):
    name = "llama"

    def hparams(self, gguf) -> HParams:
        if "blk.0.ffn_gate_inp.weight" in gguf.tensors:
            raise ValueError("mixture-of-experts llama models (Mixtral) are not supported")
        return read_hparams(gguf, "llama", rope_neox=False)

    def load_weights(self, gguf, hp: HParams, model) -> LlamaWeights:
        layers = []
        for il in range(hp.n_layer):
            be = model.backend_for(il)
            p = f"blk.{il}."

            def opt_vec(name):
                t = tensor(gguf, p + name, optional=True)
                return None if t is None else be.vector(t)

            layers.append(LlamaLayer(
                attn_norm=be.vector(tensor(gguf, p + "attn_norm.weight")),
                wq=be.weight(tensor(gguf, p + "attn_q.weight")),
                wk=be.weight(tensor(gguf, p + "attn_k.weight")),
                wv=be.weight(tensor(gguf, p + "attn_v.weight")),
                wo=be.weight(tensor(gguf, p + "attn_output.weight")),
                ffn_norm=be.vector(tensor(gguf, p + "ffn_norm.weight")),
                w_gate=be.weight(tensor(gguf, p + "ffn_gate.weight")),
                w_up=be.weight(tensor(gguf, p + "ffn_up.weight")),
                w_down=be.weight(tensor(gguf, p + "ffn_down.weight")),
                bq=opt_vec("attn_q.bias"), bk=opt_vec("attn_k.bias"),
                bv=opt_vec("attn_v.bias"), bo=opt_vec("attn_output.bias"),
            ))
        head = model.backend_for(hp.n_layer)
        out = tensor(gguf, "output.weight", optional=True)
        if out is None:  # tied embeddings
            out = tensor(gguf, "token_embd.weight")
        return LlamaWeights(
            tok_embd=model.backend_for(-1).weight(tensor(gguf, "token_embd.weight")),
            output_norm=head.vector(tensor(gguf, "output_norm.weight")),
            output=head.weight(out),
            layers=layers,
        )

    def forward(self, ctx: ForwardContext, w: LlamaWeights) -> np.ndarray:
        hp = ctx.hp
        n = ctx.n_tokens
        x = ctx.backend(-1).get_rows(w.tok_embd, ctx.tokens)
        for il, L in enumerate(w.layers):
            be = ctx.backend(il)
            x = be.take(x)
            rope = hp.layer_rope(il)
            h = be.rms_norm(x, L.attn_norm, hp.rms_eps)
            q = _linear(be, L.wq, h, L.bq)
            k = _linear(be, L.wk, h, L.bk)
            v = _linear(be, L.wv, h, L.bv)
            q = be.rope(q.reshape(n, hp.n_head, hp.head_dim_k), ctx.positions, rope)
            k = be.rope(k.reshape(n, hp.n_head_kv, hp.head_dim_k), ctx.positions, rope)
            a = ctx.attend(il, q, k, v.reshape(n, hp.n_head_kv, hp.head_dim_v), hp.kq_scale)
            if il == hp.n_layer - 1:  # only the rows that want logits go on
                if ctx.out_rows.size == 0:
                    return np.empty((0, hp.n_vocab), np.float32)
                a, x = a[ctx.out_rows], x[ctx.out_rows]
            x = be.add(x, _linear(be, L.wo, a, L.bo))
            h = be.rms_norm(x, L.ffn_norm, hp.rms_eps)
            ff = be.swiglu(be.matmul(L.w_gate, h), be.matmul(L.w_up, h))
            x = be.add(x, be.matmul(L.w_down, ff))
        be = ctx.backend(hp.n_layer)
        x = be.rms_norm(be.take(x), w.output_norm, hp.rms_eps)
        return be.to_host(be.matmul(w.output, x))


def _linear(be, weight, x, bias):
    y = be.matmul(weight, x)
    return y if bias is None else be.add(y, bias)


ARCH = register(LlamaArchitecture())
