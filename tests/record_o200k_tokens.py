"""Records llama.cpp's tokenization of gpt-oss's vocabulary (o200k_harmony, pre-tokenizer
"gpt-4o") into tests/golden/llama_cpp_o200k_harmony.json.

    python tests/record_o200k_tokens.py /tmp/llama_tokenize

/tmp/llama_tokenize is tests/llama_tokenize.c built against libllama of build 11434 (its header
says how); the vocabulary is tests/o200k_vocab.py's GGUF. The texts: llama.cpp's tokenizer test
cases (ggml-vocab-qwen35.gguf.inp of the llama-cpp-python 0.3.36 sdist, as
tests/test_vocab_files.py fetches it) and `EXTRA` below (the gpt-4o regex's case and
contraction rules, digits, and a Harmony prompt with its special tokens), each tokenized with
special-token parsing off and on.
"""
import hashlib
import json
import pathlib
import subprocess
import sys
import tempfile

import conftest
import o200k_vocab
from test_vocab_files import SEPARATOR, _fetch

EXTRA = [
    "HelloWorld camelCase ALLCAPS iPhone McDonald's",
    "I'M HERE, you're there; THEY'LL go. We'd've. DON'T! o'clock",
    "1234567 12 3.14159 1,000,000 ２０２６年",
    "Ünïcödé Straße ΑΘΗΝΑ Москва 日本語のテキスト 한국어 العربية हिन्दी",
    "  leading and trailing spaces  \n\n\tindented\r\nwindows line\n/path/to\n",
    "def f(x):\n    return {'a': [1, 2]}  # comment\n",
    "emoji 👍🏽 and 🇫🇷 flags, zero\u200bwidth, combining e\u0301",
    "<|start|>system<|message|>You are ChatGPT.<|end|><|start|>user<|message|>Hi<|end|>"
    "<|start|>assistant<|channel|>analysis<|message|>Think.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    "<|message|>{\"city\": \"Paris\"}<|call|>",
]


def texts(vocabs: pathlib.Path) -> list[str]:
    inp = (vocabs / "ggml-vocab-qwen35.gguf.inp").read_bytes()
    return [t.decode("utf-8", "surrogateescape") for t in inp.split(SEPARATOR)] + EXTRA


def record(binary: str) -> None:
    vocabs = conftest.test_store() / "llama-cpp-python-0.3.36-vocabs"
    if not vocabs.is_dir():
        _fetch(vocabs)
    gguf = o200k_vocab.build(conftest.test_store() / "o200k")
    if gguf is None:
        raise SystemExit(f"pip could not download {o200k_vocab.WHEEL}")
    cases = texts(vocabs)
    ids = {}
    with tempfile.NamedTemporaryFile("wb", suffix=".inp") as f:
        f.write(SEPARATOR.join(t.encode("utf-8", "surrogateescape") for t in cases))
        f.flush()
        for parse in (0, 1):
            done = subprocess.run([binary, str(gguf), f.name, str(parse)], capture_output=True,
                                  text=True, timeout=600, check=True)
            lines = done.stdout.split("\n")[:len(cases)]
            ids[f"parse{parse}"] = [[int(x) for x in line.split()] for line in lines]
    out = conftest.GOLDEN / "llama_cpp_o200k_harmony.json"
    out.write_text(json.dumps({
        "llama_cpp": "libllama 0.6.0 (build 11434) llama_tokenize, add_special=false",
        "vocab_sha256": hashlib.sha256(gguf.read_bytes()).hexdigest(),
        "texts": cases, "ids": ids}, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{len(cases)} texts → {out}")


if __name__ == "__main__":
    record(sys.argv[1])
