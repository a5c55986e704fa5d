"""`qwen2moe`: Qwen 1.5 MoE and Qwen 2 MoE (llama.cpp's src/models/qwen2moe.cpp).

    per layer:  h = x + wo · attn(...)                      (Qwen 2's attention, Q/K/V biases)
                x = h + moe(norm(h)) + sigmoid(shexp_gate · norm(h)) · shared_ffn(norm(h))

moe: softmax router, the top expert_used_count experts weighted by their probabilities as they
are (not normalised), each a SwiGLU FFN of expert_feed_forward_length (archs/moe.py); the shared
expert is a SwiGLU FFN of expert_shared_feed_forward_length. RoPE NEOX.
"""
from .moe import MoETransformer


class Qwen2MoE(MoETransformer):
    name = "qwen2moe"
    shared_expert = True


ARCH = Qwen2MoE()
