"""`qwen3`: Qwen 3 dense models (llama.cpp's src/models/qwen3.cpp).

    per layer:  q = rope(q_norm(wq · norm(x))), k = rope(k_norm(wk · norm(x))), v = wv · norm(x)
                (q_norm, k_norm: RMS norms of each head, head_dim = attention.key_length)
                h = x + wo · attn(q, k, v)
                x = h + down(silu(gate · norm(h)) * (up · norm(h)))
    logits = output · norm(x)          (tied to token_embd when output.weight is absent)

The shared decoder block (archs/base.py) with its per-head Q/K norms required; RoPE NEOX.
"""
from .base import Transformer


class Qwen3(Transformer):
    name = "qwen3"
    required = Transformer.required | {"attn_q_norm.weight", "attn_k_norm.weight"}


ARCH = Qwen3()
