"""The mixture-of-experts feed-forward block, llama.cpp's `build_moe_ffn` (src/llama-graph.cpp)
with softmax gating, for the families whose layers route each token to a few experts (Qwen 2 MoE,
Qwen 3 MoE, gpt-oss):

    logits  = ffn_gate_inp · h (+ ffn_gate_inp.bias)        n_expert router logits
    probs   = softmax(logits)                               n_expert router probabilities
    chosen  = the n_expert_used most probable experts       (ggml_argsort_top_k)
    w       = probs[chosen]       (/ their sum, at least 2^-14, when the family normalises them)
              or, with SOFTMAX_WEIGHT gating (gpt-oss), softmax(logits[chosen])
    out     = Σ_j w_j · down_j(act(gate_j · h) * (up_j · h))         over the chosen experts j
              (each product plus its expert's bias row when the file has them: gpt-oss)
    out    += sigmoid(ffn_gate_inp_shexp · h) · down_s(silu(gate_s · h) * (up_s · h))
                                                            (a shared expert: Qwen 2 MoE)

The experts' matrices are 3-D tensors (n_expert, n_out, n_in) multiplied by the backend's
`matmul_id`, which reads only the chosen experts' rows; their bias rows (ggml_add_id) are the
chosen rows of a 2-D (n_expert, n_out) tensor, taken with `get_rows`. The routing itself (a
softmax over a few dozen logits per token) is done on the host.
"""
from __future__ import annotations

import numpy as np

from ..hparams import HParams, Meta, ModelMetadataError
from .base import LayerTensors, Transformer

__all__ = ["MoETransformer", "route"]

# ggml_clamp of the weights' sum in build_moe_ffn: the smallest normal fp16, against dividing by 0
_MIN_WEIGHT_SUM = np.float32(6.103515625e-5)


GATINGS = ("softmax", "softmax_weight")  # llama_expert_gating_func_type's, of those we run


def route(logits: np.ndarray, n_used: int, normalize: bool,
          gating: str = "softmax") -> tuple[np.ndarray, np.ndarray]:
    """build_moe_ffn's gating of router logits (n, n_expert): the chosen experts, int64
    (n, n_used), most probable first, and their float32 weights (n, n_used). "softmax": their
    probabilities of the softmax over all experts; "softmax_weight" (LLAMA_EXPERT_GATING_FUNC_
    TYPE_SOFTMAX_WEIGHT): the top logits chosen first, their weights the softmax over those
    n_used alone. Either divided by their sum when `normalize` (expert_weights_norm)."""
    logits = np.asarray(logits, dtype=np.float32)
    if gating == "softmax":
        probs = _softmax(logits)
    elif gating == "softmax_weight":  # the ranking is the logits' own: no softmax before it
        probs = logits
    else:
        raise ValueError(f"route: gating {gating!r} is not one of {', '.join(GATINGS)}")
    chosen = np.argsort(-probs, axis=1, kind="stable")[:, :n_used]
    weights = np.take_along_axis(probs, chosen, axis=1)
    if gating == "softmax_weight":
        weights = _softmax(weights)
    if normalize:
        weights = weights / np.maximum(weights.sum(axis=1, keepdims=True), _MIN_WEIGHT_SUM)
    return chosen.astype(np.int64), weights.astype(np.float32)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


class MoETransformer(Transformer):
    """The shared decoder block with a mixture-of-experts FFN in every layer."""

    norm_expert_weights = False  # build_moe_ffn's norm_w: the chosen weights sum to 1
    shared_expert = False  # a gated FFN every token goes through, scaled by a sigmoid gate
    gating = "softmax"  # build_moe_ffn's gating_op (GATINGS)
    # a bias on the router's logits and on each expert's products (ffn_*.bias; gpt-oss)
    expert_biases = False
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
                   down_exps=t.experts("ffn_down_exps.weight", n, e, f),
                   router_b=None, gate_exps_b=None, up_exps_b=None, down_exps_b=None)
        if self.expert_biases:  # one row per expert: ggml_add_id adds the chosen experts' rows
            ffn.update(router_b=t.host_vector("ffn_gate_inp.bias", n),
                       gate_exps_b=t.matrix("ffn_gate_exps.bias", n, f),
                       up_exps_b=t.matrix("ffn_up_exps.bias", n, f),
                       down_exps_b=t.matrix("ffn_down_exps.bias", n, e))
        if self.shared_expert:
            s = hp.n_ff_shexp
            ffn.update(shexp_gate=t.host_vector("ffn_gate_inp_shexp.weight", e),
                       gate_shexp=t.matrix("ffn_gate_shexp.weight", s, e),
                       up_shexp=t.matrix("ffn_up_shexp.weight", s, e),
                       down_shexp=t.matrix("ffn_down_shexp.weight", e, s))
        return ffn

    def ffn(self, ctx, il: int, L, h):
        be, hp = ctx.backend(il), ctx.hp
        logits = be.to_host(be.matmul(L.router, h))
        if L.router_b is not None:
            logits = logits + L.router_b
        chosen, weights = route(logits, hp.n_expert_used, self.norm_expert_weights, self.gating)
        n, k = chosen.shape
        gate = _expert_bias(be, be.matmul_id(L.gate_exps, h, chosen), L.gate_exps_b, chosen)
        up = _expert_bias(be, be.matmul_id(L.up_exps, h, chosen), L.up_exps_b, chosen)
        act = self.activate(be, gate, up)
        down = _expert_bias(be, be.matmul_id(L.down_exps, act.reshape(n, k, -1), chosen),
                            L.down_exps_b, chosen)
        out = be.weighted_sum(down.reshape(n, k, -1), weights)
        if self.shared_expert:
            shared = self.gated_ffn(be, L.gate_shexp, L.up_shexp, L.down_shexp, h)
            logit = be.to_host(h) @ L.shexp_gate
            with np.errstate(over="ignore"):  # exp(-logit) = inf: a gate of 0
                gate = np.float32(1) / (np.float32(1) + np.exp(-logit))
            out = be.add(out, be.weighted_sum(shared.reshape(n, 1, -1), gate.reshape(n, 1)))
        return out


def _expert_bias(be, y, bias, chosen: np.ndarray):
    """y (n, k, d), the chosen experts' products, as (n * k, d) rows, each plus its expert's
    row of `bias` (n_expert, d) when there is one (ggml_add_id)."""
    n, k = chosen.shape
    y = y.reshape(n * k, -1)
    return y if bias is None else be.add(y, be.get_rows(bias, chosen.reshape(-1)))
