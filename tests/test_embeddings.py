"""Embeddings (llama.cpp's `--embeddings --pooling`): a decoder's pooled states against llama.cpp
on the SmolLM2 starter, the engine's embed() beside generations, an encoder's refusals, and the
LayerNorm / GELU / pooling / normalization pieces against their definitions. (The encoders'
forward passes against llama.cpp: tests/test_archs.py.)"""
import json
import threading

import numpy as np
import pytest

from llamatui.inference import ContextFullError, EmbeddingOnlyError, Engine, LoadConfig
from llamatui.inference.cpu import ops
from llamatui.inference.quants.fp16 import GELU_F16_TABLE
from llamatui.inference.embedding import normalize, pool
from synthetic_models import write_model

MIN_COSINE = 0.999


@pytest.fixture(scope="module")
def engine(smollm2_path):
    with Engine.load(smollm2_path, LoadConfig(n_ctx=512, threads=2)) as e:
        yield e


@pytest.fixture(scope="module")
def golden(golden_dir):
    return json.loads((golden_dir / "llama_cpp_smollm2_embeddings.json").read_text())


@pytest.fixture(scope="module")
def bert_engine(tmp_path_factory):
    path = write_model("bert", "Q8_0", tmp_path_factory.mktemp("bert"))
    with Engine.load(path, LoadConfig(n_ctx=512, threads=2)) as e:
        yield e


def _cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_decoder_pooling_matches_llama_cpp(engine, golden, pooling):
    assert [engine.tokenize(t) for t in golden["texts"]] == golden["tokens"]
    vectors = engine.embed(golden["texts"], pooling=pooling)
    cosines = _cosines(vectors, golden["pooling"][pooling])
    print(f"\nSmolLM2 {pooling}: cosine similarity {', '.join(f'{c:.6f}' for c in cosines)}")
    assert (cosines >= MIN_COSINE).all()


def test_embed_normalizes_like_llama_server(engine, golden):
    text = golden["texts"][2]
    unit = engine.embed([text], pooling="mean")
    raw = engine.embed(text, pooling="mean", normalize_as=-1)
    assert unit.shape == raw.shape == (1, engine.info.n_embd) and unit.dtype == np.float32
    assert np.linalg.norm(unit) == pytest.approx(1.0, abs=1e-5)
    assert np.linalg.norm(raw) > 2  # SmolLM2's normed states are far from unit length
    np.testing.assert_allclose(unit, raw / np.linalg.norm(raw), rtol=1e-5, atol=1e-7)
    ids = engine.tokenize(text)
    np.testing.assert_array_equal(engine.embed([ids], pooling="mean"), unit)


def test_decoder_without_pooling_asks_for_one(engine):
    assert engine.info.pooling == "none" and not engine.info.encoder
    with pytest.raises(ValueError, match="choose one of mean, cls, last"):
        engine.embed(["hello"])
    with pytest.raises(ValueError, match="pooling must be one of"):
        engine.embed(["hello"], pooling="max")


def test_bad_inputs_are_refused(engine):
    with pytest.raises(ValueError, match="no inputs"):
        engine.embed([], pooling="mean")
    with pytest.raises(ValueError, match="input 1 is empty"):
        engine.embed(["a", ""], pooling="mean")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.embed([[1, engine.info.n_vocab]], pooling="mean")
    with pytest.raises(ValueError, match="neither a text nor"):
        engine.embed([[1.5, 2]], pooling="mean")
    with pytest.raises(ContextFullError, match="input 0 is 600 tokens"):
        engine.embed([[1] * 600], pooling="mean")


def test_embedding_does_not_disturb_a_generation(engine):
    """Embeddings run between the scheduler's steps without touching the KV cache: a greedy
    generation interrupted by embed() calls, one of them from another thread while it steps,
    writes what it writes alone, and its cached prefix stays."""
    kw = dict(temperature=0, max_tokens=16)
    alone = "".join(e.text for e in engine.generate("The capital of France is", **kw))
    alone_vectors = engine.embed(["some text", "more text"], pooling="last")
    texts, vectors, worker = [], [], None
    for i, event in enumerate(engine.generate("The capital of France is", **kw)):
        texts.append(event.text)
        if i == 3:
            used = engine.kv_usage()[0]
            vectors.append(engine.embed(["some text", "more text"], pooling="last"))
            assert engine.kv_usage()[0] == used
        if i == 6:
            worker = threading.Thread(target=lambda: vectors.append(
                engine.embed(["some text", "more text"], pooling="last")))
            worker.start()
    assert worker is not None, "the generation ended before the second embedding"
    worker.join(timeout=60)
    assert "".join(texts) == alone
    assert len(vectors) == 2
    for v in vectors:
        np.testing.assert_array_equal(v, alone_vectors)


def test_encoder_embeds_and_refuses_to_generate(bert_engine):
    info = bert_engine.info
    assert info.encoder and info.pooling == "mean" and info.kv_bytes == 0
    assert bert_engine.model.max_embed_tokens == 128  # its table of position embeddings
    one = bert_engine.embed("the cat sat on the mat.")
    mean_default = bert_engine.embed(["the cat sat on the mat.", "lazy dogs"])
    np.testing.assert_allclose(one[0], mean_default[0], rtol=1e-5, atol=1e-6)
    cls = bert_engine.embed(["the cat sat on the mat."], pooling="cls")
    assert _cosines(cls, one)[0] < 0.99  # the pooling override is honoured
    with pytest.raises(EmbeddingOnlyError, match="embedding model"):
        bert_engine.generate("the cat")
    with pytest.raises(EmbeddingOnlyError):
        bert_engine.logits([2, 3])
    with pytest.raises(ContextFullError, match="at most 128"):
        bert_engine.embed([[5] * 129])


def test_layer_norm_matches_its_definition():
    rng = np.random.default_rng(3)
    for rows in (3, 300):  # one thread, then numba's threads
        x = (rng.standard_normal((rows, 384)) * 3 + 1.5).astype(np.float32)
        w, b = rng.standard_normal(384).astype(np.float32), rng.standard_normal(384).astype(
            np.float32)
        x64 = x.astype(np.float64)
        centred = x64 - x64.mean(axis=1, keepdims=True)
        want = centred / np.sqrt((centred ** 2).mean(axis=1, keepdims=True) + 1e-12) * w + b
        np.testing.assert_allclose(ops.layer_norm(x, w, b, 1e-12), want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ops.layer_norm(x, w, None, 1e-12), want - b, rtol=1e-5,
                                   atol=1e-5)
    with pytest.raises(ValueError, match="layer_norm"):
        ops.layer_norm(x, w[:10], b, 1e-5)


def test_gelu_is_ggmls_fp16_table():
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((300, 512)) * 4).astype(np.float32)
    x[0, :4] = [-10.0, 10.0, 11.5, -12.0]
    table = GELU_F16_TABLE
    want = np.where(x <= -10, np.float32(0), np.where(x >= 10, x,
                                                      table[x.astype(np.float16).view(np.uint16)]))
    np.testing.assert_array_equal(ops.gelu(x), want)
    np.testing.assert_allclose(ops.gelu(x[:2]), ops.gelu_tanh(x[:2]), rtol=2e-3, atol=2e-3)


def test_pool_and_normalize():
    hidden = np.arange(12, dtype=np.float32).reshape(6, 2)  # sequences of 1, 3 and 2 rows
    np.testing.assert_array_equal(pool(hidden, [1, 3, 2], "mean"), [[0, 1], [4, 5], [9, 10]])
    np.testing.assert_array_equal(pool(hidden, [1, 3, 2], "cls"), hidden[[0, 1, 4]])
    np.testing.assert_array_equal(pool(hidden, [1, 3, 2], "last"), hidden[[0, 3, 5]])
    x = np.array([[3.0, -4.0], [0.0, 0.0]], np.float32)
    np.testing.assert_allclose(normalize(x), [[0.6, -0.8], [0, 0]])
    np.testing.assert_allclose(normalize(x, 0), [[3 * 32760 / 4, -32760], [0, 0]])
    np.testing.assert_allclose(normalize(x, 1), [[3 / 7, -4 / 7], [0, 0]])
    np.testing.assert_array_equal(normalize(x, -1), x)
    with pytest.raises(ValueError, match="normalization"):
        normalize(x, -2)


def test_cli_embed_prints_one_vector_per_text(tmp_path, smollm2_path, capsys):
    from llamatui.app.cli import main
    path = write_model("nomic-bert", "Q8_0", tmp_path)
    assert main(["embed", "-m", str(path), "-t", "2", "the cat sat.", "a lazy dog"]) == 0
    lines = capsys.readouterr().out.splitlines()
    vectors = np.array([[float(v) for v in line.split()] for line in lines])
    assert vectors.shape == (2, 256)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert main(["embed", "-m", str(smollm2_path), "-t", "2", "hello"]) == 1
    assert "choose one of mean, cls, last" in capsys.readouterr().err
    assert main(["embed", "-m", str(smollm2_path), "--pooling", "max", "hello"]) == 2
