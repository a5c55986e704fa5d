"""`qwen3moe`: Qwen 3 MoE (Qwen3-30B-A3B, Qwen3-235B-A22B; llama.cpp's src/models/qwen3moe.cpp).

    per layer:  h = x + wo · attn(...)                  (Qwen 3's attention, per-head Q/K norms)
                x = h + moe(norm(h))

moe: softmax router, the top expert_used_count experts, their weights divided by their sum
(expert_weights_norm), each a SwiGLU FFN of expert_feed_forward_length; no shared expert
(archs/moe.py). RoPE NEOX.
"""
from .moe import MoETransformer


class Qwen3MoE(MoETransformer):
    name = "qwen3moe"
    norm_expert_weights = True
    required = MoETransformer.required | {"attn_q_norm.weight", "attn_k_norm.weight"}


ARCH = Qwen3MoE()
