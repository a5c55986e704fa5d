"""`qwen35moe`: Qwen 3.5 / 3.6 mixture-of-experts models (Qwen3.5-35B-A3B...; llama.cpp's
src/models/qwen35moe.cpp): Qwen 3.5's hybrid layers (archs/qwen35.py: Gated DeltaNet, and gated
attention every full_attention_interval-th layer) with Qwen 3 MoE's experts in place of the
dense FFN — softmax router, the top expert_used_count experts, their weights divided by their
sum — plus a shared expert behind its sigmoid gate (archs/moe.py, as Qwen 2 MoE's).
"""
from .moe import MoETransformer
from .qwen35 import Qwen35


class Qwen35MoE(Qwen35, MoETransformer):
    name = "qwen35moe"
    norm_expert_weights = True  # build_moe_ffn(..., norm_w = true)
    shared_expert = True  # ffn_*_shexp and ffn_gate_inp_shexp are required


ARCH = Qwen35MoE()
