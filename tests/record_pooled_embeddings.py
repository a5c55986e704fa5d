"""Records llama.cpp's pooled embeddings of a decoder model (the SmolLM2 starter) into
tests/golden/llama_cpp_smollm2_embeddings.json: what `llama-embedding --pooling mean|cls|last`
and llama-server's /embedding compute. Run by hand where llama-cpp-python is installed (its
llama.cpp is the reference), never by the test suite:

    python tests/record_pooled_embeddings.py [MODEL.gguf]     # default: the test store's copy

For each pooling it loads the model with embeddings on (f16 KV cache, causal attention as the
model has it, 2 threads), embeds each of TEXTS on its own, and keeps llama.cpp's token ids of each
text and the pooled vectors, L2-normalized and rounded to 6 decimals (the tests compare
directions), plus the model file's sha256.
"""
from __future__ import annotations

import hashlib
import json
import pathlib
import sys

import numpy as np

GOLDEN = pathlib.Path(__file__).resolve().parent / "golden" / "llama_cpp_smollm2_embeddings.json"
TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings map texts to vectors, so that similar texts land close together.",
    "Café, naïve façade — 東京 and Zürich!",
]
POOLINGS = {"mean": 1, "cls": 2, "last": 3}  # llama_pooling_type


def default_model() -> pathlib.Path:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    from conftest import test_store
    from llamatui.models.store import pull_starter
    return pull_starter("smollm2-135m", store=test_store())


def main(argv: list[str]) -> None:
    import llama_cpp
    from llama_cpp import Llama
    path = pathlib.Path(argv[0]) if argv else default_model()
    out = {"llama_cpp_python": llama_cpp.__version__, "model": path.name,
           "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "texts": TEXTS,
           "pooling": {}}
    for name, pooling_type in POOLINGS.items():
        llm = Llama(model_path=str(path), embedding=True, pooling_type=pooling_type, n_ctx=512,
                    n_batch=512, n_ubatch=512, n_threads=2, verbose=False)
        out["tokens"] = [llm.tokenize(t.encode()) for t in TEXTS]
        vectors = np.array([llm.embed(t) for t in TEXTS], dtype=np.float64)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        out["pooling"][name] = [[round(float(v), 6) for v in row] for row in vectors]
        print(f"{name}: recorded", flush=True)
        llm.close()
    GOLDEN.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
