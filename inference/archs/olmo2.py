"""`olmo2`: OLMo 2, and OLMo 3 (same file layout, with sliding windows) (llama.cpp's
src/models/olmo2.cpp).

    x = token_embd[tokens]
    per layer:  q = q_norm(wq · x);  k = k_norm(wk · x);  v = wv · x      (no pre-norms)
                h = x + post_attn_norm(wo · attn(rope(q), rope(k), v))
                x = h + post_ffw_norm(down(silu(gate · h) * (up · h)))
    logits = output · norm(x)

The Q and K RMS norms run over the whole projection (all heads at once, weights of n_head·d and
n_head_kv·d values), before the split into heads; RoPE is NEOX. When the file sets
attention.sliding_window, layer il slides unless il % 4 == 3 (or as
attention.sliding_window_pattern says), and the sliding layers rotate with rope.freq_base and
no scaling at all (llama.cpp passes freq_scale 1, ext_factor 0, attn_factor 1 there: OLMo 3
applies YaRN to its global layers only).
"""
from ..rope import RopeSpec
from .base import Transformer


class Olmo2(Transformer):
    name = "olmo2"
    required = frozenset(("attn_q_norm.weight", "attn_k_norm.weight",
                          "post_attention_norm.weight", "post_ffw_norm.weight"))

    def load_head(self, loader, hp):
        return dict(output_norm=loader.vector("output_norm.weight", hp.n_embd, hp.n_layer),
                    output=loader.matrix("output.weight", hp.n_vocab, hp.n_embd, hp.n_layer))

    def layer_rope(self, hp, il, n_ctx):
        if not hp.is_swa(il):
            return hp.layer_rope(il, n_ctx)
        return RopeSpec(hp.n_rot, hp.rope_freq_base, 1.0, hp.rope_neox)


ARCH = Olmo2()
