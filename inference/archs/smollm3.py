"""`smollm3`: SmolLM3 (llama.cpp's src/models/smollm3.cpp).

Llama's block (archs/llama.py) but every fourth layer (il = 3, 7, 11, ...: llama.cpp's
n_no_rope_layer_step = 4, fixed for the family, not read from the file) attends without RoPE
("NoPE" layers): its Q and K carry no position, so a context shift leaves its cached K as it is.
"""
from .base import Transformer

# llama_hparams::n_no_rope_layer_step as llama_model_smollm3 sets it
NO_ROPE_LAYER_STEP = 4


class SmolLM3(Transformer):
    name = "smollm3"

    def layer_rope(self, hp, il, n_ctx):
        if (il + 1) % NO_ROPE_LAYER_STEP == 0:
            return None
        return hp.layer_rope(il, n_ctx)


ARCH = SmolLM3()
