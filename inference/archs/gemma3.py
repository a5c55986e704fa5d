"""`gemma3`: Gemma 3 text models (llama.cpp's src/models/gemma3.cpp, the sliding-window build).

    x = token_embd[tokens] * sqrt(n_embd)
    per layer:  q, k, v = wq · norm(x), wk · norm(x), wv · norm(x)
                q = rope(q_norm(q)) * attn_scale;  k = rope(k_norm(k))      (per-head RMS norms)
                h = x + post_attn_norm(wo · attn(q, k, v))
                x = h + post_ffw_norm(down(gelu_tanh(gate · norm(h)) * (up · norm(h))))
    logits = token_embd · norm(x)       (tied unless output.weight exists)

RoPE is NEOX. Sliding-window ("local") layers see only the last `sliding_window` positions and use
RoPE base 10000 (scale 1); the others ("global") use `rope.freq_base` and the linear scaling
factor. Layer il is local when il % 6 < 5 unless the file gives `attention.sliding_window_pattern`
(the catalog's defaults). The GGUF norm weights already hold Gemma's `1 + w`. attn_scale =
1/sqrt(key_length), or 1/sqrt(n_embd / n_head) for the 27B (62 layers), as llama.cpp.
"""
import math

from .base import Transformer


class Gemma3(Transformer):
    name = "gemma3"
    ffn_activation = "gelu"
    scale_q_first = True
    required = Transformer.required | {"attn_q_norm.weight", "attn_k_norm.weight",
                                       "post_attention_norm.weight", "post_ffw_norm.weight"}

    def read_hparams(self, meta, hp):
        super().read_hparams(meta, hp)
        hp.rope_freq_scale_swa = 1.0
        if hp.n_layer == 62:  # Gemma 3 27B
            hp.attn_scale = 1.0 / math.sqrt(hp.n_embd / hp.n_head)
        else:
            hp.attn_scale = 1.0 / math.sqrt(hp.head_dim_k)
        hp.final_logit_softcap = meta.float("final_logit_softcapping", 0.0, lo=0.0, hi=1e6)
        if hp.n_swa > 0:  # llama.cpp's sliding-window build does not cap the final logits
            hp.final_logit_softcap = 0.0

    def embedding_scale(self, hp):
        return math.sqrt(hp.n_embd)


ARCH = Gemma3()
