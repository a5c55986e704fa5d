"""A decode step's layers through the CPU's fused block (cpu/fused_block.py), as calls from
Python or as one compiled call per layer: the same logits, bit for bit, as the op-by-op block,
and only for the layers it can compute."""
import numpy as np
import pytest

from llamatui.inference import LoadConfig
from llamatui.inference.cpu import fused_block, matmul
from llamatui.inference.cpu.fused_block import FusedBlock
from llamatui.inference.model import Batch, Model
from synthetic_models import TOKENS, write_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fused-block-models")


def _steps(path, fused: bool, monkeypatch, **config) -> tuple[list[np.ndarray], list]:
    """Logits of a prompt, 24 greedy decode steps and a step of three sequences at once, with
    the fused block on or off; and which layers it took."""
    monkeypatch.setattr(fused_block, "ENABLED", fused)
    model = Model.load(path, LoadConfig(n_ctx=256, n_parallel=3, **config))
    try:
        outs = [model.decode(Batch(TOKENS[:20], pos=0, seq_ids=0))]
        token = TOKENS[19]
        for i in range(24):
            outs.append(model.decode(Batch([token], pos=20 + i, seq_ids=0)))
            token = int(np.argmax(outs[-1][-1]))
        for s in (1, 2):  # two more sequences with a prompt each, then one step of all three
            model.decode(Batch(TOKENS[30 + 5 * s:40 + 5 * s], pos=0, seq_ids=s))
        outs.append(model.decode(Batch([token, 7, 9], pos=[44, 10, 10], seq_ids=[0, 1, 2],
                                       logits=True)))
        return outs, model.weights.extra["fused_blocks"]
    finally:
        model.close()


@pytest.mark.parametrize("name, type_name, cache", [
    ("llama", "Q8_0", "f16"),  # packed products, fused where matmul_many fuses them
    ("llama", "Q4_K", "f32"),  # a float32 cache
    ("llama", "F16", "f16"),  # products the packed kernels do not take: the backend's
    ("qwen2", "Q8_0", "f16"),  # Q, K, V biases
    ("llama-sliding-window", "Q8_0", "f16"),
    ("llama-yarn", "Q4_K", "f16"),
    ("smollm3", "Q8_0", "f16"),  # layers without RoPE
    ("qwen3", "Q4_K", "f16"),  # per-head Q/K norms
    ("gemma3", "Q8_0", "f16"),  # Q/K norms, Q scaled first, post-norms, GeGLU, windows
    ("gemma2", "Q8_0", "f16"),  # attention soft-capping
])
def test_fused_decode_gives_the_op_by_op_logits(name, type_name, cache, model_dir, monkeypatch):
    path = write_model(name, type_name, model_dir)
    config = dict(cache_type_k=cache, cache_type_v=cache)
    fused, blocks = _steps(path, True, monkeypatch, **config)
    plain, _ = _steps(path, False, monkeypatch, **config)
    assert blocks and all(isinstance(b, FusedBlock) for b in blocks)
    # packed matrices (where the CPU has the 8-bit kernels): each layer in one compiled call
    packed = matmul.USE_INT8 and type_name != "F16"
    assert all(bool(b.compiled) == packed for b in blocks)
    for i, (a, b) in enumerate(zip(fused, plain)):
        assert np.array_equal(a, b), f"step {i}: largest difference {np.abs(a - b).max()}"


@pytest.mark.parametrize("name, cache", [
    ("olmo2", "f16"),  # Q/K norms over the whole projection, no pre-norms
    ("granite", "f16"),  # its own residual scaling
    ("phi3", "f16"),  # one fused QKV matrix from the file
    ("qwen2moe", "f16"),  # experts
    ("llama", "q8_0"),  # a quantized cache
])
def test_blocks_the_fused_step_does_not_compute_run_op_by_op(name, cache, model_dir,
                                                             monkeypatch):
    path = write_model(name, "Q8_0", model_dir)
    _, blocks = _steps(path, True, monkeypatch, cache_type_k=cache, cache_type_v=cache)
    assert blocks == [None] * len(blocks)
