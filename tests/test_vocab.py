"""The packed vocabulary: same texts and ids as the decoded list, duplicates refused."""
import pytest

from llamatui.inference.gguf import GGUFFile
from llamatui.inference.tokenizers.tokenizer import Tokenizer
from llamatui.inference.tokenizers.vocab import Vocab


@pytest.mark.parametrize("which", ["smollm2_path", "gemma3_path"])
def test_packed_vocab_equals_the_decoded_token_list(which, request):
    with GGUFFile.open(request.getfixturevalue(which)) as f:
        texts = f.metadata["tokenizer.ggml.tokens"]
        vocab = Vocab(*f.metadata.packed_strings("tokenizer.ggml.tokens"))
        assert len(vocab) == len(texts)
        assert all(vocab[i] == t for i, t in enumerate(texts))
        assert all(vocab.get(t) == i for i, t in enumerate(texts))
        # the engine's tokenizer (packed from the file) tokenizes as the list-built one
        packed, listed = Tokenizer.from_metadata(f.metadata), Tokenizer.from_metadata(
            {k: f.metadata[k] for k in f.metadata})
        text = "Grüße, 世界! <start_of_turn>user\n  def f(x):\treturn x ** 2 🙂"
        for parse_special in (False, True):
            assert packed.encode(text, parse_special=parse_special) == listed.encode(
                text, parse_special=parse_special)


def test_lookups_and_errors():
    vocab = Vocab.from_texts(["a", "ab", "▁the", "\udcff", "日本"])
    assert [vocab.get(t) for t in ("a", "ab", "▁the", "\udcff", "日本")] == [0, 1, 2, 3, 4]
    assert vocab.get("abc") is None and vocab.get("") is None and vocab.get("b", -1) == -1
    assert vocab.get("b") is None and vocab.get("b", 7) == 7  # remembered misses keep defaults
    assert vocab.get("ab") == vocab.get("ab") == 1
    assert "ab" in vocab and "b" not in vocab and 1 not in vocab
    assert list(vocab) == ["a", "ab", "▁the", "\udcff", "日本"]
    with pytest.raises(IndexError):
        vocab[5]
    with pytest.raises(ValueError, match=r"duplicate token in vocabulary: 'ab' has ids 1 and 3"):
        Vocab.from_texts(["a", "ab", "c", "ab"])


def test_empty_token_texts_get_llama_cpp_placeholders():
    md = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "", "a", ""],
          "tokenizer.ggml.scores": [0.0] * 4, "tokenizer.ggml.token_type": [2, 1, 1, 1]}
    tok = Tokenizer.from_metadata(md)
    assert tok.token_text(1) == "[EMPTY_1]" and tok.token_text(3) == "[EMPTY_3]"
    assert tok.token_to_id("a") == 2
