"""Records what llama.cpp computes on the synthetic models (tests/synthetic_models.py) into
tests/golden/synthetic_logits.json. Run by hand where llama-cpp-python is installed (`pip install
llama-cpp-python`; its llama.cpp is the reference), never by the test suite:

    python tests/record_synthetic_logits.py               # every case in CASES
    python tests/record_synthetic_logits.py qwen2 phi3    # some cases (the rest are kept)

For each case (a family, or a variant of one) and weight type it writes the model, evaluates
`TOKENS` in one batch with logits for every position (the case's context size, f16 KV cache,
2 threads), and keeps per position llama.cpp's top-2 token ids and their log-probabilities, plus
the model file's sha256 (so a changed recipe is noticed).
"""
from __future__ import annotations

import json
import pathlib
import sys
import tempfile

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from synthetic_models import CASES, TOKENS, TYPES, sha256_of, write_model  # noqa: E402

GOLDEN = pathlib.Path(__file__).resolve().parent / "golden" / "synthetic_logits.json"


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


def record(path: pathlib.Path, n_ctx: int) -> dict:
    from llama_cpp import Llama
    llm = Llama(model_path=str(path), n_ctx=n_ctx, n_batch=256, n_ubatch=256, logits_all=True,
                n_threads=2, verbose=False)
    llm.eval(TOKENS)
    logprobs = log_softmax(np.array(llm.scores[:len(TOKENS)], dtype=np.float32))
    top2 = np.argsort(-logprobs, axis=1)[:, :2]
    rows = [[int(a), float(logprobs[i, a]), int(b), float(logprobs[i, b])]
            for i, (a, b) in enumerate(top2)]
    return {"sha256": sha256_of(path), "top2": rows}


def main(names: list[str]) -> None:
    import llama_cpp
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    golden["llama_cpp_python"] = llama_cpp.__version__
    golden["tokens"] = TOKENS
    models = golden.setdefault("models", {})
    with tempfile.TemporaryDirectory() as tmp:
        for name in names or list(CASES):
            for type_name in TYPES:
                path = write_model(name, type_name, tmp)
                models[f"{name}/{type_name}"] = record(path, CASES[name].n_ctx)
                print(f"{name}/{type_name}: recorded", flush=True)
    GOLDEN.write_text(json.dumps(golden, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
