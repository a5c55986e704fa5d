"""The KL-divergence check of the newer families against llama.cpp, run by hand (never by the
suite): for each case, its synthetic model (tests/synthetic_models.py) carrying a real
vocabulary, so that both programs tokenize a real text, is scored both ways round:

- `llamatui perplexity --kl-divergence-base BASE` writes our log-probabilities, and
  `llama-perplexity --kl-divergence-base BASE --kl-divergence` reads them;
- `llama-perplexity --kl-divergence-base BASE` writes llama.cpp's, and `llamatui perplexity
  --kl-divergence` reads them.

    LLAMA_PERPLEXITY=/path/to/llama-perplexity python tests/check_family_kld.py [CASE ...]

Each line printed is a case, a weight type and both directions' mean KLD, same-top-token share
and RMS Δp, as llama-perplexity reports them. The vocabularies: the family's own vocab-only GGUF
from llama.cpp's models/ where there is one (qwen35, gemma-4; found beside LLAMA_PERPLEXITY's
checkout, or named by LLAMA_VOCAB_DIR), gpt-oss's o200k_harmony built by tests/o200k_vocab.py,
and for Mistral 3 (whose Tekken vocabulary llama.cpp does not ship) llama-bpe's. The synthetic
embedding and output rows are drawn afresh for the larger vocabulary, at the recipe's scale.
"""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import tempfile

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from synthetic_models import CASES, _seed, write_recipe  # noqa: E402

TEXT = HERE / "golden" / "texts" / "apache-2.0.txt"
N_CTX, N_CHUNKS, THREADS = 256, 4, 2
# case -> the vocabulary its model carries
VOCABS = {
    "qwen35": "ggml-vocab-qwen35.gguf", "qwen35moe": "ggml-vocab-qwen35.gguf",
    "gemma4": "ggml-vocab-gemma-4.gguf", "gemma4-moe": "ggml-vocab-gemma-4.gguf",
    "gpt-oss": "o200k", "gpt-oss-mxfp4": "o200k",
    "mistral3": "ggml-vocab-llama-bpe.gguf", "mistral3-moe": "ggml-vocab-llama-bpe.gguf",
}
VOCAB_ROWS = ("token_embd.weight", "output.weight", "per_layer_token_embd.weight")
TYPES = ("F16", "Q4_K")


def vocab_file(name: str, llama_perplexity: pathlib.Path) -> pathlib.Path:
    if name == "o200k":
        import o200k_vocab
        path = o200k_vocab.build(pathlib.Path.home() / ".cache" / "llamatui" / "test-models"
                                 / "o200k")
        if path is None:
            sys.exit("o200k_harmony: the quicktok-v1 wheel could not be downloaded")
        return path
    folder = os.environ.get("LLAMA_VOCAB_DIR")
    candidates = [pathlib.Path(folder)] if folder else \
        [p / "models" for p in llama_perplexity.resolve().parents]
    for directory in candidates:
        if (directory / name).is_file():
            return directory / name
    sys.exit(f"{name} not found: set LLAMA_VOCAB_DIR to llama.cpp's models/ folder")


def tokenizer_of(path: pathlib.Path) -> list[tuple[str, object, object]]:
    """The vocab-only file's tokenizer.* keys as (key, value, type) for the writer."""
    from llamatui.inference.gguf import GGUFFile
    with GGUFFile.open(path) as f:
        md = f.metadata
        return [(k, md[k], md.types[k]) for k in md if k.startswith("tokenizer.")]


def with_vocabulary(recipe, tokenizer, seed: int):
    """`recipe` with `tokenizer` and its vocabulary-sized rows redrawn at their old scale."""
    n_vocab = len(next(v for k, v, _ in tokenizer if k == "tokenizer.ggml.tokens"))
    rng = np.random.default_rng(seed)
    for name in VOCAB_ROWS:
        old = recipe.tensors.get(name)
        if old is not None:
            rows = rng.standard_normal((n_vocab, old.shape[1])) * old.std()
            recipe.tensors[name] = rows.astype(np.float32)
    recipe.tokenizer = tokenizer
    return recipe


def run(cmd: list[str]) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout + done.stderr


def statistics(output: str) -> tuple[float, float, float]:
    """(mean KLD, same top %, RMS Δp %) from llama-perplexity's (and our) closing report."""
    def figure(label: str) -> float:
        m = re.search(rf"^{label}\s*:\s*(-?[\d.e+-]+)", output, re.M)
        if not m:
            sys.exit(f"no '{label}' in the report:\n{output[-2000:]}")
        return float(m.group(1))
    return figure("Mean    KLD"), figure("Same top p"), figure("RMS Δp")


def check(case: str, type_name: str, tokenizer, tool: pathlib.Path, tmp: pathlib.Path) -> str:
    recipe = CASES[case].recipe(np.random.default_rng(_seed(case)))
    recipe = with_vocabulary(recipe, tokenizer, _seed(case) + 1)
    model = tmp / f"{case}-{type_name}.gguf"
    write_recipe(recipe, model, type_name, recipe.label or case)
    common = ["-m", str(model), "-f", str(TEXT), "-c", str(N_CTX), "--chunks", str(N_CHUNKS),
              "-t", str(THREADS)]
    ours, theirs = tmp / "ours.kld", tmp / "theirs.kld"
    llamatui = [sys.executable, "-m", "llamatui.app.cli", "perplexity"]
    run(llamatui + common + ["--kl-divergence-base", str(ours)])
    read_by_llama = statistics(run([str(tool)] + common + [
        "--kl-divergence-base", str(ours), "--kl-divergence"]))
    run([str(tool)] + common + ["--kl-divergence-base", str(theirs)])
    read_by_us = statistics(run(llamatui + common + [
        "--kl-divergence-base", str(theirs), "--kl-divergence"]))
    model.unlink()
    fmt = "KLD {:.6f} same top {:.3f} % RMS Δp {:.3f} %"
    return (f"{case:14s} {type_name:5s} llama.cpp on our base: {fmt.format(*read_by_llama)} | "
            f"ours on llama.cpp's base: {fmt.format(*read_by_us)}")


def main(names: list[str]) -> None:
    tool = pathlib.Path(os.environ.get("LLAMA_PERPLEXITY", "llama-perplexity"))
    for case in names or list(VOCABS):
        tokenizer = tokenizer_of(vocab_file(VOCABS[case], tool))
        for type_name in TYPES:
            with tempfile.TemporaryDirectory() as tmp:
                print(check(case, type_name, tokenizer, tool, pathlib.Path(tmp)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
