"""`mistral3`: Mistral 3 / Ministral 3 text decoders (llama.cpp's src/models/mistral3.cpp).

    x = token_embd[tokens]
    per layer:  q, k = rope(wq · norm(x)), rope(wk · norm(x));  v = wv · norm(x)
                q = q * attn_temp(pos)                     (when attention.temperature_scale)
                h = x + wo · attn(q, k, v)                 (scale 1/sqrt(head_dim))
                x = h + down(silu(gate · norm(h)) * (up · norm(h)))      (or the MoE below)
    logits = output · norm(x)          (tied to token_embd when output.weight is absent)

Llama's block (RoPE NORM) with what Ministral 3's files add:
- YaRN with the file's rope.scaling.yarn_beta_fast / yarn_beta_slow / yarn_log_multiplier
  (llama.cpp's llama reads none of them; HParams.layer_rope honours them);
- Llama 4's attention temperature tuning: Q of the token at position p is multiplied by
  1 + attention.temperature_scale · ln(floor(p / n_ctx_orig) + 1), n_ctx_orig being
  rope.scaling.original_context_length (llama.cpp's n_attn_temp_floor_scale = n_ctx_orig_yarn,
  build_inp_attn_scale), so queries sharpen as the sequence grows past each original context;
- with expert_count, a mixture-of-experts FFN: softmax router, the expert_used_count best, their
  weights normalised, each expert a SwiGLU FFN of feed_forward_length (llama.cpp's mistral3
  sizes the experts by n_ff, not expert_feed_forward_length, and never uses the shared-expert
  tensors it loads, so neither does this file).
Optional biases: attn_q/k/v/output.bias (the shared block), ffn_gate/up/down.bias (dense FFN).
"""
import numpy as np

from ..hparams import ModelMetadataError
from .base import Transformer, _add_bias
from .moe import MoETransformer


class Mistral3(MoETransformer):
    name = "mistral3"
    norm_expert_weights = True
    # the temperature scale is computed on the host from each step's positions (and MoE routing
    # is chosen there): a captured decode graph would replay the first step's
    graph_capturable = False

    def read_hparams(self, meta, hp):
        """llama_model_mistral3::load_arch_hparams: YaRN's betas and log multiplier and the
        attention temperature, which llama.cpp's llama ignores; the experts' width."""
        if hp.n_expert:
            if hp.n_ff <= 0:
                raise ModelMetadataError(f"GGUF metadata lacks {meta.key('feed_forward_length')} "
                                         f"(the width of each of mistral3's experts)")
            hp.n_ff_exp = hp.n_ff
            super().read_hparams(meta, hp)
        else:
            Transformer.read_hparams(self, meta, hp)
        if not hp.n_rot == hp.head_dim_k == hp.head_dim_v:  # llama.cpp's graph asserts it
            raise ModelMetadataError(
                f"GGUF metadata {meta.key('rope.dimension_count')} = {hp.n_rot}, "
                f"{meta.key('attention.key_length')} = {hp.head_dim_k}, "
                f"{meta.key('attention.value_length')} = {hp.head_dim_v}: mistral3 needs them "
                f"equal (RoPE over whole heads)")
        hp.yarn_beta_fast = meta.float("rope.scaling.yarn_beta_fast", hp.yarn_beta_fast,
                                       lo=0.0, hi=1e6, lo_open=True)
        hp.yarn_beta_slow = meta.float("rope.scaling.yarn_beta_slow", hp.yarn_beta_slow,
                                       lo=0.0, hi=1e6, lo_open=True)
        hp.rope_yarn_log_mul = meta.float("rope.scaling.yarn_log_multiplier", 0.0, lo=0.0,
                                          hi=1e3)
        # llama.cpp's n_attn_temp_floor_scale: the original context, which the shared reader
        # has checked to be at least 1 (n_ctx_train when the file gives none)
        hp.extra["attn_temp_scale"] = meta.float("attention.temperature_scale", 0.0, lo=0.0,
                                                 hi=1e6)
        hp.extra["attn_temp_floor"] = hp.n_ctx_orig

    def load_ffn(self, t, hp):
        if hp.n_expert:
            return super().load_ffn(t, hp)
        e, f = hp.n_embd, hp.n_ff
        return dict(**Transformer.load_ffn(self, t, hp),
                    b_gate=t.vector("ffn_gate.bias", f, optional=True),
                    b_up=t.vector("ffn_up.bias", f, optional=True),
                    b_down=t.vector("ffn_down.bias", e, optional=True))

    def ffn(self, ctx, il, L, h):
        """build_ffn (LLM_FFN_SILU, LLM_FFN_PAR) with its optional biases, or the MoE."""
        if ctx.hp.n_expert:
            return super().ffn(ctx, il, L, h)
        be = ctx.backend(il)
        gate, up = be.matmul_many((L.w_gate, L.w_up), h)
        act = self.activate(be, _add_bias(be, gate, L.b_gate), _add_bias(be, up, L.b_up))
        return _add_bias(be, be.matmul(L.w_down, act), L.b_down)

    def attention(self, ctx, il, L, h):
        """Llama's attention with mistral3's Q temperature scaled after RoPE (ggml_mul of Qcur
        by inp_attn_scale, one factor per token)."""
        hp, be = ctx.hp, ctx.backend(il)
        q, k, v = self.project_qkv(ctx, il, L, h)
        rope = ctx.rope(il)
        q, k = be.rope(q, ctx.positions, rope), be.rope(k, ctx.positions, rope)
        if hp.extra["attn_temp_scale"]:
            n, n_head, d = q.shape
            scale = attn_temperature(ctx.positions, hp.extra["attn_temp_scale"],
                                     hp.extra["attn_temp_floor"])
            q = be.weighted_sum(q.reshape(n, 1, n_head * d), scale.reshape(n, 1))
            q = q.reshape(n, n_head, d)
        return ctx.attend(il, q, k, v, hp.kq_scale)


def attn_temperature(positions, temp_scale: float, floor_scale: int) -> np.ndarray:
    """llm_graph_input_attn_temp::set_input: per token log(floor(pos / floor_scale) + 1) ·
    temp_scale + 1, the floor in float32 and the rest in double, as llama.cpp computes it
    (offset 0 for mistral3), stored float32."""
    f32 = np.float32
    steps = np.floor(np.asarray(positions, f32) / f32(floor_scale)).astype(np.float64)
    return (np.log(steps + 1.0) * float(f32(temp_scale)) + 1.0).astype(f32)


ARCH = Mistral3()
