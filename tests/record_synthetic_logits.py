"""Records what llama.cpp computes on the synthetic models (tests/synthetic_models.py) into
tests/golden/synthetic_logits.json. Run by hand where llama-cpp-python is installed (`pip install
llama-cpp-python`; its llama.cpp is the reference), never by the test suite:

    python tests/record_synthetic_logits.py               # every case in CASES
    python tests/record_synthetic_logits.py qwen2 phi3    # some cases (the rest are kept)

For each case (a family, or a variant of one) and weight type it writes the model, evaluates
`TOKENS` in one batch with logits for every position (the case's context size, f16 KV cache,
2 threads; `TOKENS`, or the case's own `tokens` when it asks for more positions), and keeps
per position llama.cpp's top-2 token ids and their log-probabilities, plus
the model file's sha256 (so a changed recipe is noticed).

Encoders (the catalog's `encoder` families: BERT...) have no logits: for them llama.cpp's
embeddings go into tests/golden/synthetic_embeddings.json instead — each of `EMBED_INPUTS` (token
ids) decoded on its own and pooled as the model's `pooling_type` says, and on F16 models also
`EMBED_TEXTS` through llama.cpp's own tokenizer (its token ids are kept too); every vector
L2-normalized and rounded to 6 decimals (the tests compare directions).
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from synthetic_models import (CASES, EMBED_INPUTS, EMBED_TEXTS, TOKENS, TYPES,  # noqa: E402
                              sha256_of, write_model)

GOLDEN = pathlib.Path(__file__).resolve().parent / "golden" / "synthetic_logits.json"
GOLDEN_EMBEDDINGS = GOLDEN.with_name("synthetic_embeddings.json")


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


def llama_cpp_logits(path: pathlib.Path, n_ctx: int, tokens: list[int]) -> np.ndarray:
    """llama.cpp's logits (len(tokens), n_vocab) of `tokens` decoded in one batch: through the
    program named by LLAMA_LOGITS (tests/llama_logits.c) when set, else llama-cpp-python."""
    tool = os.environ.get("LLAMA_LOGITS")
    if tool:
        with tempfile.TemporaryDirectory() as tmp:
            ids, out = pathlib.Path(tmp, "tokens.bin"), pathlib.Path(tmp, "logits.bin")
            np.asarray(tokens, dtype=np.int32).tofile(ids)
            subprocess.run([tool, str(path), str(n_ctx), "2", str(ids), str(out)], check=True)
            return np.fromfile(out, dtype=np.float32).reshape(len(tokens), -1)
    from llama_cpp import Llama
    llm = Llama(model_path=str(path), n_ctx=n_ctx, n_batch=256, n_ubatch=256, logits_all=True,
                n_threads=2, verbose=False)
    llm.eval(tokens)
    return np.array(llm.scores[:len(tokens)], dtype=np.float32)


def record(path: pathlib.Path, n_ctx: int, tokens: list[int] = TOKENS) -> dict:
    logprobs = log_softmax(llama_cpp_logits(path, n_ctx, tokens))
    top2 = np.argsort(-logprobs, axis=1)[:, :2]
    rows = [[int(a), float(logprobs[i, a]), int(b), float(logprobs[i, b])]
            for i, (a, b) in enumerate(top2)]
    return {"sha256": sha256_of(path), "top2": rows}


def _unit_rows(vectors) -> list[list[float]]:
    x = np.asarray(vectors, dtype=np.float64)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return [[round(float(v), 6) for v in row] for row in x]


def record_embeddings(path: pathlib.Path, with_texts: bool) -> dict:
    """llama.cpp's pooled embeddings of EMBED_INPUTS (and EMBED_TEXTS) on an encoder."""
    import llama_cpp
    from llama_cpp import Llama
    from llamatui.inference.gguf import GGUFFile
    with GGUFFile.open(path) as g:
        md = g.metadata
        pooling = int(md[f"{md['general.architecture']}.pooling_type"])
    llm = Llama(model_path=str(path), embedding=True, pooling_type=pooling, n_ctx=256,
                n_batch=256, n_ubatch=256, n_threads=2, verbose=False)
    n_embd = llm.n_embd()
    vectors = []
    for ids in EMBED_INPUTS:  # token ids straight into a batch of their own, as sequence 0
        llm._ctx.kv_cache_clear()
        llm._batch.reset()
        llm._batch.add_sequence(ids, 0, True)
        llm._ctx.decode(llm._batch)
        vectors.append(llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, 0)[:n_embd])
    out = {"sha256": sha256_of(path), "pooling_type": pooling, "embeddings": _unit_rows(vectors)}
    if with_texts:
        out["text_tokens"] = [llm.tokenize(t.encode()) for t in EMBED_TEXTS]
        out["text_embeddings"] = _unit_rows(llm.embed(EMBED_TEXTS))
    return out


def _load(path: pathlib.Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def main(names: list[str]) -> None:
    from llamatui.inference.catalog import ARCHITECTURES
    golden, golden_embd = _load(GOLDEN), _load(GOLDEN_EMBEDDINGS)
    if not os.environ.get("LLAMA_LOGITS"):
        import llama_cpp
        golden["llama_cpp_python"] = golden_embd["llama_cpp_python"] = llama_cpp.__version__
    golden["tokens"] = TOKENS
    golden_embd["inputs"], golden_embd["texts"] = EMBED_INPUTS, EMBED_TEXTS
    models = golden.setdefault("models", {})
    embd_models = golden_embd.setdefault("models", {})
    with tempfile.TemporaryDirectory() as tmp:
        for name in names or list(CASES):
            for type_name in TYPES:
                path = write_model(name, type_name, tmp)
                key = f"{name}/{type_name}"
                if ARCHITECTURES[CASES[name].arch].encoder:
                    embd_models[key] = record_embeddings(path, type_name == "F16")
                else:
                    models[key] = record(path, CASES[name].n_ctx, CASES[name].tokens)
                print(f"{key}: recorded", flush=True)
    GOLDEN.write_text(json.dumps(golden, indent=1) + "\n")
    GOLDEN_EMBEDDINGS.write_text(json.dumps(golden_embd, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
