"""`nomic-bert`: nomic-embed-text v1 / v1.5 (llama.cpp's src/models/bert.cpp, the NOMIC_BERT path).

    x = LayerNorm(token_embd[tokens] + token_types[0])
    per layer:  q, k, v = split(wqkv · x);  q, k = rope(q), rope(k)                  (NEOX)
                h = LayerNorm(x + wo · attn(q, k, v))                 (no mask inside a sequence)
                x = LayerNorm(h + down(silu(gate · h) * (up · h)))
    the output is every token's x; embeddings pool it (mean, `nomic-bert.pooling_type`)

BERT's encoder (archs/bert.py) with rotary positions instead of a table of position embeddings
(so no length limit but the context), a fused QKV matrix and a SwiGLU FFN without biases
(llama.cpp ignores any FFN bias a file has for this family, and so do we).
"""
from __future__ import annotations

from .bert import Bert


class NomicBert(Bert):
    name = "nomic-bert"
    absolute_positions = False
    gated_ffn = True

    def rotate(self, ctx, il: int, q, k):
        be, rope = ctx.backend(il), ctx.hp.layer_rope(il)
        return be.rope(q, ctx.positions, rope), be.rope(k, ctx.positions, rope)


ARCH = NomicBert()
