"""`gemma2`: Gemma 2 (llama.cpp's src/models/gemma2.cpp).

    x = token_embd[tokens] * sqrt(n_embd)
    per layer:  q, k, v = wq · norm(x), wk · norm(x), wv · norm(x)
                s = cap_a · tanh((rope(q) * attn_scale) · rope(k) / cap_a)   (attention soft-cap)
                h = x + post_attn_norm(wo · softmax(s + mask) v)
                x = h + post_ffw_norm(down(gelu_tanh(gate · norm(h)) * (up · norm(h))))
    logits = cap_f · tanh(token_embd · norm(x) / cap_f)                      (final soft-cap)

RoPE is NEOX. Layers alternate sliding-window (even, window attention.sliding_window, 4096 when
absent) and global (odd) attention unless the file gives attention.sliding_window_pattern; both
use rope.freq_base and the linear scale (rope.freq_base_swa when the file has it). The caps are
attn_logit_softcapping (50 when absent) and final_logit_softcapping (30). Q is scaled by
1/sqrt(key_length), or by 1/sqrt(n_embd / n_head) for the 27B (46 layers): llama.cpp's choice by
model size, which is what the models' query_pre_attn_scalar says. The output is always the tied
token_embd. The GGUF norm weights already hold Gemma's `1 + w`.
"""
import math

from .base import Transformer


class Gemma2(Transformer):
    name = "gemma2"
    ffn_activation = "gelu"
    scale_q_first = True
    required = Transformer.required | {"post_attention_norm.weight", "post_ffw_norm.weight"}

    def read_hparams(self, meta, hp):
        super().read_hparams(meta, hp)
        hp.rope_freq_scale_swa = hp.rope_freq_scale
        hp.attn_logit_softcap = meta.float("attn_logit_softcapping", 50.0, lo=0.0, hi=1e6,
                                           lo_open=True)
        hp.final_logit_softcap = meta.float("final_logit_softcapping", 30.0, lo=0.0, hi=1e6,
                                            lo_open=True)
        if hp.n_layer == 46:  # Gemma 2 27B
            hp.attn_scale = 1.0 / math.sqrt(hp.n_embd // hp.n_head)
        else:
            hp.attn_scale = 1.0 / math.sqrt(hp.head_dim_k)

    def embedding_scale(self, hp):
        return math.sqrt(hp.n_embd)

    def load_head(self, loader, hp):
        return dict(output_norm=loader.vector("output_norm.weight", hp.n_embd, hp.n_layer),
                    output=loader.matrix("token_embd.weight", hp.n_vocab, hp.n_embd, hp.n_layer))


ARCH = Gemma2()
