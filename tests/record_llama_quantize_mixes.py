"""Records what llama-quantize writes for the i-quant and ternary mixes on small synthetic models
into tests/golden/llama_quantize_mixes.json. Run by hand against a llama.cpp build, never by the
test suite (tests/test_quantize_mixes.py compares llamatui's quantizer with the record):

    python tests/record_llama_quantize_mixes.py /path/to/llama.cpp/build/bin/llama-quantize

The models (`write_models`) are deterministic: two llama-shaped ones of 8 layers (one with one
query head per KV head and a separate output, one with 4 query heads per KV head, tied
embeddings and rows of 640 that fit no 256-value block), Qwen3-MoE (16 experts) and Qwen2-MoE
(8 experts and a shared expert) from tests/synthetic_models.py. The importance matrix
(`write_imatrix`) is random but deterministic, one row per expert, one expert never routed.

Each case is run in a fresh folder with the file names `in.gguf`, `imatrix.gguf` and `out.gguf`
(the imatrix path is written into the output's metadata), and keeps the output's sha256 and, per
tensor in file order, its type and the sha256 of its bytes (16 hex digits). A mix llama-quantize
refuses without an imatrix is kept as refused.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from synthetic_models import tokenizer_metadata, typed, write_model  # noqa: E402

from llamatui.inference.gguf import GGUFFile, GGUFWriter  # noqa: E402
from llamatui.quantizer.imatrix import Imatrix, ImatrixEntry  # noqa: E402

GOLDEN = pathlib.Path(__file__).resolve().parent / "golden" / "llama_quantize_mixes.json"

MIXES = ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS", "IQ3_S",
         "IQ3_M", "TQ1_0", "TQ2_0")
MODELS = ("llama_gqa1", "llama_gqa4_tied", "qwen3moe", "qwen2moe")


def _llama(path: pathlib.Path, n_head_kv: int, n_ff: int, tied: bool, seed: int) -> None:
    """A llama-shaped F16 model of 8 layers (n/8 = 1, so the first-layers rules show)."""
    n_layer, n_embd, n_head, n_vocab = 8, 256, 8, 512
    head_dim = n_embd // n_head
    rng = np.random.default_rng(seed)
    w = GGUFWriter(path)
    w.add("general.architecture", "llama")
    w.add("general.name", path.stem)
    for key, value, vtype in tokenizer_metadata(n_vocab):
        w.add(key, value, vtype)
    for key, value in {"context_length": 4096, "embedding_length": n_embd,
                       "block_count": n_layer, "feed_forward_length": n_ff,
                       "attention.head_count": n_head, "attention.head_count_kv": n_head_kv,
                       "rope.freq_base": 10000.0, "attention.layer_norm_rms_epsilon": 1e-5,
                       "rope.dimension_count": head_dim}.items():
        w.add(f"llama.{key}", value, typed(value))

    def matrix(name, rows, cols):
        x = rng.standard_normal((rows, cols)).astype(np.float32) * 0.02
        x[:, ::13] *= 6  # a few strong columns, so importance weights matter
        w.add_tensor(name, "F16", x.shape, x.astype(np.float16))

    def norm(name):
        w.add_tensor(name, "F32", (n_embd,), (1 + 0.1 * rng.standard_normal(n_embd))
                     .astype(np.float32))

    matrix("token_embd.weight", n_vocab, n_embd)
    norm("output_norm.weight")
    if not tied:
        matrix("output.weight", n_vocab, n_embd)
    for il in range(n_layer):
        p = f"blk.{il}."
        norm(p + "attn_norm.weight")
        matrix(p + "attn_q.weight", n_embd, n_embd)
        matrix(p + "attn_k.weight", n_head_kv * head_dim, n_embd)
        matrix(p + "attn_v.weight", n_head_kv * head_dim, n_embd)
        matrix(p + "attn_output.weight", n_embd, n_embd)
        norm(p + "ffn_norm.weight")
        matrix(p + "ffn_gate.weight", n_ff, n_embd)
        matrix(p + "ffn_up.weight", n_ff, n_embd)
        matrix(p + "ffn_down.weight", n_embd, n_ff)
    w.write()


def write_models(directory) -> dict[str, pathlib.Path]:
    """The F16 models of MODELS, written into `directory` (deterministic bytes)."""
    directory = pathlib.Path(directory)
    paths = {"llama_gqa1": directory / "llama_gqa1.gguf",
             "llama_gqa4_tied": directory / "llama_gqa4_tied.gguf"}
    _llama(paths["llama_gqa1"], n_head_kv=8, n_ff=512, tied=False, seed=11)
    _llama(paths["llama_gqa4_tied"], n_head_kv=2, n_ff=640, tied=True, seed=12)
    for name in ("qwen3moe", "qwen2moe"):
        paths[name] = write_model(name, "F16", directory)
    return paths


def write_imatrix(model: pathlib.Path, out: pathlib.Path) -> None:
    """A random importance matrix for every block matrix of `model`: per expert one row of sums
    and a count (the last expert never routed: llama-quantize then weighs its columns 1)."""
    rng = np.random.default_rng(5)
    entries = {}
    with GGUFFile.open(model) as g:
        for name, t in sorted(g.tensors.items()):
            if not name.startswith("blk.") or len(t.shape) < 2:
                continue
            n_mat = t.shape[0] if len(t.shape) == 3 else 1
            sums = rng.random((n_mat, t.shape[-1])).astype(np.float32) * 40
            sums[:, ::7] *= 9
            counts = np.full(n_mat, 64)
            if n_mat > 1:
                counts[-1] = 0
            entries[name] = ImatrixEntry(sums, counts)
    Imatrix(entries, ["synthetic.txt"], chunk_count=2, chunk_size=32).save(out)


def digest(path) -> dict:
    """The output's sha256 and, per tensor in file order, [type, sha256 of its bytes[:16]]."""
    with GGUFFile.open(path) as g:
        tensors = {name: [t.type, hashlib.sha256(np.asarray(t.data).tobytes()).hexdigest()[:16]]
                   for name, t in g.tensors.items()}
    return {"sha256": hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest(),
            "tensors": tensors}


def _llama_quantize(tool: str, folder: pathlib.Path, mix: str, imatrix: bool) -> dict:
    cmd = [tool] + (["--imatrix", "imatrix.gguf"] if imatrix else []) + \
        ["in.gguf", "out.gguf", mix, "2"]
    run = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        refusal = "requires an importance matrix" in run.stdout + run.stderr
        if not refusal:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{run.stdout}\n{run.stderr}")
        return {"refused": True}
    result = digest(folder / "out.gguf")
    os.remove(folder / "out.gguf")
    return result


def main(tool: str) -> None:
    golden: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        for model, path in write_models(tmp).items():
            folder = tmp / f"run-{model}"
            folder.mkdir()
            os.replace(path, folder / "in.gguf")
            write_imatrix(folder / "in.gguf", folder / "imatrix.gguf")
            cases = golden.setdefault(model, {})
            for mix in MIXES:
                for imatrix in (True, False):
                    key = f"{mix}{'+imatrix' if imatrix else ''}"
                    cases[key] = _llama_quantize(tool, folder, mix, imatrix)
                    print(model, key, "refused" if cases[key].get("refused") else "ok",
                          flush=True)
    GOLDEN.write_text(json.dumps(golden, indent=1) + "\n")
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
