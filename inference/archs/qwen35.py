"""`qwen35`: Qwen 3.5 / 3.6 dense models (llama.cpp's src/models/qwen35.cpp and
delta-net-base.cpp), hybrids whose layers are Gated DeltaNet (linear attention with a recurrent
state) but every `full_attention_interval`-th, which is gated full attention:

    per layer:  h = x + mixer(norm(x))
                x = h + down(silu(gate · norm'(h)) * (up · norm'(h)))     (norm': post_attention_norm)

    attention:  [q | gate] = wq · h per head; q = rope(q_norm(q)), k = rope(k_norm(wk · h))
                o = wo · (attn(q, k, v) * sigmoid(gate))
    DeltaNet:   qkv = conv1d(attn_qkv · h) with its conv state, silu; q, k l2-normalized
                β = sigmoid(ssm_beta · h),  g = softplus(ssm_alpha · h + ssm_dt) * ssm_a
                o = gated delta rule (q, k, v, g, β) with its state (cpu/delta_net.py)
                out = ssm_out · (rms_norm(o) * ssm_norm * silu(attn_gate · h))

RoPE is llama.cpp's interleaved M-RoPE (IMROPE) over the first rope.dimension_count dims; a
text token's position is (p, p, p, 0), so every pair turns by p as NEOX rotates it, except the
pairs IMROPE gives the fourth component, which turn by 0 (not at all: their frequency factor is
made infinite; the real models' sections [11, 11, 10, 0] have none). The recurrent states live in the model's HybridCache (inference/recurrent.py); the
layers after `block_count - nextn_predict_layers` (multi-token prediction heads) are not run.
The DeltaNet recurrence (convolution, delta rule: Backend.ssm_conv / gated_delta_net) runs on
the host backend, whatever backend runs the layer's matrix products.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from ..backend import move
from ..hparams import HParams, Meta, ModelMetadataError, RecurrentRows
from .base import LayerTensors, Transformer, WeightLoader

__all__ = ["ARCH", "Qwen35"]

_SOFTPLUS_LINEAR = np.float32(20.0)  # ggml's softplus: x itself above 20


class Qwen35(Transformer):
    name = "qwen35"
    graph_capturable = False  # the DeltaNet recurrence runs on the host

    # ------------------------------------------------------------------ hyperparameters

    def read_hparams(self, meta: Meta, hp: HParams) -> None:
        """llama_model_qwen35::load_arch_hparams: the DeltaNet sizes, which layers are
        recurrent, the M-RoPE sections."""
        nextn = meta.int("nextn_predict_layers", 0, lo=0, hi=hp.n_layer - 1)
        n_all = hp.n_layer
        hp.n_layer -= nextn  # the multi-token prediction blocks come last and are not run
        super().read_hparams(meta, hp)
        ssm = {k: meta.int(f"ssm.{k}", lo=1, hi=1 << 20) for k in
               ("conv_kernel", "inner_size", "state_size", "time_step_rank", "group_count")}
        if ssm["time_step_rank"] % ssm["group_count"]:
            raise ModelMetadataError(
                f"GGUF metadata {meta.key('ssm.time_step_rank')} = {ssm['time_step_rank']} is "
                f"not a multiple of {meta.key('ssm.group_count')} = {ssm['group_count']}")
        if ssm["inner_size"] != ssm["state_size"] * ssm["time_step_rank"]:
            raise ModelMetadataError(
                f"GGUF metadata {meta.key('ssm.inner_size')} = {ssm['inner_size']}: expected "
                f"{meta.key('ssm.state_size')} x {meta.key('ssm.time_step_rank')}")
        if meta.has("attention.recurrent_layers"):
            recurrent = meta.bools_per_layer("attention.recurrent_layers", n_all)[:hp.n_layer]
        else:
            interval = meta.int("full_attention_interval", 4, lo=1, hi=n_all)
            recurrent = tuple((il + 1) % interval != 0 for il in range(hp.n_layer))
        if hp.head_dim_k != hp.head_dim_v:
            raise ModelMetadataError(f"{meta.key('attention.key_length')} and "
                                     f"{meta.key('attention.value_length')} differ")
        sections = None
        if meta.has("rope.dimension_sections"):
            sections = meta.numbers("rope.dimension_sections", kind="int", min_len=4, lo=0,
                                    hi=hp.head_dim_k)[:4]
            if not sections[:3].any() or sections.sum() > hp.head_dim_k:
                raise meta.fail(meta.key("rope.dimension_sections"), sections.tolist(),
                                f"4 sections, one of the first three > 0, summing to at most "
                                f"{hp.head_dim_k}")
        hp.extra.update(ssm=ssm, recurrent=recurrent, rope_sections=sections)

    def recurrent_rows(self, hp: HParams) -> RecurrentRows:
        ssm = hp.extra["ssm"]
        s, n_k, n_v = ssm["state_size"], ssm["group_count"], ssm["time_step_rank"]
        return RecurrentRows(tuple(il for il, r in enumerate(hp.extra["recurrent"]) if r),
                             conv=(2 * n_k * s + n_v * s, ssm["conv_kernel"] - 1),
                             ssm=(n_v, s, s))

    def layer_rope(self, hp: HParams, il: int, n_ctx: int):
        return None if hp.extra["recurrent"][il] else hp.layer_rope(il, n_ctx)

    def load_rope_factors(self, loader: WeightLoader, hp: HParams) -> None:
        """No rope_freqs: the only factors are the infinite ones of the pairs IMROPE turns by
        a text token's fourth position component (0)."""
        sections = hp.extra["rope_sections"]
        if sections is None:
            return
        s0, s1, s2, s3 = (int(v) for v in sections)
        n_sect = s0 + s1 + s2 + s3
        still = [not (sector % 3 == 0 and sector < 3 * s0 or sector % 3 == 1 and sector < 3 * s1
                      or sector % 3 == 2 and sector < 3 * s2)
                 for sector in (i % n_sect for i in range(hp.n_rot // 2))]
        if any(still):  # ggml_mrope_cache_init's is_imrope choice of theta_e
            hp.rope_freq_factors = np.where(still, np.float32(np.inf), np.float32(1.0)
                                            ).astype(np.float32)

    # ------------------------------------------------------------------ weights

    def load_layer(self, t: LayerTensors, hp: HParams) -> SimpleNamespace:
        e = hp.n_embd
        common = dict(attn_norm=t.vector("attn_norm.weight", e),
                      post_attn_norm=t.vector("post_attention_norm.weight", e),
                      **self.load_ffn(t, hp))
        if not hp.extra["recurrent"][t.il]:
            d, n_q, n_kv = hp.head_dim_k, hp.n_head, hp.n_head_kv
            return SimpleNamespace(
                recurrent=False, **common,
                wq=t.matrix("attn_q.weight", 2 * n_q * d, e),
                wk=t.matrix("attn_k.weight", n_kv * d, e),
                wv=t.matrix("attn_v.weight", n_kv * d, e),
                wo=t.matrix("attn_output.weight", e, n_q * d),
                q_norm=t.vector("attn_q_norm.weight", d),
                k_norm=t.vector("attn_k_norm.weight", d))
        ssm = hp.extra["ssm"]
        s, n_k, n_v = ssm["state_size"], ssm["group_count"], ssm["time_step_rank"]
        conv_dim = 2 * n_k * s + n_v * s
        return SimpleNamespace(
            recurrent=True, **common,
            wqkv=t.matrix("attn_qkv.weight", conv_dim, e),
            wz=t.matrix("attn_gate.weight", n_v * s, e),
            w_beta=t.matrix("ssm_beta.weight", n_v, e),
            w_alpha=t.matrix("ssm_alpha.weight", n_v, e),
            conv=_host_matrix(t, "ssm_conv1d.weight", conv_dim, ssm["conv_kernel"]),
            dt_bias=t.host_vector("ssm_dt.bias", n_v),
            a=t.host_vector("ssm_a", n_v),
            ssm_norm=t.host_vector("ssm_norm.weight", s),
            w_out=t.matrix("ssm_out.weight", e, n_v * s))

    # ------------------------------------------------------------------ forward

    def block(self, ctx, il: int, L, x):
        """qwen35.cpp's layer: the mixer on attn_norm(x), the FFN on post_attention_norm."""
        hp, be = ctx.hp, ctx.backend(il)
        h = be.rms_norm(x, L.attn_norm, hp.rms_eps)
        a = self.delta_net(ctx, il, L, h) if L.recurrent else self.gated_attention(ctx, il, L, h)
        rows = ctx.keep_rows(il)
        if rows is not None:  # the last layer: only the rows that want logits go on
            if rows.size == 0:
                return None
            a, x = a[rows], x[rows]
        x = be.add(x, a)
        f = self.ffn(ctx, il, L, be.rms_norm(x, L.post_attn_norm, hp.rms_eps))
        return be.add(x, f)

    def gated_attention(self, ctx, il: int, L, h):
        """build_layer_attn: Q and its gate from one projection, per-head norms, RoPE,
        attention, the output times sigmoid(gate), then wo."""
        hp, be, n = ctx.hp, ctx.backend(il), ctx.n_tokens
        d = hp.head_dim_k
        qg, k, v = be.matmul_many((L.wq, L.wk, L.wv), h)
        qg = be.to_host(qg).reshape(n, hp.n_head, 2 * d)
        q = _to(ctx, be, np.ascontiguousarray(qg[:, :, :d]))
        gate = np.ascontiguousarray(qg[:, :, d:]).reshape(n, hp.n_head * d)
        q = be.rms_norm(q, L.q_norm, hp.rms_eps)
        k = be.rms_norm(k.reshape(n, hp.n_head_kv, d), L.k_norm, hp.rms_eps)
        rope = ctx.rope(il)
        q, k = be.rope(q, ctx.positions, rope), be.rope(k, ctx.positions, rope)
        o = be.to_host(ctx.attend(il, q, k, v.reshape(n, hp.n_head_kv, d), hp.kq_scale))
        return be.matmul(L.wo, _to(ctx, be, o * _sigmoid(gate)))

    def delta_net(self, ctx, il: int, L, h):
        """build_layer_attn_linear: the projections, then per sequence the convolution and
        the gated delta rule with that sequence's states, then the gated norm and ssm_out."""
        hp, be, n = ctx.hp, ctx.backend(il), ctx.n_tokens
        ssm = hp.extra["ssm"]
        s, n_k, n_v = ssm["state_size"], ssm["group_count"], ssm["time_step_rank"]
        qkv, z, beta, alpha = (be.to_host(y) for y in be.matmul_many(
            (L.wqkv, L.wz, L.w_beta, L.w_alpha), h))
        beta = _sigmoid(beta)
        g = _softplus(alpha + L.dt_bias) * L.a
        host = ctx.model.backend  # the host's: the recurrence runs there
        out = np.empty((n, n_v, s), np.float32)
        for seq, rows in _sequences(ctx):
            conv_state, state = _states(ctx, il, seq, L, n_v, s)
            x, conv_state[...] = host.ssm_conv(conv_state, qkv[rows], L.conv)
            x = _silu(x)
            key_dim = n_k * s
            q = _l2_norm(x[:, :key_dim].reshape(-1, n_k, s), hp.rms_eps)
            k = _l2_norm(x[:, key_dim:2 * key_dim].reshape(-1, n_k, s), hp.rms_eps)
            v = x[:, 2 * key_dim:].reshape(-1, n_v, s)
            out[rows] = host.gated_delta_net(q, k, v, g[rows], beta[rows], state)
        normed = be.to_host(be.rms_norm(_to(ctx, be, out), _to(ctx, be, L.ssm_norm),
                                        hp.rms_eps))
        gated = normed * _silu(z.reshape(n, n_v, s))
        return be.matmul(L.w_out, _to(ctx, be, gated.reshape(n, n_v * s)))


# ----------------------------------------------------------------------------- helpers


def _host_matrix(t: LayerTensors, name: str, n_out: int, n_in: int) -> np.ndarray:
    """A small 2-D tensor (the conv taps) as float32 (n_out, n_in) on the host."""
    full = f"blk.{t.il}.{name}"
    tensor = t.loader.gguf.tensors.get(full)
    if tensor is None:
        raise ModelMetadataError(f"the model lacks tensor {full!r}")
    if tuple(tensor.shape) != (n_out, n_in):
        raise ModelMetadataError(f"tensor {full!r} has shape {tuple(tensor.shape)}: expected "
                                 f"{(n_out, n_in)} from the hyperparameters")
    if tensor.type not in ("F32", "F16", "BF16"):
        raise ModelMetadataError(f"tensor {full!r} has type {tensor.type}: expected F32, F16 "
                                 f"or BF16")
    return np.ascontiguousarray(tensor.dequantize(), np.float32).reshape(n_out, n_in)


def _to(ctx, be, x):
    """A host array onto the layer's backend."""
    return move(np.ascontiguousarray(x, np.float32), ctx.model.backend, be)


def _sequences(ctx):
    """(sequence, its rows in batch order) of the micro-batch; an embedding batch's own
    sequence indices (no cache) when it has no seq_first."""
    seqs = getattr(ctx, "seq_first", None)
    if seqs is None:
        seqs = ctx._seq_index
    seqs = np.asarray(seqs)
    for seq in dict.fromkeys(seqs.tolist()):
        yield seq, np.flatnonzero(seqs == seq)


def _states(ctx, il: int, seq: int, L, n_v: int, s: int):
    """The conv and delta-rule states of `seq` in layer il: the cache's (updated in place), or
    fresh ones for a batch without a cache (embeddings)."""
    if ctx.kv is not None:
        return ctx.kv.state_at(il, seq)
    return (np.zeros((L.conv.shape[0], L.conv.shape[1] - 1), np.float32),
            np.zeros((n_v, s, s), np.float32))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return (np.float32(1) / (np.float32(1) + np.exp(-x))).astype(np.float32)


def _silu(x: np.ndarray) -> np.ndarray:
    return (x * _sigmoid(x)).astype(np.float32)


def _softplus(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.where(x > _SOFTPLUS_LINEAR, x, np.log(np.float32(1) + np.exp(x))
                        ).astype(np.float32)


def _l2_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """build_gdn_l2_norm: rms_norm with eps/n, times 1/sqrt(n): x / sqrt(Σx² + eps), the sum
    in float64 as ggml_rms_norm's."""
    n = x.shape[-1]
    mean = (x.astype(np.float64) ** 2).sum(axis=-1, keepdims=True) / n
    scale = np.float32(1) / np.sqrt((mean + np.float32(eps) / np.float32(n)).astype(np.float32))
    return (x * scale * np.float32(1 / np.sqrt(np.float32(n)))).astype(np.float32)


ARCH = Qwen35()
