"""The WordPiece and Unigram pieces on small hand-made inputs, and their errors."""
import struct

import pytest

from llamatui.inference.tokenizers.tokenizer import Tokenizer
from llamatui.inference.tokenizers.ugm import CharsMap
from llamatui.inference.tokenizers.wpm import WPMModel
from llamatui.inference.tokenizers.vocab import Vocab


def test_wordpiece_words_follow_bert_basic_tokenizer():
    wpm = WPMModel(Vocab.from_texts(["[UNK]"]), 0)
    assert wpm.words("Héllo,  WORLD!\t日本 x\x00y") == ["hello", ",", "world", "!", "日", "本",
                                                       "xy"]
    cased = WPMModel(Vocab.from_texts(["[UNK]"]), 0, lowercase=False, strip_accents=False)
    assert cased.words("Héllo $5") == ["Héllo", "$", "5"]


def test_wordpiece_longest_first_and_unknown_words():
    texts = ["[UNK]", "\u2581un", "able", "aff", "\u2581x"]
    wpm = WPMModel(Vocab.from_texts(texts), 0)
    assert wpm.encode("unaffable x") == [1, 3, 2, 4]
    assert wpm.encode("unzip x") == [0, 4]  # a word with an uncovered piece is one [UNK]
    # longest first, no going back: "▁una" leaves "ffable", which nothing covers
    greedy = WPMModel(Vocab.from_texts(texts + ["\u2581una"]), 0)
    assert greedy.encode("unaffable") == [0]


def test_charsmap_rejects_truncated_maps():
    with pytest.raises(ValueError, match="too small"):
        CharsMap(b"\x01\x00")
    with pytest.raises(ValueError, match="does not fit"):
        CharsMap(struct.pack("<I", 64) + bytes(8))


def test_unknown_models_and_pre_tokenizers_are_named():
    md = {"tokenizer.ggml.model": "rwkv", "tokenizer.ggml.tokens": ["a"]}
    with pytest.raises(ValueError, match="unsupported tokenizer model: 'rwkv'"):
        Tokenizer.from_metadata(md)
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "nope",
          "tokenizer.ggml.tokens": ["a"], "tokenizer.ggml.merges": []}
    with pytest.raises(ValueError, match="unknown pre-tokenizer type: 'nope'"):
        Tokenizer.from_metadata(md)
