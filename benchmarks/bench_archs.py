"""Decode (tg128) and prompt (pp512) speed of the model families on synthetic models of real shapes:
llamatui against llama.cpp (llama-cpp-python, when installed) on the same files in the same run.

    python benchmarks/bench_archs.py [-t 2] [-r 3] [--rounds 2] [--cpu] [--llama-bench PATH]
                                     [--models qwen2.5-0.5b qwen3-30b-a3b-6l] [--cache DIR]

llama.cpp is llama.cpp's own llama-bench when one is found (--llama-bench, $LLAMA_BENCH or on
PATH; wall-clock figures only), else llama-cpp-python's build of it.

- qwen2.5-0.5b: Qwen2.5-0.5B's shape (24 layers, 896 wide, 14 query / 2 KV heads of 64, FFN
  4864, 151,936 tokens, output tied to the embeddings, Q/K/V biases).
- qwen3-30b-a3b-6l: Qwen3-30B-A3B's layers (2048 wide, 32 / 4 heads of 128 with Q/K norms, 128
  experts of 768 of which 8 are chosen, 151,936 tokens), 6 of its 48.
- llama3.2-1b-iq2_xxs: Llama-3.2-1B's shape in llama-quantize's IQ2_XXS mix (the i-quants'
  decode and prompt kernels; an importance matrix of ones).
- mistral3-3b: Ministral 3 3B's shape (mistral3: YaRN with attention temperature scaling).
- gpt-oss-20b-6l: gpt-oss-20b's layers (sinks, alternating 128-token windows, 32 experts with
  biases), 6 of its 24, in llama-quantize's MXFP4_MOE mix (experts MXFP4, the rest Q8_0).
- gemma4-e2b: Gemma 4 E2B's shape (per-layer embeddings, 20 of 35 layers on shared KV).
- qwen3.5-0.8b: Qwen3.5-0.8B's shape (18 Gated DeltaNet and 6 gated attention layers).

The others in llama-quantize's Q4_K_M mix (quantizer.model.plan_tensor_types: Q6_K for the output,
and for attn_v and ffn_down on the "more bits" layers; rows of 896 are not whole 256-value
blocks, so there Q4_K falls back to Q5_0 and Q6_K to Q8_0, as in the real 0.5B file). The
weights are seeded random values; to write the files in seconds rather than many minutes, a
tensor of more than POOL_ROWS rows repeats a pool of POOL_ROWS quantized rows, and layers share
their pools (the kernels read every byte of every tensor all the same: the speed is that of
distinct weights). The files are written once into the cache folder (default
~/.cache/llamatui/bench-models; never the repository) and reused.

Targets: dense tg128 ≥ 1.0x and pp512 ≥ 1.5x llama.cpp; MoE tg128 ≥ 0.8x. Ratios are
llamatui / llama.cpp: above 1 means llamatui is faster. The two runtimes take turns over a few
rounds and each one's best round is compared, the round least disturbed when the cores are
shared; run it when the machine is quiet all the same (the load average is printed). With
--cpu both run one thread and the figures are tokens per CPU-second, which time-slicing by other
processes hardly changes: what each runtime costs per core, when wall figures are too noisy.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import platformdirs

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

import bandwidth  # noqa: E402
from compare import (DEFAULT_LLAMA_BENCH, LLAMA_CPP_PROBE, llama_bench, ours,  # noqa: E402
                     peer)
from synthetic_models import tokenizer_metadata, typed  # noqa: E402

from llamatui.inference.catalog import MIXES_BY_NAME  # noqa: E402
from llamatui.inference.gguf import GGUFFile, GGUFValueType, GGUFWriter  # noqa: E402
from llamatui.quantizer.model import ModelFacts, TensorSpec, plan_tensor_types  # noqa: E402
from llamatui.inference.quants import quantize  # noqa: E402

N_VOCAB = 151936
POOL_ROWS = 16384
DEFAULT_CACHE = pathlib.Path(platformdirs.user_cache_dir("llamatui")) / "bench-models"
DENSE = {"tg128": 1.0, "pp512": 1.5}
# big models decode at the memory's speed: llamatui's decode should read its weights at >= 85%
# of the bandwidth probe's figure (issue 29)
BIG = {"tg128": 1.0, "pp512": 2.0, "bandwidth": 0.85}
TARGETS = {"qwen2.5-0.5b": DENSE, "qwen3-30b-a3b-6l": {"tg128": 0.8},
           "llama3.2-1b-iq2_xxs": DENSE, "mistral3-3b": DENSE, "gpt-oss-20b-6l": DENSE,
           "gemma4-e2b": DENSE, "qwen3.5-0.8b": DENSE, "qwen2.5-1.5b": DENSE,
           "qwen2.5-3b": BIG, "llama3.1-8b": BIG}


def qwen25_05b() -> tuple[str, dict, list[TensorSpec]]:
    n_layer, e, n_ff, n_head, n_kv, d = 24, 896, 4864, 14, 2, 64
    md = {"context_length": 32768, "embedding_length": e, "block_count": n_layer,
          "feed_forward_length": n_ff, "attention.head_count": n_head,
          "attention.head_count_kv": n_kv, "rope.freq_base": 1e6,
          "attention.layer_norm_rms_epsilon": 1e-6}
    t = [("token_embd.weight", (N_VOCAB, e)), ("output_norm.weight", (e,))]
    for il in range(n_layer):
        p = f"blk.{il}."
        t += [(p + "attn_norm.weight", (e,)), (p + "attn_q.weight", (n_head * d, e)),
              (p + "attn_q.bias", (n_head * d,)), (p + "attn_k.weight", (n_kv * d, e)),
              (p + "attn_k.bias", (n_kv * d,)), (p + "attn_v.weight", (n_kv * d, e)),
              (p + "attn_v.bias", (n_kv * d,)), (p + "attn_output.weight", (e, n_head * d)),
              (p + "ffn_norm.weight", (e,)), (p + "ffn_gate.weight", (n_ff, e)),
              (p + "ffn_up.weight", (n_ff, e)), (p + "ffn_down.weight", (e, n_ff))]
    return "qwen2", md, [_spec(name, shape) for name, shape in t]


def qwen25_15b() -> tuple[str, dict, list[TensorSpec]]:
    """Qwen2.5-1.5B's shape (qwen2): 28 layers, 1536 wide, 12 query / 2 KV heads of 128, FFN
    8960, 151,936 tokens, output tied to the embeddings, Q/K/V biases."""
    return _qwen25_shape(n_layer=28, e=1536, n_ff=8960, n_head=12, n_kv=2, d=128)


def qwen25_3b() -> tuple[str, dict, list[TensorSpec]]:
    """Qwen2.5-3B's shape (qwen2): 36 layers, 2048 wide, 16 query / 2 KV heads of 128, FFN
    11008, 151,936 tokens, output tied to the embeddings, Q/K/V biases."""
    return _qwen25_shape(n_layer=36, e=2048, n_ff=11008, n_head=16, n_kv=2, d=128)


def _qwen25_shape(n_layer, e, n_ff, n_head, n_kv, d) -> tuple[str, dict, list[TensorSpec]]:
    md, specs = _llama_shape(n_layer, e, n_ff, n_head, n_kv, d, N_VOCAB, tied=True,
                             qkv_bias=True)
    md.update({"context_length": 32768, "rope.freq_base": 1e6,
               "attention.layer_norm_rms_epsilon": 1e-6})
    return "qwen2", md, specs


def qwen3_30b_a3b(n_layer: int = 6) -> tuple[str, dict, list[TensorSpec]]:
    e, n_head, n_kv, d, n_expert, n_ff_exp = 2048, 32, 4, 128, 128, 768
    md = {"context_length": 40960, "embedding_length": e, "block_count": n_layer,
          "feed_forward_length": 6144, "attention.head_count": n_head,
          "attention.head_count_kv": n_kv, "attention.key_length": d,
          "attention.value_length": d, "rope.freq_base": 1e6,
          "attention.layer_norm_rms_epsilon": 1e-6, "expert_count": n_expert,
          "expert_used_count": 8, "expert_feed_forward_length": n_ff_exp}
    t = [("token_embd.weight", (N_VOCAB, e)), ("output_norm.weight", (e,)),
         ("output.weight", (N_VOCAB, e))]
    for il in range(n_layer):
        p = f"blk.{il}."
        t += [(p + "attn_norm.weight", (e,)), (p + "attn_q.weight", (n_head * d, e)),
              (p + "attn_k.weight", (n_kv * d, e)), (p + "attn_v.weight", (n_kv * d, e)),
              (p + "attn_output.weight", (e, n_head * d)), (p + "attn_q_norm.weight", (d,)),
              (p + "attn_k_norm.weight", (d,)), (p + "ffn_norm.weight", (e,)),
              (p + "ffn_gate_inp.weight", (n_expert, e)),
              (p + "ffn_gate_exps.weight", (n_expert, n_ff_exp, e)),
              (p + "ffn_up_exps.weight", (n_expert, n_ff_exp, e)),
              (p + "ffn_down_exps.weight", (n_expert, e, n_ff_exp))]
    return "qwen3moe", md, [_spec(name, shape) for name, shape in t]


def llama32_1b() -> tuple[str, dict, list[TensorSpec]]:
    """Llama-3.2-1B's shape: 16 layers, 2048 wide, 32 query / 8 KV heads of 64, FFN 8192,
    128,256 tokens, output tied to the embeddings."""
    md, specs = _llama_shape(n_layer=16, e=2048, n_ff=8192, n_head=32, n_kv=8, d=64,
                             n_vocab=128256, tied=True)
    md.update({"context_length": 131072, "rope.freq_base": 500000.0, "rope.dimension_count": 64,
               "attention.layer_norm_rms_epsilon": 1e-5})
    return "llama", md, specs


def llama31_8b() -> tuple[str, dict, list[TensorSpec]]:
    """Llama-3.1-8B's shape: 32 layers, 4096 wide, 32 query / 8 KV heads of 128, FFN 14336,
    128,256 tokens, an output matrix of its own."""
    md, specs = _llama_shape(n_layer=32, e=4096, n_ff=14336, n_head=32, n_kv=8, d=128,
                             n_vocab=128256, tied=False)
    md.update({"context_length": 131072, "rope.freq_base": 500000.0, "rope.dimension_count": 128,
               "attention.layer_norm_rms_epsilon": 1e-5})
    return "llama", md, specs


def ministral3_3b() -> tuple[str, dict, list[TensorSpec]]:
    """Ministral 3 3B's shape (mistral3): 26 layers, 3072 wide, 32 query / 8 KV heads of 128,
    FFN 9216, 131,072 tokens, output tied, YaRN (factor 16 over 16,384 positions) with
    attention temperature scaling."""
    md, specs = _llama_shape(n_layer=26, e=3072, n_ff=9216, n_head=32, n_kv=8, d=128,
                             n_vocab=131072, tied=True)
    md.update({"context_length": 262144, "rope.freq_base": 1e6, "rope.dimension_count": 128,
               "attention.key_length": 128, "attention.value_length": 128,
               "attention.layer_norm_rms_epsilon": 1e-5, "rope.scaling.type": "yarn",
               "rope.scaling.factor": 16.0, "rope.scaling.original_context_length": 16384,
               "rope.scaling.yarn_beta_fast": 32.0, "rope.scaling.yarn_beta_slow": 1.0,
               "attention.temperature_scale": 0.1})
    return "mistral3", md, specs


def gpt_oss_20b(n_layer: int = 6) -> tuple[str, dict, list[TensorSpec]]:
    """gpt-oss-20b's layers (gpt-oss): 2880 wide, 64 query / 8 KV heads of 64 with biases and
    attention sinks, every other layer a 128-token window, 32 experts of 2880 (4 chosen) with
    biases, 201,088 tokens, YaRN factor 32 over 4096; n_layer of its 24."""
    e, n_head, n_kv, d, n_expert, n_ff = 2880, 64, 8, 64, 32, 2880
    md = {"context_length": 131072, "embedding_length": e, "block_count": n_layer,
          "feed_forward_length": n_ff, "attention.head_count": n_head,
          "attention.head_count_kv": n_kv, "attention.key_length": d,
          "attention.value_length": d, "rope.freq_base": 150000.0,
          "attention.layer_norm_rms_epsilon": 1e-5, "attention.sliding_window": 128,
          "expert_count": n_expert, "expert_used_count": 4, "expert_feed_forward_length": n_ff,
          "rope.scaling.type": "yarn", "rope.scaling.factor": 32.0,
          "rope.scaling.original_context_length": 4096}
    n_vocab = 201088
    t = [("token_embd.weight", (n_vocab, e)), ("output_norm.weight", (e,)),
         ("output.weight", (n_vocab, e))]
    for il in range(n_layer):
        p = f"blk.{il}."
        t += [(p + "attn_norm.weight", (e,)), (p + "post_attention_norm.weight", (e,)),
              (p + "attn_q.weight", (n_head * d, e)), (p + "attn_q.bias", (n_head * d,)),
              (p + "attn_k.weight", (n_kv * d, e)), (p + "attn_k.bias", (n_kv * d,)),
              (p + "attn_v.weight", (n_kv * d, e)), (p + "attn_v.bias", (n_kv * d,)),
              (p + "attn_output.weight", (e, n_head * d)), (p + "attn_output.bias", (e,)),
              (p + "attn_sinks.weight", (n_head,)),
              (p + "ffn_gate_inp.weight", (n_expert, e)), (p + "ffn_gate_inp.bias", (n_expert,)),
              (p + "ffn_gate_exps.weight", (n_expert, n_ff, e)),
              (p + "ffn_gate_exps.bias", (n_expert, n_ff)),
              (p + "ffn_up_exps.weight", (n_expert, n_ff, e)),
              (p + "ffn_up_exps.bias", (n_expert, n_ff)),
              (p + "ffn_down_exps.weight", (n_expert, e, n_ff)),
              (p + "ffn_down_exps.bias", (n_expert, e))]
    return "gpt-oss", md, [_spec(name, shape) for name, shape in t]


def gemma4_e2b() -> tuple[str, dict, list[TensorSpec]]:
    """Gemma 4 E2B's shape (gemma4): 35 layers, 1536 wide, 8 query / 1 KV head, sliding
    layers' heads of 256 (window 512) and every fifth layer global with heads of 512; the last
    20 layers reuse earlier layers' KV and have a double-wide FFN (12,288 against 6,144);
    per-layer token embeddings of 256 per layer; 262,144 tokens, output tied, soft-cap 30."""
    n_layer, e, n_head, n_shared, n_pe, n_vocab = 35, 1536, 8, 20, 256, 262144
    swa = [(il + 1) % 5 != 0 for il in range(n_layer)]
    n_ff = [6144 if il < n_layer - n_shared else 12288 for il in range(n_layer)]
    md = {"context_length": 131072, "embedding_length": e, "block_count": n_layer,
          "feed_forward_length": n_ff, "attention.head_count": n_head,
          "attention.head_count_kv": 1, "attention.key_length": 512,
          "attention.value_length": 512, "attention.key_length_swa": 256,
          "attention.value_length_swa": 256, "rope.freq_base": 1e6,
          "rope.freq_base_swa": 10000.0, "rope.dimension_count": 512,
          "rope.dimension_count_swa": 256, "attention.layer_norm_rms_epsilon": 1e-6,
          "attention.sliding_window": 512, "attention.sliding_window_pattern": swa,
          "embedding_length_per_layer_input": n_pe, "attention.shared_kv_layers": n_shared,
          "final_logit_softcapping": 30.0}
    t = [("token_embd.weight", (n_vocab, e)), ("output_norm.weight", (e,)),
         ("per_layer_token_embd.weight", (n_vocab, n_pe * n_layer)),
         ("per_layer_model_proj.weight", (n_pe * n_layer, e)),
         ("per_layer_proj_norm.weight", (n_pe,)), ("rope_freqs.weight", (256,))]
    for il in range(n_layer):
        p, d = f"blk.{il}.", 256 if swa[il] else 512
        t += [(p + "attn_norm.weight", (e,)), (p + "attn_q.weight", (n_head * d, e)),
              (p + "attn_q_norm.weight", (d,)), (p + "attn_output.weight", (e, n_head * d)),
              (p + "post_attention_norm.weight", (e,)), (p + "ffn_norm.weight", (e,)),
              (p + "ffn_gate.weight", (n_ff[il], e)), (p + "ffn_up.weight", (n_ff[il], e)),
              (p + "ffn_down.weight", (e, n_ff[il])), (p + "post_ffw_norm.weight", (e,)),
              (p + "inp_gate.weight", (n_pe, e)), (p + "proj.weight", (e, n_pe)),
              (p + "post_norm.weight", (e,)), (p + "layer_output_scale.weight", (1,))]
        if il < n_layer - n_shared:
            t += [(p + "attn_k.weight", (d, e)), (p + "attn_k_norm.weight", (d,)),
                  (p + "attn_v.weight", (d, e))]
    return "gemma4", md, [_spec(name, shape) for name, shape in t]


def qwen35_08b() -> tuple[str, dict, list[TensorSpec]]:
    """Qwen3.5-0.8B's shape (qwen35): 24 layers, 1024 wide, three Gated DeltaNet layers (16
    key and 16 value heads of 128, convolution of 4) then one gated attention layer (8 query /
    2 KV heads of 256, RoPE over a quarter of each head), FFN 3584, 248,320 tokens, output
    tied."""
    n_layer, e, n_ff, n_head, n_kv, d, n_vocab = 24, 1024, 3584, 8, 2, 256, 248320
    ssm = {"conv_kernel": 4, "state_size": 128, "group_count": 16, "time_step_rank": 16,
           "inner_size": 2048}
    md = {"context_length": 262144, "embedding_length": e, "block_count": n_layer,
          "feed_forward_length": n_ff, "attention.head_count": n_head,
          "attention.head_count_kv": n_kv, "attention.key_length": d,
          "attention.value_length": d, "rope.freq_base": 1e7, "rope.dimension_count": 64,
          "rope.dimension_sections": [11, 11, 10, 0], "full_attention_interval": 4,
          "attention.layer_norm_rms_epsilon": 1e-6, **{f"ssm.{k}": v for k, v in ssm.items()}}
    s, n_k, n_v = ssm["state_size"], ssm["group_count"], ssm["time_step_rank"]
    conv_dim = 2 * n_k * s + n_v * s
    t = [("token_embd.weight", (n_vocab, e)), ("output_norm.weight", (e,))]
    for il in range(n_layer):
        p = f"blk.{il}."
        t += [(p + "attn_norm.weight", (e,)), (p + "post_attention_norm.weight", (e,)),
              (p + "ffn_gate.weight", (n_ff, e)), (p + "ffn_up.weight", (n_ff, e)),
              (p + "ffn_down.weight", (e, n_ff))]
        if (il + 1) % 4 == 0:
            t += [(p + "attn_q.weight", (2 * n_head * d, e)), (p + "attn_k.weight", (n_kv * d, e)),
                  (p + "attn_v.weight", (n_kv * d, e)), (p + "attn_output.weight", (e, n_head * d)),
                  (p + "attn_q_norm.weight", (d,)), (p + "attn_k_norm.weight", (d,))]
        else:
            t += [(p + "attn_qkv.weight", (conv_dim, e)), (p + "attn_gate.weight", (n_v * s, e)),
                  (p + "ssm_conv1d.weight", (conv_dim, ssm["conv_kernel"])),
                  (p + "ssm_dt.bias", (n_v,)), (p + "ssm_a", (n_v,)),
                  (p + "ssm_beta.weight", (n_v, e)), (p + "ssm_alpha.weight", (n_v, e)),
                  (p + "ssm_norm.weight", (s,)), (p + "ssm_out.weight", (e, n_v * s))]
    return "qwen35", md, [_spec(name, shape) for name, shape in t]


def _llama_shape(n_layer, e, n_ff, n_head, n_kv, d, n_vocab, tied, qkv_bias=False):
    md = {"embedding_length": e, "block_count": n_layer, "feed_forward_length": n_ff,
          "attention.head_count": n_head, "attention.head_count_kv": n_kv}
    t = [("token_embd.weight", (n_vocab, e)), ("output_norm.weight", (e,))]
    if not tied:
        t.append(("output.weight", (n_vocab, e)))
    for il in range(n_layer):
        p = f"blk.{il}."
        t += [(p + "attn_norm.weight", (e,)), (p + "attn_q.weight", (n_head * d, e)),
              (p + "attn_k.weight", (n_kv * d, e)), (p + "attn_v.weight", (n_kv * d, e)),
              (p + "attn_output.weight", (e, n_head * d)), (p + "ffn_norm.weight", (e,)),
              (p + "ffn_gate.weight", (n_ff, e)), (p + "ffn_up.weight", (n_ff, e)),
              (p + "ffn_down.weight", (e, n_ff))]
        if qkv_bias:
            t += [(p + "attn_q.bias", (n_head * d,)), (p + "attn_k.bias", (n_kv * d,)),
                  (p + "attn_v.bias", (n_kv * d,))]
    return md, [_spec(name, shape) for name, shape in t]


# name: (shape, llama-quantize mix)
MODELS = {"qwen2.5-0.5b": (qwen25_05b, "Q4_K_M"), "qwen3-30b-a3b-6l": (qwen3_30b_a3b, "Q4_K_M"),
          "llama3.2-1b-iq2_xxs": (llama32_1b, "IQ2_XXS"), "mistral3-3b": (ministral3_3b, "Q4_K_M"),
          "gpt-oss-20b-6l": (gpt_oss_20b, "MXFP4"), "gemma4-e2b": (gemma4_e2b, "Q4_K_M"),
          "qwen3.5-0.8b": (qwen35_08b, "Q4_K_M"), "qwen2.5-1.5b": (qwen25_15b, "Q4_K_M"),
          "qwen2.5-3b": (qwen25_3b, "Q4_K_M"), "llama3.1-8b": (llama31_8b, "Q4_K_M")}


def _spec(name: str, shape: tuple[int, ...]) -> TensorSpec:
    # as a converter writes them: vectors, biases and the router F32, matrices F16
    f32 = len(shape) == 1 or name.endswith((".bias", "ffn_gate_inp.weight", "ssm_conv1d.weight"))
    return TensorSpec(name, "F32" if f32 else "F16", shape)


def _values(rng, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """float32 values of the right scale: norms near 1, small biases, matrices ~ N(0, 1/n_in)
    (embeddings ~ N(0, 1))."""
    if name.endswith("ssm_a"):  # decays: exp(softplus(.) * ssm_a) < 1
        return (-np.exp(rng.uniform(-3.0, 0.0, shape))).astype(np.float32)
    if len(shape) == 1 or name.endswith(".bias"):
        base = 0.0 if name.endswith((".bias", "attn_sinks.weight")) else 1.0
        return (base + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    scale = 1.0 if name == "token_embd.weight" else 1.0 / np.sqrt(shape[-1])
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale))


def _encode(type_name: str, values: np.ndarray) -> np.ndarray:
    rows = values.reshape(-1, values.shape[-1])
    if type_name == "F32":
        return rows.view(np.uint8)
    if type_name == "F16":
        return rows.astype(np.float16).view(np.uint8)
    # every column equally important: the i-quants' searches need some importance matrix
    imatrix = np.ones(rows.shape[1], np.float32) if type_name.startswith("IQ") else None
    return np.asarray(quantize(type_name, rows, imatrix)).view(np.uint8).reshape(rows.shape[0],
                                                                                 -1)


def write_model(name: str, path: pathlib.Path) -> None:
    shape, mix = MODELS[name]
    arch, md, specs = shape()
    n_vocab = next(s.shape[0] for s in specs if s.name == "token_embd.weight")
    plans = plan_tensor_types(specs, ModelFacts.from_metadata(
        {"general.architecture": arch, **{f"{arch}.{k}": v for k, v in md.items()}}), mix,
        has_imatrix=True)
    w = GGUFWriter(path)
    w.add("general.architecture", arch)
    w.add("general.name", f"synthetic {name} {mix}")
    w.add("general.file_type", MIXES_BY_NAME[mix].file_type, GGUFValueType.UINT32)
    for key, value, vtype in tokenizer_metadata(n_vocab):
        w.add(key, value, vtype)
    for key, value in md.items():
        w.add(f"{arch}.{key}", value, typed(value))
    for p in plans:
        w.add_tensor_info(p.name, p.dst_type, p.shape)
    by_name = {p.name: p for p in plans}
    pools: dict = {}
    rng = np.random.default_rng(0)

    def source(tensor_name: str):
        p = by_name[tensor_name]
        n_rows = int(np.prod(p.shape[:-1], dtype=np.int64))
        if n_rows <= POOL_ROWS and len(p.shape) <= 2:
            return _encode(p.dst_type, _values(rng, tensor_name, p.shape))
        key = (p.dst_type, p.shape[-1], tensor_name == "token_embd.weight")
        if key not in pools:
            pools[key] = _encode(p.dst_type, _values(rng, tensor_name, (POOL_ROWS, p.shape[-1])))
        pool = pools[key]
        return (pool[:min(POOL_ROWS, n_rows - r0)] for r0 in range(0, n_rows, POOL_ROWS))

    w.write(tensor_source=source)


def cached_model(name: str, cache: pathlib.Path) -> pathlib.Path:
    path = cache / f"{name}-{MODELS[name][1]}.gguf"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        print(f"writing {path} ...", flush=True)
        write_model(name, path)  # GGUFWriter writes a partial file and renames it at the end
    return path


# --cpu: tokens per CPU-second on one thread, which other processes on shared cores disturb far
# less than wall time (no thread of ours waits for a descheduled sibling; llama.cpp's one
# thread never spins at a barrier). Each probe prints {"pp512": t/s, "tg128": t/s}.
CPU_TIMING = r"""
fill(ids[:512])  # warm-up: every kernel loaded (or compiled) before the clock starts
reset()
fill(ids[:4])
step(ids[4], 4)
step(ids[5], 5)
reset()
c0 = time.process_time(); fill(ids[:512]); pp = time.process_time() - c0
reset()
fill(ids[:4])
c0 = time.process_time()
for i, t in enumerate(ids[4:132]):
    step(t, 4 + i)
tg = time.process_time() - c0
print(json.dumps({"pp512": 512 / pp, "tg128": 128 / tg}))
"""
OURS_CPU_PROBE = r"""
import json, sys, time, numba, numpy as np
numba.set_num_threads(1)
from llamatui.inference import LoadConfig
from llamatui.inference.model import Batch, Model
model = Model.load(sys.argv[1], LoadConfig(n_ctx=1024))
ids = np.random.default_rng(0).integers(0, model.n_vocab, 512).tolist()
reset = model.kv.clear
def fill(tokens):
    model.decode(Batch(tokens, pos=0))
def step(token, pos):
    model.decode(Batch([token], pos=pos))
""" + CPU_TIMING
LLAMA_CPP_CPU_PROBE = r"""
import json, sys, time, numpy as np
from llama_cpp import Llama
llm = Llama(sys.argv[1], n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=1,
            n_threads_batch=1, verbose=False)
ids = np.random.default_rng(0).integers(0, llm.n_vocab(), 512).tolist()
reset = llm.reset
def fill(tokens):
    llm.eval(tokens)
def step(token, pos):
    llm.eval([token])
""" + CPU_TIMING


def cpu_probe(probe: str, module: str, path: pathlib.Path):
    if subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode:
        return None, f"{module} not installed"
    proc = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True,
                          text=True)
    if proc.returncode:
        return None, proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"
    return json.loads(proc.stdout.strip().splitlines()[-1]), None


def measure(path: pathlib.Path, threads: int, reps: int, rounds: int, cpu: bool = False,
            bench_binary: str | None = None):
    """Rounds of llamatui and llama.cpp in turn (who goes first alternates), each round `reps`
    repetitions of each test: on shared cores the round least disturbed shows each runtime's
    speed best. Returns ({test: [t/s of each round]} for llamatui, the same for llama.cpp or
    None, why not)."""
    mine, theirs, why = {"pp512": [], "tg128": []}, {"pp512": [], "tg128": []}, None
    for r in range(rounds):
        order = ("ours", "peer") if r % 2 == 0 else ("peer", "ours")
        for who in order:
            if who == "ours":
                res, failed = cpu_probe(OURS_CPU_PROBE, "llamatui", path) if cpu else \
                    (ours(path, threads, reps), None)
                if failed:
                    raise SystemExit(f"llamatui failed on {path}: {failed}")
                for test in mine:
                    mine[test].append(res[test])
            elif why is None:
                if cpu:
                    res, why = cpu_probe(LLAMA_CPP_CPU_PROBE, "llama_cpp", path)
                elif bench_binary:
                    res, why = llama_bench(bench_binary, path, threads, reps)
                else:
                    res, why = peer(LLAMA_CPP_PROBE, "llama_cpp", path, threads, reps)
                for test in theirs:
                    if res is not None:
                        theirs[test].append(res[test])
    return mine, (theirs if why is None else None), why


def decode_bytes(path: pathlib.Path) -> int:
    """The weight bytes one decode step reads, summed over the file's tensors (their sizes on
    disk): every tensor whole, except that of a token-embedding table (token_embd, Gemma's
    per_layer_token_embd) only the token's row is read, and of an MoE layer's expert tensors
    only the chosen experts' share (expert_used_count of expert_count). With the output tied to
    the embeddings, token_embd is read whole as the output matrix: counted once, whole. The KV
    cache that tg128 reads beside them is left out (a few MiB at most)."""
    with GGUFFile.open(path) as f:
        md, arch = f.metadata, f.architecture
        used = (md.get(f"{arch}.expert_used_count", 1), md.get(f"{arch}.expert_count", 1))
        tied = "output.weight" not in f.tensors
        return sum(_bytes_per_token(t, tied, *used) for t in f.tensors.values())


def _bytes_per_token(t, tied: bool, n_used: int, n_expert: int) -> int:
    if t.name == "token_embd.weight" and tied:
        return t.nbytes
    if t.name.endswith("token_embd.weight"):
        return t.nbytes // t.shape[0]
    if "_exps." in t.name:
        return t.nbytes * n_used // n_expert
    return t.nbytes


def _verdict(value: float, target: float | None, shown: str) -> str:
    if target is None:
        return ""
    return f" (target ≥ {shown}: {'met' if value >= target else 'MISSED'})"


def print_table(mine: dict, theirs: dict | None, why: str | None) -> None:
    print(f"| {'runtime':10s} | {'pp512 t/s':>10s} | {'tg128 t/s':>10s} | rounds (pp; tg)")
    print(f"|{'-' * 12}|{'-' * 11}:|{'-' * 11}:|{'-' * 16}")
    for label, res in (("llamatui", mine), ("llama.cpp", theirs)):
        if res is None:
            print(f"| {label:10s} | {'—':>10s} | {'—':>10s} |  ({why})")
            continue
        rounds = "; ".join(" ".join(f"{v:.1f}" for v in res[t]) for t in ("pp512", "tg128"))
        print(f"| {label:10s} | {max(res['pp512']):10.1f} | {max(res['tg128']):10.1f} | "
              f"{rounds}")


def print_ratios(name: str, mine: dict, theirs: dict) -> None:
    for test in ("pp512", "tg128"):
        ratio = max(mine[test]) / max(theirs[test])
        target = TARGETS[name].get(test)
        shown = "" if target is None else f"{target:.1f}x"
        print(f"{test}: llamatui / llama.cpp = {ratio:.2f}x{_verdict(ratio, target, shown)}")


def print_bandwidth(name: str, path: pathlib.Path, mine: dict, theirs: dict | None,
                    probe_gbs: float) -> None:
    """Decode's weight reads per second (bytes per token times tg128's best tokens/s), for each
    runtime, and as a share of the bandwidth probe's figure."""
    per_token = decode_bytes(path)
    shares, parts = {}, []
    for label, res in (("llamatui", mine), ("llama.cpp", theirs)):
        if res is not None:
            gbs = per_token * max(res["tg128"]) / 1e9
            shares[label] = gbs / probe_gbs
            parts.append(f"{label} {gbs:.1f} GB/s = {shares[label]:.0%}")
    target = TARGETS[name].get("bandwidth")
    shown = "" if target is None else f"{target:.0%} for llamatui"
    print(f"decode bandwidth ({per_token / 1e9:.2f} GB of weights per token; % of the probe's "
          f"{probe_gbs:.1f} GB/s): {', '.join(parts)}"
          f"{_verdict(shares['llamatui'], target, shown)}")


def _load_average() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2,
                    help="rounds of both runtimes in turn; the best round of each is compared")
    ap.add_argument("--cpu", action="store_true",
                    help="tokens per CPU-second on one thread instead of wall-clock speed")
    ap.add_argument("--llama-bench", default=DEFAULT_LLAMA_BENCH,
                    help="llama.cpp's llama-bench binary (wall-clock mode; default: $LLAMA_BENCH "
                         "or llama-bench on PATH; none: llama-cpp-python)")
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--cache", type=pathlib.Path, default=DEFAULT_CACHE)
    return ap.parse_args()


def main():
    args = parse_args()
    threads = 1 if args.cpu else args.threads
    probe_gbs = bandwidth.probe(threads)
    print(f"# memory read bandwidth (benchmarks/bandwidth.py, {threads} thread(s)): "
          f"{probe_gbs:.1f} GB/s", flush=True)
    for name in args.models:
        path = cached_model(name, args.cache)
        bench_binary = None if args.cpu else args.llama_bench
        how = "1 thread, tokens per CPU-second" if args.cpu else \
            f"-t {args.threads}, {args.repetitions} repetitions"
        print(f"\n## {name}: {path.name}, {path.stat().st_size / 2**20:.0f} MiB "
              f"({how}, {args.rounds} rounds; load average {_load_average()}; "
              f"llama.cpp: {bench_binary or 'llama-cpp-python'})", flush=True)
        mine, theirs, why = measure(path, args.threads, args.repetitions, args.rounds, args.cpu,
                                    bench_binary)
        print_table(mine, theirs, why)
        if theirs is not None:
            print_ratios(name, mine, theirs)
        print_bandwidth(name, path, mine, theirs, probe_gbs)
        print(f"load average after: {_load_average()}", flush=True)


if __name__ == "__main__":
    main()
