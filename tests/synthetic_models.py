"""Small synthetic GGUF models of every family, for checking each architecture against llama.cpp
without real weights.

Each recipe writes a model with the family's real tensor names and metadata, a few layers and
seeded random weights scaled so that activations stay lively (matrices ~ N(0, 1/n_in), norms near
1, embeddings ~ N(0, 1), logits ~ N(0, 1): llama.cpp rounds activations to 8 bits before every
quantized product, and larger logits magnify that rounding in the log-probabilities — 0.025 nats
on average at twice the scale — which would measure llama.cpp's rounding, not our forward pass),
in one of several weight types: F16, Q8_0, Q4_K, Q6_K (every matrix of
that type, norms and biases F32). The files are not committed: the same seed writes the same bytes
(the sha256 is recorded with the reference), and `record_synthetic_logits.py` recorded llama.cpp's
log-probabilities at every position of `TOKENS` for each into tests/golden/synthetic_logits.json.

    path = write_model("llama", "Q4_K", tmp_dir)      # a GGUF file, deterministic

Adding a family: a function `recipe_<name>(rng) -> Recipe` registered in RECIPES (below), then
`python tests/record_synthetic_logits.py <name>` with llama-cpp-python installed. A variant of a
family (other metadata or tensors that take another path, another context size) goes in
VARIANTS as a `Case`; CASES holds both, and is what the recorder and tests/test_archs.py run.
"""
from __future__ import annotations

import hashlib
import pathlib
from dataclasses import dataclass, field

import numpy as np

from llamatui.inference.gguf import GGUFValueType, GGUFWriter, ValueType

N_VOCAB = 512
TYPES = ("F16", "Q8_0", "Q4_K", "Q6_K")
# the token sequence every model is evaluated on: 80 positions, all logits compared
TOKENS = [int(t) for t in np.random.default_rng(1234).integers(3, N_VOCAB, 80)]


@dataclass
class Recipe:
    """A synthetic model: `general.architecture`, its metadata (beyond the tokenizer's), and its
    tensors as float32 arrays in numpy order ((n_out, n_in) for matrices)."""
    arch: str
    metadata: dict
    tensors: dict[str, np.ndarray]
    # tensors kept F32 whatever the type (norms, biases, and what a family wants exact)
    keep_f32: set = field(default_factory=set)
    # ggml types of some tensors whatever the case's type (gpt-oss's MXFP4 experts)
    tensor_types: dict = field(default_factory=dict)
    # the tokenizer's metadata [(key, value, type)] when not the default GPT-2-style vocabulary
    tokenizer: list | None = None
    # general.name's subject when the case name will not do: llama.cpp's vocabulary loader
    # looks up <unk> and <|endoftext|> for models named "phi3", which the tiny vocabulary lacks
    label: str | None = None


def matrix(rng, n_out: int, n_in: int, gain: float = 1.0) -> np.ndarray:
    return (rng.standard_normal((n_out, n_in)) * gain / np.sqrt(n_in)).astype(np.float32)


def norm(rng, n: int) -> np.ndarray:
    return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)


def bias(rng, n: int) -> np.ndarray:
    return (0.1 * rng.standard_normal(n)).astype(np.float32)


def embeddings(rng, n_vocab: int, n_embd: int) -> np.ndarray:
    return rng.standard_normal((n_vocab, n_embd)).astype(np.float32)


def decoder_metadata(arch: str, *, n_layer: int, n_embd: int, n_ff: int, n_head: int,
                     n_head_kv: int, head_dim: int | None = None, ctx: int = 4096,
                     rope_base: float = 10000.0, eps: float = 1e-6, **extra) -> dict:
    """The `{arch}.*` keys every decoder has, plus `extra` ({key without prefix: value})."""
    md = {
        "context_length": ctx, "embedding_length": n_embd, "block_count": n_layer,
        "feed_forward_length": n_ff, "attention.head_count": n_head,
        "attention.head_count_kv": n_head_kv, "rope.freq_base": float(rope_base),
        "attention.layer_norm_rms_epsilon": float(eps),
    }
    if head_dim is not None:
        md["attention.key_length"] = md["attention.value_length"] = head_dim
    md.update(extra)
    return {f"{arch}.{k}": v for k, v in md.items()}


def llama_layers(rng, n_layer: int, n_embd: int, n_ff: int, n_head: int, n_head_kv: int,
                 head_dim: int, qkv_bias: bool = False) -> dict[str, np.ndarray]:
    """The tensors of llama-shaped layers (attention + gated FFN, pre-norms)."""
    t = {}
    for il in range(n_layer):
        p = f"blk.{il}."
        t[p + "attn_norm.weight"] = norm(rng, n_embd)
        t[p + "attn_q.weight"] = matrix(rng, n_head * head_dim, n_embd)
        t[p + "attn_k.weight"] = matrix(rng, n_head_kv * head_dim, n_embd)
        t[p + "attn_v.weight"] = matrix(rng, n_head_kv * head_dim, n_embd)
        t[p + "attn_output.weight"] = matrix(rng, n_embd, n_head * head_dim)
        if qkv_bias:
            t[p + "attn_q.bias"] = bias(rng, n_head * head_dim)
            t[p + "attn_k.bias"] = bias(rng, n_head_kv * head_dim)
            t[p + "attn_v.bias"] = bias(rng, n_head_kv * head_dim)
        t[p + "ffn_norm.weight"] = norm(rng, n_embd)
        t[p + "ffn_gate.weight"] = matrix(rng, n_ff, n_embd)
        t[p + "ffn_up.weight"] = matrix(rng, n_ff, n_embd)
        t[p + "ffn_down.weight"] = matrix(rng, n_embd, n_ff)
    return t


def expert_matrices(rng, n_expert: int, n_out: int, n_in: int) -> np.ndarray:
    """n_expert matrices ~ N(0, 1/n_in) in one 3-D tensor (n_expert, n_out, n_in)."""
    return (rng.standard_normal((n_expert, n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)


def moe_ffn(rng, n_layer: int, n_embd: int, n_expert: int, n_ff_exp: int,
            n_ff_shexp: int = 0, router_gain: float = 5.0) -> dict[str, np.ndarray]:
    """The mixture-of-experts FFN tensors of each layer (replacing ffn_gate/up/down): a router
    whose logits (~ N(0, router_gain²)) send tokens to clearly different experts, the experts,
    and a shared expert with its gate when n_ff_shexp. (At a gain of 5, 65 to 74 of the 80
    positions of the Qwen MoE recipes have on no layer the last expert chosen and the next under
    0.1 apart, against 56 to 64 at a gain of 3: tests/test_archs.py compares those.)"""
    t = {}
    for il in range(n_layer):
        p = f"blk.{il}."
        t[p + "ffn_gate_inp.weight"] = matrix(rng, n_expert, n_embd, router_gain)
        t[p + "ffn_gate_exps.weight"] = expert_matrices(rng, n_expert, n_ff_exp, n_embd)
        t[p + "ffn_up_exps.weight"] = expert_matrices(rng, n_expert, n_ff_exp, n_embd)
        t[p + "ffn_down_exps.weight"] = expert_matrices(rng, n_expert, n_embd, n_ff_exp)
        if n_ff_shexp:
            t[p + "ffn_gate_inp_shexp.weight"] = (rng.standard_normal(n_embd) / np.sqrt(n_embd)
                                                  ).astype(np.float32)
            t[p + "ffn_gate_shexp.weight"] = matrix(rng, n_ff_shexp, n_embd)
            t[p + "ffn_up_shexp.weight"] = matrix(rng, n_ff_shexp, n_embd)
            t[p + "ffn_down_shexp.weight"] = matrix(rng, n_embd, n_ff_shexp)
    return t


def without_dense_ffn(t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v for k, v in t.items()
            if not k.endswith(("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"))}


def qk_norms(rng, n_layer: int, head_dim: int) -> dict[str, np.ndarray]:
    """Per-head Q and K RMS norm weights of each layer (Qwen 3, Gemma 3)."""
    return {f"blk.{il}.attn_{x}_norm.weight": norm(rng, head_dim)
            for il in range(n_layer) for x in "qk"}


# ----------------------------------------------------------------------------- recipes


def recipe_llama(rng) -> Recipe:
    shape = dict(n_layer=3, n_embd=256, n_ff=512, n_head=4, n_head_kv=2)
    t = {"token_embd.weight": embeddings(rng, N_VOCAB, 256),
         **llama_layers(rng, head_dim=64, **shape),
         "output_norm.weight": norm(rng, 256),
         "output.weight": matrix(rng, N_VOCAB, 256)}
    md = decoder_metadata("llama", rope_base=500000.0, eps=1e-5, **shape,
                          **{"rope.dimension_count": 64})
    return Recipe("llama", md, t)


def recipe_gemma3(rng) -> Recipe:
    shape = dict(n_layer=4, n_embd=256, n_ff=512, n_head=4, n_head_kv=1)
    t = {"token_embd.weight": embeddings(rng, N_VOCAB, 256) / 16}
    t.update(llama_layers(rng, head_dim=128, **shape))
    for il in range(shape["n_layer"]):
        p = f"blk.{il}."
        t[p + "attn_q_norm.weight"] = norm(rng, 128)
        t[p + "attn_k_norm.weight"] = norm(rng, 128)
        t[p + "post_attention_norm.weight"] = norm(rng, 256)
        t[p + "post_ffw_norm.weight"] = norm(rng, 256)
    t["output_norm.weight"] = norm(rng, 256)
    md = decoder_metadata("gemma3", head_dim=128, rope_base=1e6, **shape,
                          **{"attention.sliding_window": 8,
                             "attention.sliding_window_pattern": 2})
    return Recipe("gemma3", md, t)


def gemma4_layers(rng, e: int, n_head: int, swa: list, n_head_kv: list, n_ff: list,
                  head_dim: tuple[int, int], n_kv: int, no_v: set) -> dict[str, np.ndarray]:
    """Gemma 4's layers: per-head Q/K norms, post-norms; sliding layers' heads head_dim[0]
    wide, global ones' head_dim[1]; layers from n_kv on without K/V (they reuse the cache of an
    earlier layer), those in `no_v` without attn_v (V is K). Gemma 4 scales no score by
    1/sqrt(head_dim) (its trained Q norm does): the Q norm weights here are near 1/sqrt(d),
    else scores ~ N(0, d) make a softmax so sharp that llama.cpp's 8-bit activations move the
    log-probabilities by 0.1 nats on average."""
    t = {}
    for il, is_swa in enumerate(swa):
        p, d, kv = f"blk.{il}.", head_dim[0] if is_swa else head_dim[1], n_head_kv[il]
        t[p + "attn_norm.weight"] = norm(rng, e)
        t[p + "attn_q.weight"] = matrix(rng, n_head * d, e)
        t[p + "attn_q_norm.weight"] = norm(rng, d) / np.float32(np.sqrt(d))
        if il < n_kv:
            t[p + "attn_k.weight"] = matrix(rng, kv * d, e)
            t[p + "attn_k_norm.weight"] = norm(rng, d)
            if il not in no_v:
                t[p + "attn_v.weight"] = matrix(rng, kv * d, e)
        t[p + "attn_output.weight"] = matrix(rng, e, n_head * d)
        t[p + "post_attention_norm.weight"] = norm(rng, e)
        t[p + "ffn_norm.weight"] = norm(rng, e)
        t[p + "ffn_gate.weight"] = matrix(rng, n_ff[il], e)
        t[p + "ffn_up.weight"] = matrix(rng, n_ff[il], e)
        t[p + "ffn_down.weight"] = matrix(rng, e, n_ff[il])
        t[p + "post_ffw_norm.weight"] = norm(rng, e)
    return t


def gemma4_proportional_rope_freqs(head_dim: int, partial: float) -> np.ndarray:
    """The converter's rope_freqs for the global layers: 1 for the rotated pairs, 1e30 (no
    turn) for the rest."""
    n_rot = int(head_dim * partial / 2)
    return np.array([1.0] * n_rot + [1e30] * (head_dim // 2 - n_rot), np.float32)


def recipe_gemma4(rng) -> Recipe:
    """Gemma 4 as E2B / E4B: 5 layers, sliding (heads of 64, 2 KV heads, window 8) but layers 2
    and 4 (global: heads of 128, 1 KV head, proportional RoPE over a quarter of the pairs); the
    last 2 layers keep no K/V (3 reuses layer 1's, 4 layer 2's) and have a double-wide FFN;
    layer 2 has no attn_v (V is K); per-layer token embeddings of 256 per layer; a
    layer_output_scale on every layer; final logit soft-cap 4; output tied. Every layer adds
    three sublayers' 8-bit-rounded products in llama.cpp: logits at 3/4 of the usual scale
    (output_norm) keep that rounding under what tests/test_archs.py measures (0.02 on average
    for Q4_K at full scale)."""
    e, n_head, n_layer, n_pe = 256, 4, 5, 256
    swa = [True, True, False, True, False]
    n_head_kv = [2 if s else 1 for s in swa]
    n_ff = [512] * 3 + [1024] * 2
    t = {"token_embd.weight": embeddings(rng, N_VOCAB, e) / 16}
    t.update(gemma4_layers(rng, e, n_head, swa, n_head_kv, n_ff, (64, 128), 3, {2}))
    t["per_layer_token_embd.weight"] = embeddings(rng, N_VOCAB, n_pe * n_layer) / 16
    t["per_layer_model_proj.weight"] = matrix(rng, n_pe * n_layer, e)
    t["per_layer_proj_norm.weight"] = norm(rng, n_pe)
    for il in range(n_layer):
        p = f"blk.{il}."
        t[p + "inp_gate.weight"] = matrix(rng, n_pe, e)
        t[p + "proj.weight"] = matrix(rng, e, n_pe)
        t[p + "post_norm.weight"] = norm(rng, e)
        t[p + "layer_output_scale.weight"] = rng.uniform(0.75, 1.0, 1).astype(np.float32)
    t["rope_freqs.weight"] = gemma4_proportional_rope_freqs(128, 0.25)
    t["output_norm.weight"] = 0.75 * norm(rng, e)
    md = decoder_metadata("gemma4", n_layer=n_layer, n_embd=e, n_ff=n_ff, n_head=n_head,
                          n_head_kv=n_head_kv, head_dim=128, rope_base=1e6, **{
                              "attention.sliding_window": 8,
                              "attention.sliding_window_pattern": swa,
                              "attention.key_length_swa": 64, "attention.value_length_swa": 64,
                              "rope.dimension_count": 128, "rope.dimension_count_swa": 64,
                              "rope.freq_base_swa": 10000.0,
                              "embedding_length_per_layer_input": n_pe,
                              "attention.shared_kv_layers": 2,
                              "final_logit_softcapping": 4.0})
    return Recipe("gemma4", md, t)


def recipe_gemma4_moe(rng) -> Recipe:
    """Gemma 4 as the 26B-A4B: every layer's dense FFN beside 8 experts (2 chosen, weights
    normalized, each output scaled by ffn_down_exps.scale), the router reading
    rms_norm(h) / 16 * ffn_gate_inp.scale (~16, so that its logits are ~ N(0, 64): a toss-up
    routing moves the K/V later positions attend over, which the router margin of
    tests/test_archs.py does not see, so near-ties are kept rare as in recipe_qwen35moe);
    two layers (as recipe_qwen3moe, for the same reason), the sliding one with separate gate
    and up experts, the global one with fused gate_up experts and no attn_v; no per-layer
    embeddings nor shared KV; an output matrix of its own."""
    e, n_head, n_layer, n_expert, n_ff_exp = 256, 4, 2, 8, 256
    swa = [True, False]
    n_head_kv = [2 if s else 1 for s in swa]
    t = {"token_embd.weight": embeddings(rng, N_VOCAB, e) / 16}
    t.update(gemma4_layers(rng, e, n_head, swa, n_head_kv, [512] * n_layer, (64, 128), n_layer,
                           {1}))
    for il in range(n_layer):
        p = f"blk.{il}."
        t[p + "ffn_gate_inp.weight"] = matrix(rng, n_expert, e, 8.0)
        t[p + "ffn_gate_inp.scale"] = 16 * norm(rng, e)
        if il % 2:
            t[p + "ffn_gate_up_exps.weight"] = expert_matrices(rng, n_expert, 2 * n_ff_exp, e)
        else:
            t[p + "ffn_gate_exps.weight"] = expert_matrices(rng, n_expert, n_ff_exp, e)
            t[p + "ffn_up_exps.weight"] = expert_matrices(rng, n_expert, n_ff_exp, e)
        t[p + "ffn_down_exps.weight"] = expert_matrices(rng, n_expert, e, n_ff_exp)
        t[p + "ffn_down_exps.scale"] = rng.uniform(0.5, 1.5, n_expert).astype(np.float32)
        for name in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
            t[p + name + ".weight"] = norm(rng, e)
    t["rope_freqs.weight"] = gemma4_proportional_rope_freqs(128, 0.25)
    t["output_norm.weight"] = norm(rng, e)
    t["output.weight"] = matrix(rng, N_VOCAB, e, gain=0.75)  # as recipe_gemma4's logits
    md = decoder_metadata("gemma4", n_layer=n_layer, n_embd=e, n_ff=512, n_head=n_head,
                          n_head_kv=n_head_kv, head_dim=128, rope_base=1e6, **{
                              "attention.sliding_window": 8,
                              "attention.sliding_window_pattern": swa,
                              "attention.key_length_swa": 64, "attention.value_length_swa": 64,
                              "rope.dimension_count": 128, "rope.dimension_count_swa": 64,
                              "embedding_length_per_layer_input": 0,
                              "attention.shared_kv_layers": 0,
                              "expert_count": n_expert, "expert_used_count": 2,
                              "expert_feed_forward_length": n_ff_exp,
                              "final_logit_softcapping": 30.0})
    # llama-quantize never quantizes the router (ffn_gate_inp)
    return Recipe("gemma4", md, t, keep_f32={k for k in t if k.endswith("ffn_gate_inp.weight")})


def recipe_phi3(rng) -> Recipe:
    """Phi-3 with fused attn_qkv and ffn_up, RoPE over 48 of 64 dims per head, LongRoPE factors
    with an original context of 256 (a 256-cell context takes the short factors, 512 the long),
    and a sliding window llama.cpp turns off."""
    n_layer, e, f, n_head, n_head_kv, d, n_rot = 3, 256, 512, 4, 2, 64, 48
    t = {"token_embd.weight": embeddings(rng, N_VOCAB, e)}
    for il in range(n_layer):
        p = f"blk.{il}."
        t[p + "attn_norm.weight"] = norm(rng, e)
        t[p + "attn_qkv.weight"] = matrix(rng, (n_head + 2 * n_head_kv) * d, e)
        t[p + "attn_output.weight"] = matrix(rng, e, n_head * d)
        t[p + "ffn_norm.weight"] = norm(rng, e)
        t[p + "ffn_up.weight"] = matrix(rng, 2 * f, e)
        t[p + "ffn_down.weight"] = matrix(rng, e, f)
    t["rope_factors_short.weight"] = (1.0 + 0.5 * rng.random(n_rot // 2)).astype(np.float32)
    t["rope_factors_long.weight"] = np.geomspace(1.0, 16.0, n_rot // 2).astype(np.float32)
    t["output_norm.weight"] = norm(rng, e)
    t["output.weight"] = matrix(rng, N_VOCAB, e)
    scale = 4096 / 256  # the converter's attn_factor: sqrt(1 + ln(scale) / ln(original))
    md = decoder_metadata("phi3", n_layer=n_layer, n_embd=e, n_ff=f, n_head=n_head,
                          n_head_kv=n_head_kv, eps=1e-5, **{
                              "rope.dimension_count": n_rot,
                              "rope.scaling.original_context_length": 256,
                              "rope.scaling.attn_factor": float(np.sqrt(
                                  1 + np.log(scale) / np.log(256))),
                              "attention.sliding_window": 8})
    return Recipe("phi3", md, t, label="Phi three")


def recipe_gemma2(rng) -> Recipe:
    """Gemma 2: small soft-caps so that both matter, windows of 8 on the even layers (the
    default pattern), linear RoPE scaling (on both kinds of layer), key_length 128."""
    shape = dict(n_layer=4, n_embd=256, n_ff=512, n_head=4, n_head_kv=2)
    t = {"token_embd.weight": embeddings(rng, N_VOCAB, 256) / 16}
    t.update(llama_layers(rng, head_dim=128, **shape))
    for il in range(shape["n_layer"]):
        t[f"blk.{il}.post_attention_norm.weight"] = norm(rng, 256)
        t[f"blk.{il}.post_ffw_norm.weight"] = norm(rng, 256)
    t["output_norm.weight"] = norm(rng, 256)
    md = decoder_metadata("gemma2", head_dim=128, **shape, **{
        "attention.sliding_window": 8, "attn_logit_softcapping": 2.0,
        "final_logit_softcapping": 4.0, "rope.scaling.type": "linear",
        "rope.scaling.factor": 2.0})
    return Recipe("gemma2", md, t)


def olmo2_tensors(rng, n_layer: int, e: int, f: int, n_head: int, n_head_kv: int,
                  d: int) -> dict[str, np.ndarray]:
    t = {"token_embd.weight": embeddings(rng, N_VOCAB, e)}
    t.update(llama_layers(rng, n_layer, e, f, n_head, n_head_kv, d))
    for il in range(n_layer):
        p = f"blk.{il}."
        del t[p + "attn_norm.weight"], t[p + "ffn_norm.weight"]  # OLMo 2 has post-norms only
        t[p + "attn_q_norm.weight"] = norm(rng, n_head * d)  # over all heads at once
        t[p + "attn_k_norm.weight"] = norm(rng, n_head_kv * d)
        t[p + "post_attention_norm.weight"] = norm(rng, e)
        t[p + "post_ffw_norm.weight"] = norm(rng, e)
    t["output_norm.weight"] = norm(rng, e)
    # the quantized types' differences from llama.cpp (every family has them; F16 agrees to
    # 0.0004 here as elsewhere) weigh ~1.5 times more in OLMo 2's log-probabilities: logits at
    # 3/4 of the usual scale keep them under the bound (0.022 on average for Q4_K at full scale)
    t["output.weight"] = matrix(rng, N_VOCAB, e, gain=0.75)
    return t


def recipe_olmo2(rng) -> Recipe:
    shape = dict(n_layer=3, n_embd=256, n_ff=512, n_head=4, n_head_kv=2)
    t = olmo2_tensors(rng, 3, 256, 512, 4, 2, 64)
    return Recipe("olmo2", decoder_metadata("olmo2", rope_base=500000.0, **shape), t)


def recipe_olmo2_sliding_window(rng) -> Recipe:
    """OLMo 3's layout: windows of 8 on layers 0-2 (the default pattern 4), YaRN on layer 3."""
    shape = dict(n_layer=4, n_embd=256, n_ff=512, n_head=4, n_head_kv=2)
    t = olmo2_tensors(rng, 4, 256, 512, 4, 2, 64)
    md = decoder_metadata("olmo2", rope_base=500000.0, **shape, **{
        "attention.sliding_window": 8, "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
        "rope.scaling.original_context_length": 32})
    return Recipe("olmo2", md, t)


def recipe_smollm3(rng) -> Recipe:
    """SmolLM3: layer 3 of 4 without RoPE."""
    shape = dict(n_layer=4, n_embd=256, n_ff=512, n_head=4, n_head_kv=1)
    t = {"token_embd.weight": embeddings(rng, N_VOCAB, 256),
         **llama_layers(rng, head_dim=64, **shape),
         "output_norm.weight": norm(rng, 256),
         "output.weight": matrix(rng, N_VOCAB, 256)}
    return Recipe("smollm3", decoder_metadata("smollm3", rope_base=5e6, **shape), t)


def recipe_granite(rng) -> Recipe:
    """Granite's four multipliers, each away from 1 (embeddings and output scaled against the
    embedding and logit multipliers so that activations keep their usual size)."""
    shape = dict(n_layer=3, n_embd=256, n_ff=512, n_head=4, n_head_kv=2)
    t = {"token_embd.weight": embeddings(rng, N_VOCAB, 256) / 4,
         **llama_layers(rng, head_dim=64, **shape),
         "output_norm.weight": norm(rng, 256),
         "output.weight": matrix(rng, N_VOCAB, 256, gain=4.0)}
    md = decoder_metadata("granite", **shape, **{
        "embedding_scale": 4.0, "residual_scale": 0.5, "attention.scale": 1 / 32,
        "logit_scale": 4.0})
    return Recipe("granite", md, t)


def recipe_llama_rope_freqs(rng) -> Recipe:
    """Llama 3.1/3.2: rope_freqs.weight as the converter computes it from the "llama3" scaling
    (factor 8, low/high frequency factors 1 and 4) for an original context of 32."""
    recipe = recipe_llama(rng)
    base, dim, factor, low, high, old_ctx = 500000.0, 64, 8.0, 1.0, 4.0, 32
    factors = []
    for freq in 1.0 / base ** (np.arange(0, dim, 2) / dim):
        wavelen = 2 * np.pi / freq
        if wavelen < old_ctx / high:
            factors.append(1.0)
        elif wavelen > old_ctx / low:
            factors.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    recipe.tensors["rope_freqs.weight"] = np.array(factors, np.float32)
    return recipe


def recipe_llama_yarn(rng) -> Recipe:
    """YaRN with factor 4 over an original context of 32 (the 80 positions run past it); the
    converter's yarn_* keys are set to odd values, which llama.cpp's llama reads none of."""
    recipe = recipe_llama(rng)
    recipe.metadata.update({f"llama.rope.scaling.{k}": v for k, v in {
        "type": "yarn", "factor": 4.0, "original_context_length": 32,
        "yarn_ext_factor": 0.5, "yarn_attn_factor": 0.7, "yarn_beta_fast": 8.0,
        "yarn_beta_slow": 2.0}.items()})
    recipe.metadata["llama.rope.freq_base"] = 10000.0
    return recipe


def recipe_llama_sliding_window(rng) -> Recipe:
    """Mistral-style: llama with attention.sliding_window 8, which llama.cpp does not apply to
    the llama architecture (every layer attends over the whole context)."""
    recipe = recipe_llama(rng)
    recipe.metadata["llama.attention.sliding_window"] = 8
    return recipe


def recipe_qwen2(rng) -> Recipe:
    """Qwen 2: Q/K/V biases. The output is its own matrix (as Qwen 2.5 7B's): tied to N(0, 1)
    embeddings the logits would be each token's own (the tied path is Gemma 3's), and embeddings
    scaled down leave the residual stream to the layers alone, where llama.cpp's 8-bit
    activations double its difference from an exact product (0.025 nats on average)."""
    shape = dict(n_layer=3, n_embd=256, n_ff=512, n_head=4, n_head_kv=2)
    t = {"token_embd.weight": embeddings(rng, N_VOCAB, 256),
         **llama_layers(rng, head_dim=64, qkv_bias=True, **shape),
         "output_norm.weight": norm(rng, 256),
         "output.weight": matrix(rng, N_VOCAB, 256)}
    return Recipe("qwen2", decoder_metadata("qwen2", rope_base=1e6, **shape), t)


def recipe_qwen3(rng) -> Recipe:
    """Qwen 3: per-head Q/K norms, heads wider than n_embd / n_head (4 x 128 over 256)."""
    shape = dict(n_layer=3, n_embd=256, n_ff=512, n_head=4, n_head_kv=2)
    t = {"token_embd.weight": embeddings(rng, N_VOCAB, 256),
         **llama_layers(rng, head_dim=128, **shape), **qk_norms(rng, 3, 128),
         "output_norm.weight": norm(rng, 256),
         "output.weight": matrix(rng, N_VOCAB, 256)}
    return Recipe("qwen3", decoder_metadata("qwen3", head_dim=128, rope_base=1e6, **shape), t)


def _moe_recipe(rng, arch: str, shape: dict, head_dim: int, moe: dict, qkv_bias: bool,
                qk_norm: bool) -> Recipe:
    n_layer, n_embd = shape["n_layer"], shape["n_embd"]
    layers = without_dense_ffn(llama_layers(rng, head_dim=head_dim, qkv_bias=qkv_bias, **shape))
    t = {"token_embd.weight": embeddings(rng, N_VOCAB, n_embd), **layers,
         **(qk_norms(rng, n_layer, head_dim) if qk_norm else {}),
         **moe_ffn(rng, n_layer, n_embd, moe["expert_count"], moe["expert_feed_forward_length"],
                   moe.get("expert_shared_feed_forward_length", 0)),
         "output_norm.weight": norm(rng, n_embd),
         "output.weight": matrix(rng, N_VOCAB, n_embd)}
    md = decoder_metadata(arch, head_dim=head_dim, rope_base=1e6, **shape, **moe)
    # llama-quantize never quantizes the router (ffn_gate_inp)
    return Recipe(arch, md, t, keep_f32={k for k in t if k.endswith("ffn_gate_inp.weight")})


def recipe_qwen2moe(rng) -> Recipe:
    """Qwen 2 MoE: 8 experts, 2 chosen per token (weights not normalised), a shared expert
    behind its sigmoid gate, Q/K/V biases."""
    return _moe_recipe(
        rng, "qwen2moe", dict(n_layer=3, n_embd=256, n_ff=512, n_head=4, n_head_kv=2), 64,
        {"expert_count": 8, "expert_used_count": 2, "expert_feed_forward_length": 256,
         "expert_shared_feed_forward_length": 512}, qkv_bias=True, qk_norm=False)


def recipe_qwen3moe(rng) -> Recipe:
    """Qwen 3 MoE: 16 experts, 4 chosen per token, their weights normalised; per-head Q/K
    norms. Two layers: with 16 experts a token's 4th and 5th are often close, and a position
    where they are (on any layer) is left out of the comparison (tests/test_archs.py)."""
    return _moe_recipe(
        rng, "qwen3moe", dict(n_layer=2, n_embd=256, n_ff=512, n_head=4, n_head_kv=2), 128,
        {"expert_count": 16, "expert_used_count": 4, "expert_feed_forward_length": 256},
        qkv_bias=False, qk_norm=True)


def gpt_oss_layers(rng, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, head_dim: int,
                   n_expert: int, n_ff_exp: int) -> dict[str, np.ndarray]:
    """gpt-oss's layers: attention with Q/K/V/O biases and per-head sinks ~ N(0, 1); the FFN's
    pre-norm is post_attention_norm; a router with a bias (gain 5, as moe_ffn's) and experts
    with a bias row each. attn_output and the experts' down matrices at half gain: the layers
    then add less to the embeddings, and llama.cpp's 8-bit activations move the log-probabilities
    of the quantized files about half as much (0.008 to 0.016 nats on average, against 0.025 to
    0.04 at full gain)."""
    t = {}
    for il in range(n_layer):
        p = f"blk.{il}."
        t[p + "attn_norm.weight"] = norm(rng, n_embd)
        for name, n_out in (("attn_q", n_head * head_dim), ("attn_k", n_head_kv * head_dim),
                            ("attn_v", n_head_kv * head_dim)):
            t[p + name + ".weight"] = matrix(rng, n_out, n_embd)
            t[p + name + ".bias"] = bias(rng, n_out)
        t[p + "attn_output.weight"] = matrix(rng, n_embd, n_head * head_dim, 0.5)
        t[p + "attn_output.bias"] = bias(rng, n_embd)
        t[p + "attn_sinks.weight"] = rng.standard_normal(n_head).astype(np.float32)
        t[p + "post_attention_norm.weight"] = norm(rng, n_embd)
        t[p + "ffn_gate_inp.weight"] = matrix(rng, n_expert, n_embd, 5.0)
        t[p + "ffn_gate_inp.bias"] = bias(rng, n_expert)
        t[p + "ffn_gate_exps.weight"] = expert_matrices(rng, n_expert, n_ff_exp, n_embd)
        t[p + "ffn_up_exps.weight"] = expert_matrices(rng, n_expert, n_ff_exp, n_embd)
        t[p + "ffn_down_exps.weight"] = 0.5 * expert_matrices(rng, n_expert, n_embd, n_ff_exp)
        t[p + "ffn_gate_exps.bias"] = 0.1 * rng.standard_normal((n_expert, n_ff_exp))
        t[p + "ffn_up_exps.bias"] = 0.1 * rng.standard_normal((n_expert, n_ff_exp))
        t[p + "ffn_down_exps.bias"] = 0.1 * rng.standard_normal((n_expert, n_embd))
    return t


def recipe_gpt_oss(rng) -> Recipe:
    """gpt-oss: attention sinks, even layers sliding-window (8 positions, their own RoPE base),
    YaRN (factor 4 over an original context of 32), 4 experts of which 2 chosen by logit and
    weighted by the softmax over those two, expert biases, the clamped SwiGLU. (Of 8 experts
    the 2nd and 3rd are close too often: fewer than 64 positions would be compared.)"""
    shape = dict(n_layer=4, n_embd=256, n_head=8, n_head_kv=2)
    n_expert, n_ff_exp = 4, 256
    t = {"token_embd.weight": embeddings(rng, N_VOCAB, 256),
         **gpt_oss_layers(rng, head_dim=64, n_expert=n_expert, n_ff_exp=n_ff_exp, **shape),
         "output_norm.weight": norm(rng, 256),
         "output.weight": matrix(rng, N_VOCAB, 256)}
    md = decoder_metadata("gpt-oss", head_dim=64, n_ff=n_ff_exp, rope_base=10000.0, eps=1e-5,
                          **shape, **{
                              "expert_count": n_expert, "expert_used_count": 2,
                              "expert_feed_forward_length": n_ff_exp,
                              "attention.sliding_window": 8, "rope.freq_base_swa": 5000.0,
                              "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                              "rope.scaling.original_context_length": 32})
    # llama-quantize leaves the router and every bias (.bias, 2-D ones included) unquantized
    keep = {k for k in t if k.endswith(("ffn_gate_inp.weight", ".bias"))}
    return Recipe("gpt-oss", md, {k: np.asarray(v, np.float32) for k, v in t.items()},
                  keep_f32=keep)


def recipe_gpt_oss_mxfp4(rng) -> Recipe:
    """gpt-oss as its files come: the experts' matrices MXFP4 whatever the other matrices are."""
    recipe = recipe_gpt_oss(rng)
    recipe.tensor_types = {k: "MXFP4" for k in recipe.tensors if k.endswith("_exps.weight")}
    return recipe


def qwen35_layers(rng, n_layer: int, n_embd: int, n_ff: int, n_head: int, n_head_kv: int,
                  head_dim: int, interval: int, ssm: dict) -> dict[str, np.ndarray]:
    """Qwen 3.5's layers: Gated DeltaNet but every `interval`-th, which is gated attention (Q
    projection twice as tall: each head's query, then its gate); post_attention_norm before the
    FFN. Decays near 1 (ssm_a ~ -0.05..-1, softplus(ssm_dt) ~ 0.13), so that the state carries
    tokens far back. The DeltaNet output (ssm_out, gain 0.5) and the FFN (ffn_down, gain 0.7)
    add less to the residual stream than a plain matrix would: four layers of them, each with
    more 8-bit-rounded products than an attention layer, put llama.cpp's activation rounding at
    0.027 nats on average on Q4_K with full gains (0.009 where our 8-bit kernels round the same
    way), beyond what tests/test_archs.py means to measure."""
    t = {}
    s, n_k, n_v = ssm["state_size"], ssm["group_count"], ssm["time_step_rank"]
    conv_dim = 2 * n_k * s + n_v * s
    for il in range(n_layer):
        p = f"blk.{il}."
        t[p + "attn_norm.weight"] = norm(rng, n_embd)
        t[p + "post_attention_norm.weight"] = norm(rng, n_embd)
        if (il + 1) % interval == 0:
            t[p + "attn_q.weight"] = matrix(rng, 2 * n_head * head_dim, n_embd)
            t[p + "attn_k.weight"] = matrix(rng, n_head_kv * head_dim, n_embd)
            t[p + "attn_v.weight"] = matrix(rng, n_head_kv * head_dim, n_embd)
            t[p + "attn_output.weight"] = matrix(rng, n_embd, n_head * head_dim)
            t[p + "attn_q_norm.weight"] = norm(rng, head_dim)
            t[p + "attn_k_norm.weight"] = norm(rng, head_dim)
        else:
            t[p + "attn_qkv.weight"] = matrix(rng, conv_dim, n_embd)
            t[p + "attn_gate.weight"] = matrix(rng, n_v * s, n_embd)
            t[p + "ssm_conv1d.weight"] = (rng.standard_normal((conv_dim, ssm["conv_kernel"]))
                                          * 0.5).astype(np.float32)
            t[p + "ssm_dt.bias"] = (-2.0 + 0.1 * rng.standard_normal(n_v)).astype(np.float32)
            t[p + "ssm_a"] = (-np.exp(rng.uniform(-3.0, 0.0, n_v))).astype(np.float32)
            t[p + "ssm_beta.weight"] = matrix(rng, n_v, n_embd)
            t[p + "ssm_alpha.weight"] = matrix(rng, n_v, n_embd)
            t[p + "ssm_norm.weight"] = norm(rng, s)
            t[p + "ssm_out.weight"] = matrix(rng, n_embd, n_v * s, gain=0.5)
        t[p + "ffn_gate.weight"] = matrix(rng, n_ff, n_embd)
        t[p + "ffn_up.weight"] = matrix(rng, n_ff, n_embd)
        t[p + "ffn_down.weight"] = matrix(rng, n_embd, n_ff, gain=0.7)
    return t


QWEN35_SSM = {"conv_kernel": 4, "state_size": 64, "group_count": 2, "time_step_rank": 4,
              "inner_size": 256}


def recipe_qwen35(rng) -> Recipe:
    """Qwen 3.5: 3 DeltaNet layers then 1 gated attention layer (full_attention_interval 4, as
    the real models), 4 value heads over 2 key heads; partial IMROPE (32 of 64 dims) whose
    sections [5, 5, 5, 1] leave the last pair unturned for text."""
    shape = dict(n_layer=4, n_embd=256, n_ff=512, n_head=4, n_head_kv=2)
    t = {"token_embd.weight": embeddings(rng, N_VOCAB, 256),
         **qwen35_layers(rng, head_dim=64, interval=4, ssm=QWEN35_SSM, **shape),
         "output_norm.weight": norm(rng, 256),
         "output.weight": matrix(rng, N_VOCAB, 256)}
    md = decoder_metadata("qwen35", head_dim=64, rope_base=1e7, **shape,
                          **{"rope.dimension_count": 32, "rope.dimension_sections": [5, 5, 5, 1],
                             "full_attention_interval": 4},
                          **{f"ssm.{k}": v for k, v in QWEN35_SSM.items()})
    return Recipe("qwen35", md, t, keep_f32={k for k in t if k.endswith("ssm_conv1d.weight")})


def recipe_qwen35moe(rng) -> Recipe:
    """Qwen 3.5 MoE: Qwen 3.5's hybrid layers with 8 experts, 2 chosen per token (weights
    normalised), and a shared expert behind its sigmoid gate in place of the dense FFN (its
    down matrices at gain 0.7, as recipe_qwen35's ffn_down). Two layers, a DeltaNet one then
    an attention one (full_attention_interval 2): over 300 positions, four layers of routing
    behind DeltaNet layers leave toss-ups llama.cpp's 8-bit activations settle otherwise
    (up to 0.34 nats at a position) more often than the router margin catches; for the same
    reason a router gain of 8 (near-ties rarer)."""
    shape = dict(n_layer=2, n_embd=256, n_ff=512, n_head=4, n_head_kv=2)
    moe = {"expert_count": 8, "expert_used_count": 2, "expert_feed_forward_length": 256,
           "expert_shared_feed_forward_length": 256}
    layers = without_dense_ffn(qwen35_layers(rng, head_dim=64, interval=2, ssm=QWEN35_SSM,
                                             **shape))
    t = {"token_embd.weight": embeddings(rng, N_VOCAB, 256), **layers,
         **moe_ffn(rng, 2, 256, 8, 256, 256, router_gain=8.0),
         "output_norm.weight": norm(rng, 256),
         "output.weight": matrix(rng, N_VOCAB, 256)}
    for k in t:
        if k.endswith(("ffn_down_exps.weight", "ffn_down_shexp.weight")):
            t[k] *= np.float32(0.7)
    md = decoder_metadata("qwen35moe", head_dim=64, rope_base=1e7, **shape, **moe,
                          **{"rope.dimension_count": 32, "rope.dimension_sections": [5, 5, 5, 1],
                             "full_attention_interval": 2},
                          **{f"ssm.{k}": v for k, v in QWEN35_SSM.items()})
    # llama-quantize never quantizes the router (ffn_gate_inp)
    keep = {k for k in t if k.endswith(("ssm_conv1d.weight", "ffn_gate_inp.weight"))}
    return Recipe("qwen35moe", md, t, keep_f32=keep)


def _mistral3_recipe(rng, ffn_bias: bool = False, moe: dict | None = None) -> Recipe:
    shape = dict(n_layer=3, n_embd=256, n_ff=512, n_head=4, n_head_kv=2)
    layers = llama_layers(rng, head_dim=64, **shape)
    if ffn_bias:
        for il in range(shape["n_layer"]):
            for name, n in (("gate", 512), ("up", 512), ("down", 256)):
                layers[f"blk.{il}.ffn_{name}.bias"] = bias(rng, n)
    if moe:  # mistral3's experts are feed_forward_length wide
        layers = {**without_dense_ffn(layers),
                  **moe_ffn(rng, shape["n_layer"], 256, moe["expert_count"], shape["n_ff"])}
    t = {"token_embd.weight": embeddings(rng, N_VOCAB, 256), **layers,
         "output_norm.weight": norm(rng, 256),
         "output.weight": matrix(rng, N_VOCAB, 256)}
    md = decoder_metadata("mistral3", head_dim=64, rope_base=10000.0, **shape, **(moe or {}),
                          **{"rope.dimension_count": 64})
    # llama-quantize never quantizes the router (ffn_gate_inp)
    return Recipe("mistral3", md, t, keep_f32={k for k in t if k.endswith("ffn_gate_inp.weight")})


def _with_mistral3_scaling(recipe: Recipe) -> Recipe:
    """Ministral 3's YaRN (factor 4) and Llama 4's attention temperature over an original
    context of 16, so that the queries' scale steps up 4 times in the 80 positions (to
    1 + 0.4·ln 5 at the last); YaRN's betas (2 and 0.25: a ramp over pairs 0..9 where the
    defaults give 0..4) and log multiplier (1: the cos/sin magnitude back to 1) away from
    llama.cpp's defaults, which its mistral3 reads from the file."""
    recipe.metadata.update({f"mistral3.{k}": v for k, v in {
        "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
        "rope.scaling.original_context_length": 16, "rope.scaling.yarn_beta_fast": 2.0,
        "rope.scaling.yarn_beta_slow": 0.25, "rope.scaling.yarn_log_multiplier": 1.0,
        "attention.temperature_scale": 0.4}.items()})
    return recipe


def recipe_mistral3(rng) -> Recipe:
    """Ministral 3: llama's block with YaRN and attention temperature scaling."""
    return _with_mistral3_scaling(_mistral3_recipe(rng))


def recipe_mistral3_plain(rng) -> Recipe:
    """mistral3 without YaRN or temperature scaling, and with the FFN biases its build_ffn
    takes when the file has them."""
    return _mistral3_recipe(rng, ffn_bias=True)


def recipe_mistral3_moe(rng) -> Recipe:
    """mistral3's mixture-of-experts branch: 8 experts of feed_forward_length, 2 chosen per
    token, their weights normalised; with the scaling of the dense recipe."""
    return _with_mistral3_scaling(_mistral3_recipe(rng, moe={"expert_count": 8,
                                                              "expert_used_count": 2}))


RECIPES = {
    "llama": recipe_llama,
    "gemma3": recipe_gemma3,
    "gemma4": recipe_gemma4,
    # the architectures issue, part 1 (families helper)
    "phi3": recipe_phi3,
    "gemma2": recipe_gemma2,
    "olmo2": recipe_olmo2,
    "smollm3": recipe_smollm3,
    "granite": recipe_granite,
    "qwen2": recipe_qwen2,
    "qwen3": recipe_qwen3,
    "qwen2moe": recipe_qwen2moe,
    "qwen3moe": recipe_qwen3moe,
    "qwen35": recipe_qwen35,
    "qwen35moe": recipe_qwen35moe,
    "mistral3": recipe_mistral3,
    "gpt-oss": recipe_gpt_oss,
}


# ----------------------------------------------------------------------------- encoders
# Encoders (BERT and kin) have no logits: they are compared by their pooled embeddings of
# EMBED_INPUTS (token ids, and on F16 models EMBED_TEXTS through the WordPiece vocabulary
# below), recorded into tests/golden/synthetic_embeddings.json.

ENCODER_CTX = 128  # context_length: BERT's position table has a row per position
# several lengths, so that one batch holds sequences of different sizes
EMBED_INPUTS = [TOKENS, TOKENS[5:37], TOKENS[40:43], TOKENS[60:61]]
EMBED_TEXTS = ["the cat sat on the mat.", "Dogs, cats and birds!",
               "a quick brown fox jumps over the lazy dog"]
_WPM_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_WPM_WORDS = ("the cat sat on mat dog dogs cats and bird birds quick brown fox jump jumps over "
              "lazy").split()


# llama.cpp adds the token-type row to float32 states as it is: the converters keep it F32
_F32_TYPES = ("token_types.weight",)


def encoder_metadata(arch: str, *, n_layer: int, n_embd: int, n_ff: int, n_head: int,
                     pooling: int, **extra) -> dict:
    """The keys of a BERT-style encoder: LayerNorm epsilon, non-causal attention, pooling type
    (llama_pooling_type: 1 mean, 2 cls), two token types."""
    md = {
        "context_length": ENCODER_CTX, "embedding_length": n_embd, "block_count": n_layer,
        "feed_forward_length": n_ff, "attention.head_count": n_head,
        "attention.layer_norm_epsilon": 1e-12, "attention.causal": False,
        "pooling_type": pooling,
    }
    md.update(extra)
    return {**{f"{arch}.{k}": v for k, v in md.items()}, "tokenizer.ggml.token_type_count": 2}


def wpm_tokenizer_metadata() -> list[tuple[str, object, object]]:
    """A tiny WordPiece vocabulary as llama.cpp's converter writes BERT's ("▁word" starts a word,
    "piece" continues one): the specials, some whole words, every lowercase letter and digit
    both ways and ASCII punctuation, padded with unused pieces to N_VOCAB."""
    words = [f"\u2581{w}" for w in _WPM_WORDS]
    chars = "abcdefghijklmnopqrstuvwxyz0123456789"
    pieces = [f"\u2581{c}" for c in chars] + list(chars) + [f"\u2581{c}" for c in ".,!?'-"]
    tokens = _WPM_SPECIALS + words + pieces
    tokens += [f"unused{i}" for i in range(N_VOCAB - len(tokens))]
    string_array = ValueType(GGUFValueType.ARRAY, ValueType(GGUFValueType.STRING))
    int_array = ValueType(GGUFValueType.ARRAY, ValueType(GGUFValueType.INT32))
    ids = {t: i for i, t in enumerate(_WPM_SPECIALS)}
    return [
        ("tokenizer.ggml.model", "bert", None),
        ("tokenizer.ggml.tokens", tokens, string_array),
        ("tokenizer.ggml.token_type", [3] * len(_WPM_SPECIALS) +
         [1] * (N_VOCAB - len(_WPM_SPECIALS)), int_array),
        ("tokenizer.ggml.padding_token_id", ids["[PAD]"], GGUFValueType.UINT32),
        ("tokenizer.ggml.unknown_token_id", ids["[UNK]"], GGUFValueType.UINT32),
        ("tokenizer.ggml.bos_token_id", ids["[CLS]"], GGUFValueType.UINT32),
        ("tokenizer.ggml.seperator_token_id", ids["[SEP]"], GGUFValueType.UINT32),
        ("tokenizer.ggml.mask_token_id", ids["[MASK]"], GGUFValueType.UINT32),
    ]


def encoder_layer_norms(rng, n_layer: int, n_embd: int) -> dict[str, np.ndarray]:
    t = {"token_embd_norm.weight": norm(rng, n_embd), "token_embd_norm.bias": bias(rng, n_embd)}
    for il in range(n_layer):
        for name in ("attn_output_norm", "layer_output_norm"):
            t[f"blk.{il}.{name}.weight"] = norm(rng, n_embd)
            t[f"blk.{il}.{name}.bias"] = bias(rng, n_embd)
    return t


def recipe_bert(rng) -> Recipe:
    shape = dict(n_layer=3, n_embd=256, n_ff=512, n_head=4)
    e, f = 256, 512
    t = {"token_embd.weight": embeddings(rng, N_VOCAB, e),
         "token_types.weight": embeddings(rng, 2, e) * 0.5,
         "position_embd.weight": embeddings(rng, ENCODER_CTX, e) * 0.5,
         **encoder_layer_norms(rng, 3, e)}
    for il in range(3):
        p = f"blk.{il}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            t[p + name + ".weight"] = matrix(rng, e, e)
            t[p + name + ".bias"] = bias(rng, e)
        t[p + "ffn_up.weight"], t[p + "ffn_up.bias"] = matrix(rng, f, e), bias(rng, f)
        t[p + "ffn_down.weight"], t[p + "ffn_down.bias"] = matrix(rng, e, f), bias(rng, e)
    return Recipe("bert", encoder_metadata("bert", pooling=1, **shape), t,
                  keep_f32=set(_F32_TYPES), tokenizer=wpm_tokenizer_metadata())


def recipe_nomic_bert(rng) -> Recipe:
    shape = dict(n_layer=3, n_embd=256, n_ff=512, n_head=4)
    e, f = 256, 512
    t = {"token_embd.weight": embeddings(rng, N_VOCAB, e),
         "token_types.weight": embeddings(rng, 2, e) * 0.5,
         **encoder_layer_norms(rng, 3, e)}
    for il in range(3):
        p = f"blk.{il}."
        t[p + "attn_qkv.weight"] = matrix(rng, 3 * e, e)
        t[p + "attn_output.weight"] = matrix(rng, e, e)
        t[p + "ffn_gate.weight"] = matrix(rng, f, e)
        t[p + "ffn_up.weight"] = matrix(rng, f, e)
        t[p + "ffn_down.weight"] = matrix(rng, e, f)
    md = encoder_metadata("nomic-bert", pooling=2, **shape, **{"rope.freq_base": 1000.0})
    return Recipe("nomic-bert", md, t, keep_f32=set(_F32_TYPES),
                  tokenizer=wpm_tokenizer_metadata())


RECIPES.update({
    "bert": recipe_bert,
    "nomic-bert": recipe_nomic_bert,
})


@dataclass(frozen=True)
class Case:
    """A model evaluated against llama.cpp: its recipe and the context both run it in."""
    recipe: object  # (rng) -> Recipe
    n_ctx: int = 256
    # positions evaluated: TOKENS (80) unless more are needed (a recurrent state's long reach)
    n_tokens: int = len(TOKENS)

    @property
    def tokens(self) -> list[int]:
        """The token ids the case is evaluated on: TOKENS, or n_tokens ids of the same kind."""
        if self.n_tokens == len(TOKENS):
            return TOKENS
        return [int(t) for t in np.random.default_rng(4321).integers(3, N_VOCAB, self.n_tokens)]

    @property
    def arch(self) -> str:
        """The case's `general.architecture` (its recipe's, as the catalog names it)."""
        return self.recipe(np.random.default_rng(0)).arch


# cases beyond one per family: variants of a family's file that take other code paths
VARIANTS = {
    "llama-rope-freqs": Case(recipe_llama_rope_freqs),
    "llama-yarn": Case(recipe_llama_yarn),
    "llama-sliding-window": Case(recipe_llama_sliding_window),
    "phi3-long-factors": Case(recipe_phi3, n_ctx=512),
    "olmo2-sliding-window": Case(recipe_olmo2_sliding_window),
    "mistral3-plain": Case(recipe_mistral3_plain),
    "mistral3-moe": Case(recipe_mistral3_moe),
    "gpt-oss-mxfp4": Case(recipe_gpt_oss_mxfp4),
    "gemma4-moe": Case(recipe_gemma4_moe),
}
# families whose own case is not the default one (more positions, a larger context)
FAMILY_CASES = {
    "qwen35": Case(recipe_qwen35, n_ctx=512, n_tokens=300),
    "qwen35moe": Case(recipe_qwen35moe, n_ctx=512, n_tokens=300),
}
CASES = {**{name: FAMILY_CASES.get(name, Case(recipe)) for name, recipe in RECIPES.items()},
         **VARIANTS}


# ----------------------------------------------------------------------------- writing


def tokenizer_metadata(n_vocab: int = N_VOCAB) -> list[tuple[str, object, object]]:
    """A GPT-2-style vocabulary llama.cpp accepts: BOS/EOS and n_vocab - 2 plain tokens."""
    tokens = ["<s>", "</s>"] + [f"t{i}" for i in range(2, n_vocab)]
    string_array = ValueType(GGUFValueType.ARRAY, ValueType(GGUFValueType.STRING))
    int_array = ValueType(GGUFValueType.ARRAY, ValueType(GGUFValueType.INT32))
    return [
        ("tokenizer.ggml.model", "gpt2", None),
        ("tokenizer.ggml.pre", "default", None),
        ("tokenizer.ggml.tokens", tokens, string_array),
        ("tokenizer.ggml.token_type", [3, 3] + [1] * (n_vocab - 2), int_array),
        ("tokenizer.ggml.merges", [], string_array),
        ("tokenizer.ggml.bos_token_id", 0, GGUFValueType.UINT32),
        ("tokenizer.ggml.eos_token_id", 1, GGUFValueType.UINT32),
        ("tokenizer.ggml.add_bos_token", False, None),
    ]


def typed(value):
    if isinstance(value, bool):
        return GGUFValueType.BOOL
    if isinstance(value, int):
        return GGUFValueType.UINT32 if value >= 0 else GGUFValueType.INT32
    if isinstance(value, float):
        return GGUFValueType.FLOAT32
    return None


def write_model(name: str, type_name: str, directory) -> pathlib.Path:
    """Writes `<name>-<type>.gguf` for the case `name` (a family or a variant) into `directory`
    (deterministic bytes); returns its path."""
    recipe = CASES[name].recipe(np.random.default_rng(_seed(name)))
    path = pathlib.Path(directory) / f"{name}-{type_name}.gguf"
    write_recipe(recipe, path, type_name, recipe.label or name)
    return path


def write_recipe(recipe: Recipe, path, type_name: str, label: str) -> None:
    """Writes `recipe` to `path` with its matrices in `type_name` (deterministic bytes)."""
    from llamatui.inference.quants import quantize
    w = GGUFWriter(path)
    w.add("general.architecture", recipe.arch)
    w.add("general.name", f"synthetic {label} {type_name}")
    for key, value, vtype in recipe.tokenizer or tokenizer_metadata():
        w.add(key, value, vtype)
    for key, value in recipe.metadata.items():
        w.add(key, value, typed(value))
    for name, array in recipe.tensors.items():
        array = np.ascontiguousarray(array, dtype=np.float32)
        tensor_type = recipe.tensor_types.get(name, type_name)
        if array.ndim == 1 or name in recipe.keep_f32:
            w.add_tensor(name, "F32", array.shape, array)
        elif tensor_type == "F16":
            w.add_tensor(name, "F16", array.shape, array.astype(np.float16))
        else:
            rows = array.reshape(-1, array.shape[-1])
            w.add_tensor(name, tensor_type, array.shape, quantize(tensor_type, rows))
    w.write()


def _seed(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")


def sha256_of(path) -> str:
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()
