"""The mixture-of-experts feed-forward block, llama.cpp's `build_moe_ffn` (src/llama-graph.cpp)
with softmax gating, for the families whose layers route each token to a few experts (Qwen 2 MoE,
Qwen 3 MoE):

    probs   = softmax(ffn_gate_inp · h)                    n_expert router probabilities
    chosen  = the n_expert_used most probable experts       (ggml_argsort_top_k)
    w       = probs[chosen]       (/ their sum, at least 2^-14, when the family normalises them)
    out     = Σ_j w_j · down_j(silu(gate_j · h) * (up_j · h))        over the chosen experts j
    out    += sigmoid(ffn_gate_inp_shexp · h) · down_s(silu(gate_s · h) * (up_s · h))
                                                            (a shared expert: Qwen 2 MoE)

The experts' matrices are 3-D tensors (n_expert, n_out, n_in) multiplied by the backend's
`matmul_id`, which reads only the chosen experts' rows. The routing itself (a softmax over a few
dozen logits per token) is done on the host.
"""
from __future__ import annotations

import numpy as np

from ..hparams import HParams, Meta, ModelMetadataError
from .base import LayerTensors, Transformer

__all__ = ["MoETransformer", "route"]

# ggml_clamp of the weights' sum in build_moe_ffn: the smallest normal fp16, against dividing by 0
_MIN_WEIGHT_SUM = np.float32(6.103515625e-5)


def route(logits: np.ndarray, n_used: int, normalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """build_moe_ffn's softmax gating of router logits (n, n_expert): the chosen experts, int64
    (n, n_used), most probable first, and their float32 weights (n, n_used): their softmax
    probabilities, divided by their sum when `normalize` (expert_weights_norm)."""
    logits = np.asarray(logits, dtype=np.float32)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    chosen = np.argsort(-probs, axis=1, kind="stable")[:, :n_used]
    weights = np.take_along_axis(probs, chosen, axis=1)
    if normalize:
        weights = weights / np.maximum(weights.sum(axis=1, keepdims=True), _MIN_WEIGHT_SUM)
    return chosen.astype(np.int64), weights.astype(np.float32)


class MoETransformer(Transformer):
    """The shared decoder block with a mixture-of-experts FFN in every layer."""

    norm_expert_weights = False  # build_moe_ffn's norm_w: the chosen weights sum to 1
    shared_expert = False  # a gated FFN every token goes through, scaled by a sigmoid gate
    graph_capturable = False  # the experts are chosen on the host between the layer's kernels

    def read_hparams(self, meta: Meta, hp: HParams) -> None:
        super().read_hparams(meta, hp)
        for key, value in (("expert_count", hp.n_expert), ("expert_used_count", hp.n_expert_used)):
            if value <= 0:
                raise ModelMetadataError(f"GGUF metadata {meta.key(key)} = {value}: {self.name} "
                                         f"needs at least one expert")
        # llama.cpp's defaults: n_ff / n_expert_used per expert, n_ff for the shared one
        hp.n_ff_exp = hp.n_ff_exp or hp.n_ff // hp.n_expert_used
        if hp.n_ff_exp <= 0:
            raise ModelMetadataError(
                f"GGUF metadata lacks {meta.key('expert_feed_forward_length')}")
        if self.shared_expert:
            hp.n_ff_shexp = hp.n_ff_shexp or hp.n_ff
            if hp.n_ff_shexp <= 0:
                raise ModelMetadataError(
                    f"GGUF metadata lacks {meta.key('expert_shared_feed_forward_length')}")

    def load_ffn(self, t: LayerTensors, hp: HParams) -> dict:
        e, f, n = hp.n_embd, hp.n_ff_exp, hp.n_expert
        ffn = dict(router=t.matrix("ffn_gate_inp.weight", n, e),
                   gate_exps=t.experts("ffn_gate_exps.weight", n, f, e),
                   up_exps=t.experts("ffn_up_exps.weight", n, f, e),
                   down_exps=t.experts("ffn_down_exps.weight", n, e, f))
        if self.shared_expert:
            s = hp.n_ff_shexp
            ffn.update(shexp_gate=t.host_vector("ffn_gate_inp_shexp.weight", e),
                       gate_shexp=t.matrix("ffn_gate_shexp.weight", s, e),
                       up_shexp=t.matrix("ffn_up_shexp.weight", s, e),
                       down_shexp=t.matrix("ffn_down_shexp.weight", e, s))
        return ffn

    def ffn(self, ctx, il: int, L, h):
        be, hp = ctx.backend(il), ctx.hp
        chosen, weights = route(be.to_host(be.matmul(L.router, h)), hp.n_expert_used,
                                self.norm_expert_weights)
        n, k = chosen.shape
        gate, up = be.matmul_id(L.gate_exps, h, chosen), be.matmul_id(L.up_exps, h, chosen)
        act = self.activate(be, gate.reshape(n * k, -1), up.reshape(n * k, -1))
        out = be.weighted_sum(be.matmul_id(L.down_exps, act.reshape(n, k, -1), chosen), weights)
        if self.shared_expert:
            shared = self.gated_ffn(be, L.gate_shexp, L.up_shexp, L.down_shexp, h)
            logit = be.to_host(h) @ L.shexp_gate
            with np.errstate(over="ignore"):  # exp(-logit) = inf: a gate of 0
                gate = np.float32(1) / (np.float32(1) + np.exp(-logit))
            out = be.add(out, be.weighted_sum(shared.reshape(n, 1, -1), gate.reshape(n, 1)))
        return out
