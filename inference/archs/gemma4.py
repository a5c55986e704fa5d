"""`gemma4`: Gemma 4 text models (llama.cpp's src/models/gemma4.cpp: E2B / E4B with per-layer
embeddings and shared KV, the dense 31B, the mixture-of-experts 26B-A4B).

    x  = token_embd[tokens] * sqrt(n_embd)
    pe = (rms_norm(per_layer_model_proj · x / sqrt(n_embd)) * per_layer_proj_norm      per layer
          + per_layer_token_embd[tokens] * sqrt(n_pe)) / sqrt(2)         (when n_pe = embedding_
                                                                          length_per_layer_input)
    per layer il:
        q = rope(q_norm(wq · norm(x)));  k = rope(k_norm(wk · norm(x)))
        v = rms_norm(wv · norm(x))   (no weight; wk's product when the layer has no attn_v; a
            shared-KV layer has no K/V and attends over the cache of an earlier layer's)
        h = x + post_attn_norm(wo · softmax(q·kᵀ + mask) v)                       (scale 1)
        f = post_ffw_norm(down(gelu(gate · norm(h)) * (up · norm(h))))
            MoE layers: post_ffw_norm(post_ffw_norm_1(that) + post_ffw_norm_2(experts(h)))
        x = h + f
        x = x + post_norm(proj(gelu(inp_gate · x) * pe[il]))                (per-layer embeddings)
        x = x * layer_output_scale                                          (when the file has it)
    logits = cap · tanh(output · norm(x) / cap)      (output: token_embd unless the file has one)

Which layers slide is the attention.sliding_window_pattern array. Sliding-window layers have
their own head size (key_length_swa), KV heads (head_count_kv per layer), rotated dims
(rope.dimension_count_swa) and RoPE base (rope.freq_base_swa, 10000 when absent, scale 1); the
global layers use key_length, rope.freq_base and rope_freqs.weight, whose 1e30 factors leave the
unrotated pairs of the "proportional" RoPE alone. The last attention.shared_kv_layers layers
keep no K/V: each reads the cache of the last sliding (or global) layer before them
(llama_model's layer_reuse_cb). feed_forward_length may differ per layer (the double-wide MLP
of shared-KV layers). The MoE router reads rms_norm(h) / sqrt(n_embd) * ffn_gate_inp.scale;
its softmax weights of the chosen experts are normalized, each expert's output is scaled by
ffn_down_exps.scale, and the experts' GeGLU reads pre_ffw_norm_2(h). The GGUF norm weights are
used as they are (the converter's norm_shift is 0 for Gemma 4).
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from ..hparams import MAX_HEAD_DIM, MAX_HEADS, ModelMetadataError
from ..rope import RopeSpec
from . import moe
from .base import Transformer, Weights


class _Ones:
    """A weight of n ones, shaped like a GGUF tensor for a backend's `vector`: ggml_rms_norm
    without a weight (V's norm) is the norm times exactly 1."""

    def __init__(self, n: int):
        self.name, self.shape, self.type = f"gemma4.ones[{n}]", (n,), "F32"
        self._n = n

    def dequantize(self) -> np.ndarray:
        return np.ones(self._n, np.float32)


class Gemma4(Transformer):
    name = "gemma4"
    ffn_activation = "gelu"
    rope_scalings = ("none", "linear")
    # MoE routing and the per-layer inputs are computed between kernels on the host
    graph_capturable = False

    # ------------------------------------------------------------------ hyperparameters

    def read_hparams(self, meta, hp):
        super().read_hparams(meta, hp)
        n_layer = hp.n_layer
        pattern = meta.key("attention.sliding_window_pattern")
        if not meta.has("attention.sliding_window_pattern") or not hasattr(meta.md[pattern],
                                                                           "__len__"):
            raise ModelMetadataError(f"GGUF metadata {pattern} must be an array of {n_layer} "
                                     f"bools (which layers use the sliding window)")
        n_swa = meta.int("attention.sliding_window", lo=1, hi=1 << 30)
        if not meta.has("attention.layer_norm_rms_epsilon"):
            raise ModelMetadataError(
                f"GGUF metadata lacks {meta.key('attention.layer_norm_rms_epsilon')}")
        hp.n_swa = n_swa
        x = hp.extra
        x["n_embd_per_layer"] = meta.int("embedding_length_per_layer_input", lo=0)
        self._read_heads(meta, hp)
        x["n_head_kv"] = meta.per_layer("attention.head_count_kv", n_layer, hp.n_head, lo=1,
                                        hi=MAX_HEADS)
        for il, n_kv in enumerate(x["n_head_kv"]):
            if hp.n_head % n_kv:
                raise ModelMetadataError(
                    f"{hp.n_head} attention heads cannot share {n_kv} KV heads on layer {il} "
                    f"({meta.key('attention.head_count_kv')})")
        x["n_ff"] = meta.per_layer("feed_forward_length", n_layer, lo=1)
        self._read_shared_kv(meta, hp)
        hp.attn_scale = 1.0  # Gemma 4 scales neither Q nor the scores (self.scaling = 1.0)
        hp.rope_freq_scale_swa = 1.0
        hp.final_logit_softcap = meta.float("final_logit_softcapping", 0.0, lo=0.0, hi=1e6)
        if hp.n_expert:
            if hp.n_expert_used <= 0 or hp.n_ff_exp <= 0:
                raise ModelMetadataError(
                    f"GGUF metadata {meta.key('expert_used_count')} and "
                    f"{meta.key('expert_feed_forward_length')} must be positive with "
                    f"{meta.key('expert_count')} = {hp.n_expert}")

    @staticmethod
    def _read_heads(meta, hp):
        """The sliding-window layers' head size and rotated dims beside the global layers'."""
        x = hp.extra
        if hp.head_dim_k != hp.head_dim_v:
            raise ModelMetadataError(f"{meta.key('attention.key_length')} = {hp.head_dim_k} "
                                     f"must equal {meta.key('attention.value_length')} = "
                                     f"{hp.head_dim_v} for Gemma 4")
        x["head_dim_swa"] = meta.int("attention.key_length_swa", lo=1, hi=MAX_HEAD_DIM)
        if meta.int("attention.value_length_swa", lo=1, hi=MAX_HEAD_DIM) != x["head_dim_swa"]:
            raise ModelMetadataError(f"{meta.key('attention.value_length_swa')} must equal "
                                     f"{meta.key('attention.key_length_swa')} for Gemma 4")
        x["n_rot_swa"] = meta.int("rope.dimension_count_swa", hp.n_rot, lo=2,
                                  hi=x["head_dim_swa"])
        if x["n_rot_swa"] % 2:
            raise ModelMetadataError(f"GGUF metadata {meta.key('rope.dimension_count_swa')} = "
                                     f"{x['n_rot_swa']}: expected an even number")

    @staticmethod
    def _read_shared_kv(meta, hp):
        """Layers from n_layer - shared_kv_layers on reuse the cache of the last layer of their
        kind before them: n_kv - 2 (sliding) or n_kv - 1 (global), as llama.cpp assumes; a file
        whose pattern puts another kind there is refused rather than read wrong."""
        key = meta.key("attention.shared_kv_layers")
        n_shared = meta.int("attention.shared_kv_layers", 0, lo=0, hi=hp.n_layer)
        n_kv = hp.n_layer - n_shared
        sources = list(range(hp.n_layer))
        if n_shared:
            if n_kv < 2:
                raise ModelMetadataError(f"GGUF metadata {key} = {n_shared}: at least 2 of the "
                                         f"{hp.n_layer} layers must keep their own K/V")
            for il in range(n_kv, hp.n_layer):
                src = n_kv - (2 if hp.swa_layers[il] else 1)
                if hp.swa_layers[src] != hp.swa_layers[il]:
                    raise ModelMetadataError(
                        f"GGUF metadata {key} = {n_shared}: layer {il} would reuse layer {src}'s "
                        f"K/V, which is of the other kind (sliding-window vs global)")
                sources[il] = src
        hp.extra["kv_source"] = tuple(sources)

    def head_dim(self, hp, il: int) -> int:
        return hp.extra["head_dim_swa"] if hp.is_swa(il) else hp.head_dim_k

    def kv_shape(self, hp, il):
        d = self.head_dim(hp, il)
        return hp.extra["n_head_kv"][il], d, d

    def kv_source(self, hp, il):
        return hp.extra["kv_source"][il]

    def has_kv(self, hp, il: int) -> bool:
        return hp.extra["kv_source"][il] == il

    def layer_rope(self, hp, il, n_ctx):
        """NEOX RoPE: sliding layers over rope.dimension_count_swa dims at the SWA base, global
        layers over rope.dimension_count with rope_freqs' factors (proportional RoPE)."""
        spec = hp.layer_rope(il, n_ctx)
        if hp.is_swa(il):
            return RopeSpec(hp.extra["n_rot_swa"], spec.freq_base, spec.freq_scale, True,
                            attn_factor=spec.attn_factor)
        factors = hp.rope_freq_factors
        return RopeSpec(hp.n_rot, spec.freq_base, spec.freq_scale, True,
                        None if factors is None else factors[:hp.n_rot // 2],
                        attn_factor=spec.attn_factor)

    def embedding_scale(self, hp):
        return math.sqrt(hp.n_embd)

    # ------------------------------------------------------------------ weights

    def load_rope_factors(self, loader, hp):
        # one rope_freqs for every global layer, required when there is one (load_arch_tensors)
        needed = not all(hp.is_swa(il) for il in range(hp.n_layer))
        hp.rope_freq_factors = loader.host_vector("rope_freqs.weight", hp.head_dim_k // 2,
                                                  optional=not needed)

    def load_weights(self, loader, hp):
        w = super().load_weights(loader, hp)
        n_pe = hp.extra["n_embd_per_layer"]
        if n_pe:
            width = n_pe * hp.n_layer
            w.extra.update(
                per_layer_tok_embd=loader.matrix("per_layer_token_embd.weight", hp.n_vocab,
                                                 width, -1),
                per_layer_model_proj=loader.matrix("per_layer_model_proj.weight", width,
                                                   hp.n_embd, -1),
                per_layer_proj_norm=loader.vector("per_layer_proj_norm.weight", n_pe, -1))
        return w

    def load_layer(self, t, hp):
        il, e = t.il, hp.n_embd
        d, n_kv = self.head_dim(hp, il), hp.extra["n_head_kv"][il]
        q_out, kv_out = hp.n_head * d, n_kv * d
        has_kv = self.has_kv(hp, il)
        wqkv = t.matrix("attn_qkv.weight", q_out + 2 * kv_out, e, optional=True)
        separate = wqkv is None
        L = SimpleNamespace(
            head_dim=d, n_head_kv=n_kv, has_kv=has_kv, wqkv=wqkv,
            attn_norm=t.vector("attn_norm.weight", e),
            wq=t.matrix("attn_q.weight", q_out, e) if separate else None,
            wk=t.matrix("attn_k.weight", kv_out, e) if separate and has_kv else None,
            # no attn_v: V is K (the models' attention_k_eq_v)
            wv=t.matrix("attn_v.weight", kv_out, e, optional=True)
            if separate and has_kv else None,
            wo=t.matrix("attn_output.weight", e, q_out),
            q_norm=t.vector("attn_q_norm.weight", d),
            k_norm=t.vector("attn_k_norm.weight", d) if has_kv else None,
            v_norm=t.loader.model.backend_for(il).vector(_Ones(d)) if has_kv else None,
            post_attn_norm=t.vector("post_attention_norm.weight", e),
            out_scale=t.host_vector("layer_output_scale.weight", 1, optional=True),
            ffn_norm=t.vector("ffn_norm.weight", e),
            post_ffw_norm=t.vector("post_ffw_norm.weight", e),
            **self._dense_ffn(t, hp.extra["n_ff"][il], e),
            moe=self._moe(t, hp) if hp.n_expert else None,
            pe=self._per_layer_embedding(t, hp),
        )
        return L

    @staticmethod
    def _dense_ffn(t, f: int, e: int) -> dict:
        return dict(w_gate=t.matrix("ffn_gate.weight", f, e), w_up=t.matrix("ffn_up.weight", f, e),
                    w_down=t.matrix("ffn_down.weight", e, f))

    @staticmethod
    def _moe(t, hp):
        """The expert branch of a layer whose file has a router (ffn_gate_inp); None without."""
        e, f, n = hp.n_embd, hp.n_ff_exp, hp.n_expert
        router = t.matrix("ffn_gate_inp.weight", n, e, optional=True)
        if router is None:
            return None
        # the router reads rms_norm(h) scaled by 1/sqrt(n_embd), then by ffn_gate_inp.scale:
        # both in one norm weight
        inp_scale = t.host_vector("ffn_gate_inp.scale", e) * np.float32(1.0 / math.sqrt(e))
        gate_up = t.experts("ffn_gate_up_exps.weight", n, 2 * f, e, optional=True)
        fused = gate_up is not None
        return SimpleNamespace(
            router=router,
            router_norm=t.loader.model.backend_for(t.il).vector(_HostVector(
                f"blk.{t.il}.ffn_gate_inp.scale/sqrt(n_embd)", inp_scale)),
            gate_up_exps=gate_up,
            gate_exps=None if fused else t.experts("ffn_gate_exps.weight", n, f, e),
            up_exps=None if fused else t.experts("ffn_up_exps.weight", n, f, e),
            down_exps=t.experts("ffn_down_exps.weight", n, e, f),
            down_scale=t.host_vector("ffn_down_exps.scale", n, optional=True),
            pre_norm_2=t.vector("pre_ffw_norm_2.weight", e),
            post_norm_1=t.vector("post_ffw_norm_1.weight", e),
            post_norm_2=t.vector("post_ffw_norm_2.weight", e))

    @staticmethod
    def _per_layer_embedding(t, hp):
        n_pe, e = hp.extra["n_embd_per_layer"], hp.n_embd
        if not n_pe:
            return None
        return SimpleNamespace(inp_gate=t.matrix("inp_gate.weight", n_pe, e),
                               proj=t.matrix("proj.weight", e, n_pe),
                               post_norm=t.vector("post_norm.weight", e))

    # ------------------------------------------------------------------ forward

    def per_layer_inputs(self, ctx, w: Weights, x):
        """gemma4.cpp's build_inp_per_layer + project_per_layer_inputs: (n, n_layer, n_pe) on
        the input's backend, None for a model without per-layer embeddings."""
        if "per_layer_tok_embd" not in w.extra:
            return None
        hp, be, n = ctx.hp, ctx.backend(-1), ctx.n_tokens
        n_pe, f32 = hp.extra["n_embd_per_layer"], np.float32
        proj = be.scale(be.matmul(w.extra["per_layer_model_proj"], x),
                        f32(1.0) / np.sqrt(f32(hp.n_embd)))
        proj = be.rms_norm(proj.reshape(n, hp.n_layer, n_pe), w.extra["per_layer_proj_norm"],
                           hp.rms_eps)
        tokens = be.scale(be.get_rows(w.extra["per_layer_tok_embd"], ctx.tokens),
                          np.sqrt(f32(n_pe)))
        return be.scale(be.add(proj, tokens.reshape(n, hp.n_layer, n_pe)),
                        f32(1.0) / np.sqrt(f32(2.0)))

    def block(self, ctx, il: int, L, x, pe=None):
        hp, be = ctx.hp, ctx.backend(il)
        a = self.attention(ctx, il, L, be.rms_norm(x, L.attn_norm, hp.rms_eps))
        rows = ctx.keep_rows(il)
        if rows is not None:  # the last layer: only the rows that want logits go on
            if rows.size == 0:
                return None
            a, x = a[rows], x[rows]
            pe = None if pe is None else pe[rows]
        a = be.rms_norm(be.matmul(L.wo, a), L.post_attn_norm, hp.rms_eps)
        h = be.add(a, x)
        f = self.ffn(ctx, il, L, h)
        x = be.add(be.rms_norm(f, L.post_ffw_norm, hp.rms_eps), h)
        if L.pe is not None:
            g = be.geglu(be.matmul(L.pe.inp_gate, x), be.take(pe))  # gelu(gate · x) * pe
            g = be.rms_norm(be.matmul(L.pe.proj, g), L.pe.post_norm, hp.rms_eps)
            x = be.add(x, g)
        if L.out_scale is not None:
            x = be.scale(x, float(L.out_scale[0]))
        return x

    def attention(self, ctx, il: int, L, h):
        hp, be, n = ctx.hp, ctx.backend(il), ctx.n_tokens
        d, rope = L.head_dim, ctx.rope(il)
        if L.wqkv is not None:
            qkv = be.matmul(L.wqkv, h)
            q_out, kv_out = hp.n_head * d, L.n_head_kv * d
            q = qkv[:, :q_out]
        else:
            q = be.matmul(L.wq, h)
        q = be.rope(be.rms_norm(q.reshape(n, hp.n_head, d), L.q_norm, hp.rms_eps),
                    ctx.positions, rope)
        if not L.has_kv:  # attends over the K/V the layer it reuses stored
            return ctx.attend(il, q, None, None, hp.kq_scale)
        if L.wqkv is not None:
            k, v = qkv[:, q_out:q_out + kv_out], qkv[:, q_out + kv_out:]
        else:
            k = be.matmul(L.wk, h)
            v = k if L.wv is None else be.matmul(L.wv, h)
        k = be.rope(be.rms_norm(k.reshape(n, L.n_head_kv, d), L.k_norm, hp.rms_eps),
                    ctx.positions, rope)
        v = be.rms_norm(v.reshape(n, L.n_head_kv, d), L.v_norm, hp.rms_eps)
        return ctx.attend(il, q, k, v, hp.kq_scale)

    def ffn(self, ctx, il: int, L, h):
        """The dense GeGLU; on an MoE layer its output post_ffw_norm_1-normed plus the
        experts' (gemma4.cpp's is_moe_layer branch)."""
        hp, be = ctx.hp, ctx.backend(il)
        mlp = self.gated_ffn(be, L.w_gate, L.w_up, L.w_down,
                             be.rms_norm(h, L.ffn_norm, hp.rms_eps))
        if L.moe is None:
            return mlp
        m = L.moe
        mlp = be.rms_norm(mlp, m.post_norm_1, hp.rms_eps)
        experts = self.experts(ctx, il, m, h)
        return be.add(mlp, be.rms_norm(experts, m.post_norm_2, hp.rms_eps))

    def experts(self, ctx, il: int, m, h):
        """build_moe_ffn with the router's logits given: softmax, top n_expert_used, weights
        normalized, GeGLU experts, each output times its ffn_down_exps.scale."""
        hp, be = ctx.hp, ctx.backend(il)
        logits = be.to_host(be.matmul(m.router, be.rms_norm(h, m.router_norm, hp.rms_eps)))
        chosen, weights = moe.route(logits, hp.n_expert_used, True, "softmax")
        if m.down_scale is not None:  # ggml_mul by the chosen experts' scales, then weights
            weights = weights * m.down_scale[chosen]
        n, k = chosen.shape
        x = be.rms_norm(h, m.pre_norm_2, hp.rms_eps)
        f = hp.n_ff_exp
        if m.gate_up_exps is not None:
            gate_up = be.matmul_id(m.gate_up_exps, x, chosen).reshape(n * k, 2 * f)
            gate, up = gate_up[:, :f], gate_up[:, f:]
        else:
            gate = be.matmul_id(m.gate_exps, x, chosen).reshape(n * k, f)
            up = be.matmul_id(m.up_exps, x, chosen).reshape(n * k, f)
        down = be.matmul_id(m.down_exps, be.geglu(gate, up).reshape(n, k, f), chosen)
        return be.weighted_sum(down.reshape(n, k, -1), weights.astype(np.float32))


class _HostVector:
    """A vector computed on the host, shaped like a GGUF tensor for a backend's `vector`."""

    def __init__(self, name: str, values: np.ndarray):
        self.name, self.shape, self.type = name, values.shape, "F32"
        self._values = np.ascontiguousarray(values, dtype=np.float32)

    def dequantize(self) -> np.ndarray:
        return self._values


ARCH = Gemma4()
