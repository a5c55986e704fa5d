"""`gpt-oss`: OpenAI's gpt-oss-20b and gpt-oss-120b (llama.cpp's LLM_ARCH_OPENAI_MOE,
src/models/openai-moe.cpp).

    x = token_embd[tokens]
    per layer:  q, k, v = wq · norm(x) + bq, wk · norm(x) + bk, wv · norm(x) + bv
                s = rope(q) · rope(k) / sqrt(n_rot) + mask                     (per head)
                a = Σ_j exp(s_j) v_j / (Σ_j exp(s_j) + exp(sink_h))  (each head's attention sink)
                h = x + wo · a + bo
                x = h + moe(post_attention_norm(h))
    logits = output · norm(x)

moe (archs/moe.py): the router's logits plus its bias, the top expert_used_count experts by
logit, their weights the softmax over those alone (SOFTMAX_WEIGHT gating); each expert's gate,
up and down products plus that expert's bias row, and the clamped SwiGLU between them
(ggml_swiglu_oai, alpha 1.702, limit 7). Layers alternate sliding-window (even: the window
attention.sliding_window, RoPE base rope.freq_base_swa when the file has it) and full attention
(odd) unless attention.sliding_window_pattern says otherwise; both take YaRN (rope.scaling.*)
and the same frequency scale. RoPE NEOX. llama.cpp calls the FFN's pre-norm attn_post_norm
(post_attention_norm.weight): it is this block's ffn_norm.
"""
import math

from ..hparams import ModelMetadataError
from .moe import MoETransformer

# build_moe_ffn's LLM_FFN_SWIGLU_OAI_MOE constants
SWIGLU_ALPHA = 1.702
SWIGLU_LIMIT = 7.0


class GptOss(MoETransformer):
    name = "gpt-oss"
    gating = "softmax_weight"
    expert_biases = True
    required = frozenset(("attn_norm.weight", "post_attention_norm.weight", "attn_sinks.weight",
                          "attn_output.bias"))

    def read_hparams(self, meta, hp):
        for key in ("attention.sliding_window", "expert_feed_forward_length"):
            if not meta.has(key):  # llama.cpp's load_arch_hparams requires both
                raise ModelMetadataError(f"GGUF metadata lacks {meta.key(key)}")
        super().read_hparams(meta, hp)
        hp.rope_freq_scale_swa = hp.rope_freq_scale
        hp.attn_scale = 1.0 / math.sqrt(hp.n_rot)

    def load_layer(self, t, hp):
        layer = super().load_layer(t, hp)
        # the norm before the FFN, named as a post-attention norm: nothing normalizes the
        # attention's output itself
        layer.ffn_norm, layer.post_attn_norm = layer.post_attn_norm, None
        return layer

    def activate(self, be, gate, up):
        return be.swiglu_oai(gate, up, SWIGLU_ALPHA, SWIGLU_LIMIT)


ARCH = GptOss()
