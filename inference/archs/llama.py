"""`llama`: Llama 1/2/3, Mistral, TinyLlama, SmolLM2 (llama.cpp's src/models/llama.cpp).

    x = token_embd[tokens]
    per layer:  h = x + wo · attn(rope(wq · norm(x)), rope(wk · norm(x)), wv · norm(x))
                x = h + down(silu(gate · norm(h)) * (up · norm(h)))
    logits = output · norm(x)          (output tied to token_embd when output.weight is absent)

The shared decoder block as it is (archs/base.py): RoPE NORM (consecutive pairs: the converter
permuted Q/K rows into that order), attention scale 1/sqrt(head_dim), Q/K/V/O biases when the
file has them. RoPE scaling as llama.cpp's llama does it (HParams.layer_rope): linear, Llama
3.1/3.2's rope_freqs (the "llama3" scaling, baked into factors by the converter), YaRN with
llama.cpp's fixed beta_fast 32 / beta_slow 1 and its attention factor (the file's
rope.scaling.yarn_* keys are not read for this family), LongRoPE's long/short factors with
rope.scaling.type longrope. attention.sliding_window is ignored, as llama.cpp ignores it for
this architecture: Mistral-style files attend over the whole context.
"""
from ..hparams import ModelMetadataError
from .base import Transformer


class Llama(Transformer):
    name = "llama"

    def read_hparams(self, meta, hp):
        super().read_hparams(meta, hp)
        if hp.n_expert:
            raise ModelMetadataError("mixture-of-experts llama models (Mixtral) are not supported")


ARCH = Llama()
