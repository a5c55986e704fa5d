"""`phi3`: Phi-3 / Phi-3.5 / Phi-4 mini (llama.cpp's src/models/phi3.cpp, dense build).

    x = token_embd[tokens]
    per layer:  q | k | v = attn_qkv · norm(x)                  (one fused matrix, or three)
                h = x + wo · attn(rope(q) / sqrt(head_dim), rope(k), v)
                g | u = ffn_up · norm(h)                        (gate and up fused: 2·n_ff rows)
                x = h + down(silu(g) * u)
    logits = output · norm(x)          (tied to token_embd when output.weight is absent)

RoPE is NEOX, possibly over only the first rope.dimension_count dims of a head (Phi-4 mini).
The 128k-context models carry LongRoPE: per-pair factors `rope_factors_short.weight` and
`rope_factors_long.weight`, the long ones used when the context is longer than
rope.scaling.original_context_length (llama_model::get_rope_factors), and a magnitude
rope.scaling.attn_factor on cos and sin; both are HParams' (the shared RoPE). llama.cpp turns the
sliding window of the Phi-3 files off (their converter wrote a window the models were not
meant to use), so every layer here attends over the whole context too.
"""
from ..hparams import ModelMetadataError
from .base import Transformer


class Phi3(Transformer):
    name = "phi3"
    scale_q_first = True  # ggml_scale(Qcur, 1/sqrt(head_dim)), then attention at scale 1
    longrope_factors_always = True

    def read_hparams(self, meta, hp):
        super().read_hparams(meta, hp)
        if hp.n_expert:
            raise ModelMetadataError("mixture-of-experts phi3 models are not supported")

    def load_ffn(self, t, hp):
        # build_ffn with LLM_FFN_SWIGLU: ggml_swiglu splits one product, gate rows first
        e, f = hp.n_embd, hp.n_ff
        return dict(w_gate_up=t.matrix("ffn_up.weight", 2 * f, e),
                    w_down=t.matrix("ffn_down.weight", e, f))

    def ffn(self, ctx, il, L, h):
        be, f = ctx.backend(il), ctx.hp.n_ff
        gate_up = be.matmul(L.w_gate_up, h)
        return be.matmul(L.w_down, be.swiglu(gate_up[:, :f], gate_up[:, f:]))


ARCH = Phi3()
