"""Broken models and impossible contexts end in clear errors (the hardening issue's items 2-4):

- the tokenizer's metadata is checked where it is read: the wrong type names the key, the value
  and what was expected; where llama.cpp is lenient (special ids outside the vocabulary, unknown
  token types) so are we;
- NaN and infinities never crash a kernel: NaN metadata is refused by the reader, NaN or infinite
  weights flow through to the logits and end in NonFiniteLogitsError;
- a context the machine cannot hold is refused before anything is allocated, with what it needs
  and the largest -c that fits (LLAMATUI_AVAILABLE_MEMORY stands in for the machine's memory).
"""
import math
import re
import struct

import numpy as np
import pytest

from llamatui.inference import LoadConfig
from llamatui.app.cli import main
from llamatui.inference.cpu import ops
from llamatui.inference.chat.template import ChatTemplate
from llamatui.inference.engine import Engine
from llamatui.inference.gguf import GGUFValueType as VT
from llamatui.inference.gguf import ValueType
from llamatui.inference.hparams import ModelMetadataError
from llamatui.inference.memory import InsufficientMemoryError
from llamatui.inference.model import Model
from llamatui.inference.scheduler import NonFiniteLogitsError
from llamatui.inference.tokenizers.tokenizer import ATTR_UNDEFINED, Tokenizer
from llamatui.models.recommend import estimate_file
from metadata_fuzz import Case, base_model, write_case
from llamatui.inference.rope import RopeSpec
from llamatui.inference.cpu import attention

GiB = 1 << 30
F32, U32 = ValueType(VT.FLOAT32), ValueType(VT.UINT32)


def _tiny(tmp_path, base="llama-bpe", edits=(), tensor_edits=(), name="m.gguf"):
    """A tiny model (tests/metadata_fuzz.py's bases) with metadata or tensors changed."""
    path = tmp_path / name
    write_case(Case(0, base, list(edits), list(tensor_edits)), path)
    return path


def _metadata(base: str) -> dict:
    return {k: v for k, v, _ in base_model(base)[0]}


# ----------------------------------------------------------------------------- tokenizer metadata


@pytest.mark.parametrize("base, key, value, expected", [
    ("llama-bpe", "tokenizer.ggml.model", 5, "expected a string"),
    ("llama-bpe", "tokenizer.ggml.tokens", np.arange(128, dtype=np.int32), "strings"),
    ("llama-bpe", "tokenizer.ggml.tokens", [], "an array of 1 to"),
    ("llama-bpe", "tokenizer.ggml.merges", [["a", "b"]], "strings"),
    ("llama-bpe", "tokenizer.ggml.bos_token_id", 1.0, "expected a token id (an integer)"),
    ("llama-bpe", "tokenizer.ggml.eos_token_id", [1, 2], "expected a token id (an integer)"),
    ("llama-bpe", "tokenizer.ggml.add_bos_token", 1, "expected a bool"),
    ("llama-bpe", "tokenizer.ggml.token_type", np.ones(128, np.float32), "integers"),
    ("llama-bpe", "tokenizer.ggml.token_type", np.ones(3, np.int32), "at least 128"),
    ("llama-spm", "tokenizer.ggml.scores", np.full(128, np.nan, np.float32), "numbers"),
    ("llama-spm", "tokenizer.ggml.scores", "0.5", "expected an array"),
    ("gemma3-ugm", "tokenizer.ggml.precompiled_charsmap", np.array([300], np.int32),
     "in [-128, 255]"),
    ("gemma3-ugm", "tokenizer.ggml.precompiled_charsmap",
     np.frombuffer(struct.pack("<I", 64) + bytes(8), np.uint8), "does not fit in 12 bytes"),
    ("gemma3-wpm", "tokenizer.ggml.normalizer.lowercase", "yes", "expected a bool"),
])
def test_tokenizer_metadata_of_the_wrong_type_or_range_is_named(base, key, value, expected):
    md = {**_metadata(base), key: value}
    with pytest.raises(ModelMetadataError, match=re.escape(key)) as info:
        Tokenizer.from_metadata(md)
    assert expected in str(info.value)


def test_a_charsmap_broken_where_a_lookup_reaches_is_named_when_tokenizing():
    """llama.cpp's xcda_array_view throws when a lookup leaves the double array; so do we,
    naming the key, and only for text that reaches the broken part."""
    four_nodes = np.frombuffer(struct.pack("<I", 16) + bytes(16) + b"\0", np.uint8)
    tok = Tokenizer.from_metadata({**_metadata("gemma3-ugm"),
                                   "tokenizer.ggml.precompiled_charsmap": four_nodes})
    assert tok.encode("\x01") == tok.encode("\x01")
    with pytest.raises(ModelMetadataError, match="precompiled_charsmap: node 97 outside"):
        tok.encode("ab")


def test_tokenizer_is_lenient_where_llama_cpp_is():
    md = _metadata("llama-spm")
    types = np.array(md["tokenizer.ggml.token_type"])
    types[5] = 99  # a token type llama.cpp does not know: UNDEFINED
    tok = Tokenizer.from_metadata({
        **md, "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 5000, "tokenizer.ggml.eos_token_id": -1,  # ignored
        "tokenizer.ggml.scores": np.zeros(200, np.float32)})  # longer: the first 128 count
    assert (tok.bos_id, tok.eos_id) == (1, 2)  # SentencePiece's defaults
    assert tok.token_attr(5) == ATTR_UNDEFINED
    with pytest.raises(ModelMetadataError, match="add_bos_token is true, but the vocabulary has "
                                                 "no BOS token"):
        Tokenizer.from_metadata({**_metadata("llama-bpe"), "tokenizer.ggml.bos_token_id": 999,
                                 "tokenizer.ggml.add_bos_token": True,
                                 "tokenizer.ggml.pre": "glm4"})  # a pre without a default BOS
    with pytest.raises(ModelMetadataError, match="duplicate token in vocabulary: 'b'"):
        Tokenizer.from_metadata({**md, "tokenizer.ggml.tokens":
                                 md["tokenizer.ggml.tokens"][:4] + ["b"] * 124})


def test_the_engine_template_takes_bos_and_eos_from_the_tokenizer(tmp_path):
    """As llama.cpp's common/chat.cpp does: the vocabulary's special ids, defaults included,
    and out-of-range metadata ids ignored rather than failing the load."""
    path = _tiny(tmp_path, "llama-spm", edits=[
        ("del", "tokenizer.ggml.bos_token_id"), ("set", "tokenizer.ggml.eos_token_id", 999, U32)])
    with Engine.load(path, LoadConfig(n_ctx=64, warmup=False)) as engine:
        assert (engine.template.bos_token, engine.template.eos_token) == ("<s>", "</s>")
    with pytest.raises(ValueError, match="outside the vocabulary"):  # alone, it has no defaults
        ChatTemplate.from_metadata({**_metadata("llama-spm"),
                                    "tokenizer.ggml.bos_token_id": 999})


def test_the_vocabulary_and_the_embedding_must_agree(tmp_path):
    md = _metadata("llama-bpe")
    path = _tiny(tmp_path, edits=[("set", "tokenizer.ggml.tokens",
                                   md["tokenizer.ggml.tokens"] + ["extra"],
                                   ValueType(VT.ARRAY, ValueType(VT.STRING))),
                                  ("del", "tokenizer.ggml.token_type")])
    for load in (lambda: Engine.load(path, LoadConfig(n_ctx=64)), lambda: estimate_file(path)):
        with pytest.raises(ModelMetadataError, match="token_embd.weight has 128 rows but "
                                                     "tokenizer.ggml.tokens has 129 tokens"):
            load()


# ----------------------------------------------------------------------------- non-finite numbers


@pytest.mark.parametrize("value", [math.nan, math.inf, 0.0, -0.5])
def test_a_non_finite_or_non_positive_epsilon_is_refused_by_the_reader(tmp_path, value):
    key = "llama.attention.layer_norm_rms_epsilon"
    path = _tiny(tmp_path, edits=[("set", key, value, F32)])
    with pytest.raises(ModelMetadataError, match=re.escape(key)) as info:
        Engine.load(path, LoadConfig(n_ctx=64))
    assert f"= {value!r}" in str(info.value) and "expected a finite number in (0, 1]" in \
        str(info.value)


def test_kernels_carry_nan_and_inf_through():
    """A division by zero inside a kernel gives inf or NaN as in C, not ZeroDivisionError."""
    rng = np.random.default_rng(0)
    zeros = np.zeros((3, 16), np.float32)
    assert np.isnan(ops.rms_norm(zeros, np.ones(16, np.float32), 0.0)).all()  # 0 / sqrt(0)
    cos, sin = ops.rope_tables(np.arange(4), RopeSpec(16, 10000.0,
                                                          freq_factors=np.zeros(8, np.float32)))
    assert not np.isfinite(cos[1:]).any()  # theta / 0
    for n, d in ((1, 16), (2, 8), (20, 16), (20, 8)):  # decode kernels, GEMM and numpy paths
        q = rng.standard_normal((n, 4, d)).astype(np.float32)
        q[0, 0, 0] = np.nan
        k = rng.standard_normal((n, 2, d)).astype(np.float32)
        v = rng.standard_normal((n, 2, d)).astype(np.float32)
        mask = np.triu(np.full((n, n), -np.inf, np.float32), 1)
        out = attention.attention(q, k, v, mask, 0.25)
        assert np.isnan(out[0, :d]).all(), (n, d)
    s = np.full((1, 1, 4), np.nan, np.float32)
    assert np.isnan(ops.softmax_masked_inplace(s, np.zeros((1, 4), np.float32), 1.0)).all()


@pytest.mark.parametrize("tensor, value, whole", [
    ("blk.0.attn_norm.weight", "nan", True), ("token_embd.weight", "inf", True),
    ("blk.1.attn_q.weight", "-inf", True), ("blk.0.ffn_down.weight", "nan", False),
    ("output.weight", "inf", False)])
@pytest.mark.parametrize("prompt", ["ab", "ab " * 12])  # the decode kernel; the prompt GEMM
def test_non_finite_weights_end_in_non_finite_logits_error(tmp_path, tensor, value, whole,
                                                           prompt):
    path = _tiny(tmp_path, tensor_edits=[("fill", tensor, value, whole)])
    with Engine.load(path, LoadConfig(n_ctx=64)) as engine:  # its warm-up decode does not fail
        with pytest.raises(NonFiniteLogitsError, match="the model produced non-finite logits"):
            list(engine.generate(prompt, max_tokens=2))


# ----------------------------------------------------------------------------- memory


@pytest.fixture
def no_kv_cache(monkeypatch):
    """The KV cache is the one big allocation: reaching it fails the test."""
    from llamatui.inference import model

    def refuse(*args, **kwargs):
        raise AssertionError("the KV cache was allocated")
    monkeypatch.setattr(model, "KVCache", refuse)


@pytest.mark.parametrize("n_ctx", [100_000_000, 10_000_000])
def test_a_context_larger_than_the_machine_is_refused_before_allocating(
        smollm2_path, monkeypatch, no_kv_cache, n_ctx):
    monkeypatch.setenv("LLAMATUI_AVAILABLE_MEMORY", str(24 * GiB))
    with pytest.raises(InsufficientMemoryError) as info:
        Engine.load(smollm2_path, LoadConfig(n_ctx=n_ctx))
    message = str(info.value)
    need = float(re.search(r"needs ([\d.]+) GiB", message).group(1))
    assert need > 24 and "21.6 GiB is available" in message  # 90 % of what is available
    assert re.search(r"the largest context that fits is -c \d+", message), message


def test_the_largest_context_offered_fits(smollm2_path, monkeypatch):
    monkeypatch.setenv("LLAMATUI_AVAILABLE_MEMORY", str(1 * GiB))
    with pytest.raises(InsufficientMemoryError) as info:
        Engine.load(smollm2_path, LoadConfig(n_ctx=10_000_000))
    largest = int(re.search(r"-c (\d+)", str(info.value)).group(1))
    assert largest >= 1024
    with Engine.load(smollm2_path, LoadConfig(n_ctx=largest, warmup=False)) as engine:
        assert engine.info.n_ctx == largest
    with pytest.raises(InsufficientMemoryError, match=f"the largest context that fits is -c "
                                                      f"{largest}"):
        Engine.load(smollm2_path, LoadConfig(n_ctx=largest + 256))


def test_the_model_own_context_is_checked_too(tmp_path, monkeypatch, no_kv_cache):
    """-c 0 takes the training context from the file: 2^30 tokens do not fit anywhere."""
    monkeypatch.setenv("LLAMATUI_AVAILABLE_MEMORY", str(24 * GiB))
    path = _tiny(tmp_path, edits=[("set", "llama.context_length", 1 << 30, U32)])
    with pytest.raises(InsufficientMemoryError, match=r"a context of 1073741824 tokens needs"):
        Engine.load(path, LoadConfig(n_ctx=0))


def test_the_cli_says_what_fits_instead_of_a_traceback(smollm2_path, monkeypatch, capsys):
    monkeypatch.setenv("LLAMATUI_AVAILABLE_MEMORY", str(24 * GiB))
    assert main(["run", "-m", str(smollm2_path), "-p", "hi", "-n", "1",
                 "-c", "100000000"]) == 1
    err = capsys.readouterr().err
    assert "llamatui run: error: a context of 100000000 tokens needs" in err
    assert "the largest context that fits is -c" in err and "Traceback" not in err


def test_a_negative_context_is_an_error(smollm2_path, tmp_path, capsys):
    assert main(["run", "-m", str(smollm2_path), "-p", "hi", "-c", "-5"]) == 2
    assert "minimum context size is 8 (0 = loaded from model)" in capsys.readouterr().err
    with pytest.raises(ValueError, match="the context size must be 0 .* not -5"):
        Engine.load(smollm2_path, LoadConfig(n_ctx=-5))
    with pytest.raises(ValueError, match="the context size must be 0 .* not -5"):
        Model.load(_tiny(tmp_path), LoadConfig(n_ctx=-5))
