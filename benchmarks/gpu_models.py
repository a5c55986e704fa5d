"""The starter models' shapes, for benchmarking where the models themselves cannot go.

The GPU machine reaches no network and receives at most 64 MiB of the working tree, so the
starter models (98 MB and 253 MB) cannot travel to it. Their throughput depends only on their
shapes and weight types, so this module records those (`gpu_model_cards.json`: metadata other
than the vocabulary, every tensor's name, type and shape) and writes stand-ins with the same
shapes, types and metadata, random weights (rows quantized by our quantizer, then tiled), and a
vocabulary of the same size. Speed measured on a stand-in is the starter model's speed; its text
is noise.

    python benchmarks/gpu_models.py record          # here, from the cached starter models
    python benchmarks/gpu_models.py write DIR       # anywhere: DIR/<model>.gguf stand-ins
"""
from __future__ import annotations

import json
import pathlib
import sys

import numpy as np

CARDS = pathlib.Path(__file__).resolve().parent / "gpu_model_cards.json"
STARTERS = {"smollm2-135m": "SmolLM2 135M Q4_1", "gemma3-270m": "Gemma 3 270M Q4_K_M"}
DISTINCT_ROWS = 64  # rows quantized per matrix; the rest repeat them


def record() -> dict:
    """The cards of the starter models in the test store (tests/conftest.py's cache)."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
    from conftest import test_store

    from llamatui.inference.gguf import GGUFFile
    from llamatui.models.store import STARTER_MODELS
    cards = {}
    for name, title in STARTERS.items():
        path = test_store() / STARTER_MODELS[name].filename
        with GGUFFile.open(path) as g:
            md = g.metadata
            scalars = {k: v for k, v in md.items() if not k.startswith("tokenizer.")
                       and isinstance(v, (bool, int, float, str)) and k != "general.name"}
            cards[name] = {
                "title": title, "file": path.name,
                "metadata": scalars,
                "n_vocab": len(md["tokenizer.ggml.tokens"]),
                "bos": int(md.get("tokenizer.ggml.bos_token_id", 1)),
                "eos": int(md.get("tokenizer.ggml.eos_token_id", 2)),
                "tensors": [[n, t.type, list(t.shape)] for n, t in g.tensors.items()]}
    CARDS.write_text(json.dumps(cards, indent=1) + "\n")
    return cards


def _value_type(value):
    from llamatui.inference.gguf import GGUFValueType
    if isinstance(value, bool):
        return GGUFValueType.BOOL
    if isinstance(value, int):
        return GGUFValueType.UINT32 if value >= 0 else GGUFValueType.INT32
    if isinstance(value, float):
        return GGUFValueType.FLOAT32
    return GGUFValueType.STRING


def write_stand_in(name: str, directory) -> pathlib.Path:
    """DIR/<name>-stand-in.gguf: the card's shapes, types and metadata, random weights."""
    from llamatui.inference.gguf import GGUFValueType, GGUFWriter, ValueType
    from llamatui.inference.quants import quantize
    card = json.loads(CARDS.read_text())[name]
    path = pathlib.Path(directory) / f"{name}-stand-in.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_file():
        return path
    rng = np.random.default_rng(0)
    w = GGUFWriter(path)
    w.add("general.name", f"{card['title']} (stand-in)")
    for key, value in card["metadata"].items():
        w.add(key, value, _value_type(value))
    n_vocab = card["n_vocab"]
    strings = ValueType(GGUFValueType.ARRAY, ValueType(GGUFValueType.STRING))
    ints = ValueType(GGUFValueType.ARRAY, ValueType(GGUFValueType.INT32))
    w.add("tokenizer.ggml.model", "gpt2")
    w.add("tokenizer.ggml.pre", "default")
    w.add("tokenizer.ggml.tokens", [f"<t{i}>" for i in range(n_vocab)], strings)
    w.add("tokenizer.ggml.token_type", [1] * n_vocab, ints)
    w.add("tokenizer.ggml.merges", [], strings)
    w.add("tokenizer.ggml.bos_token_id", card["bos"], GGUFValueType.UINT32)
    w.add("tokenizer.ggml.eos_token_id", card["eos"], GGUFValueType.UINT32)
    for tensor_name, type_name, shape in card["tensors"]:
        if len(shape) == 1:
            w.add_tensor(tensor_name, "F32", shape,
                         (1 + 0.1 * rng.standard_normal(shape[0])).astype(np.float32))
            continue
        n_out, n_in = shape
        distinct = min(n_out, DISTINCT_ROWS)
        rows = (rng.standard_normal((distinct, n_in)) / np.sqrt(n_in)).astype(np.float32)
        blocks = quantize(type_name, rows) if type_name != "F32" else rows
        w.add_tensor(tensor_name, type_name, shape, np.resize(blocks, (n_out, blocks.shape[1])))
    w.write()
    return path


if __name__ == "__main__":
    if sys.argv[1:2] == ["record"]:
        print(f"recorded {', '.join(record())} into {CARDS}")
    elif sys.argv[1:2] == ["write"] and len(sys.argv) == 3:
        for model in STARTERS:
            print(write_stand_in(model, sys.argv[2]))
    else:
        sys.exit(__doc__)
