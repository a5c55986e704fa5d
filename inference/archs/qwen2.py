"""`qwen2`: Qwen 2 and Qwen 2.5 (llama.cpp's src/models/qwen2.cpp).

    x = token_embd[tokens]
    per layer:  q, k, v = wq · norm(x) + bq, wk · norm(x) + bk, wv · norm(x) + bv
                h = x + wo · attn(rope(q), rope(k), v)
                x = h + down(silu(gate · norm(h)) * (up · norm(h)))
    logits = output · norm(x)          (tied to token_embd when output.weight is absent)

The shared decoder block (archs/base.py) with its Q/K/V biases; RoPE NEOX (the catalog's).
"""
from .base import Transformer


class Qwen2(Transformer):
    name = "qwen2"


ARCH = Qwen2()
