"""`granite`: IBM Granite 3.x dense models (llama.cpp's src/models/granite.cpp).

Llama's block (archs/llama.py) with four multipliers from the file:

    x = token_embd[tokens] * embedding_scale                  (embedding_scale, when set)
    per layer:  h = x + residual_scale · (wo · attn(...))     (residual_scale, when set)
                x = h + residual_scale · ffn(norm(h))
    attention scale = attention.scale (1/sqrt(head_dim) when absent)
    logits = (output · norm(x)) / logit_scale                 (logit_scale, required)

rope.scaling.finetuned = false turns RoPE off in every layer (llama.cpp's rope_pattern).
"""
import numpy as np

from ..hparams import ModelMetadataError
from .base import Transformer


class Granite(Transformer):
    name = "granite"

    def read_hparams(self, meta, hp):
        super().read_hparams(meta, hp)
        if hp.n_expert:
            raise ModelMetadataError("mixture-of-experts granite models are not supported")
        # 0 (or absent) means "no multiplier", as llama.cpp's `if (f_residual_scale)` reads it
        hp.extra["logit_scale"] = meta.float("logit_scale", lo=0.0, hi=1e6, lo_open=True)
        hp.extra["embedding_scale"] = meta.float("embedding_scale", 0.0, lo=0.0, hi=1e6) or 1.0
        hp.extra["residual_scale"] = meta.float("residual_scale", 0.0, lo=0.0, hi=1e6) or 1.0
        hp.attn_scale = meta.float("attention.scale", 0.0, lo=0.0, hi=1e6)
        hp.extra["rope"] = meta.bool("rope.scaling.finetuned", True)

    def layer_rope(self, hp, il, n_ctx):
        return hp.layer_rope(il, n_ctx) if hp.extra["rope"] else None

    def embedding_scale(self, hp):
        return hp.extra["embedding_scale"]

    def add_residual(self, be, x, y, hp):
        scale = hp.extra["residual_scale"]
        return be.add(x, y if scale == 1.0 else be.scale(y, scale))

    def head(self, ctx, w, x):
        inverse = np.float32(1.0) / np.float32(ctx.hp.extra["logit_scale"])  # ggml_scale's
        return super().head(ctx, w, x) * inverse


ARCH = Granite()
