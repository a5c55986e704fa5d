"""The one-pass special-token partition gives llama.cpp's longest-first result."""
import random

import pytest

from llamatui.inference.tokenizers.tokenizer import ATTR_LSTRIP, ATTR_RSTRIP, Tokenizer
from llamatui.inference.tokenizers.special import SpecialPartitioner, partition_longest_first

from test_tokenizer import _metadata


@pytest.fixture(scope="module", params=["smollm2_path", "gemma3_path"])
def starter_md(request):
    return _metadata(request.getfixturevalue(request.param))


def _random_texts(specials: list[str], seed: int, count: int) -> list[str]:
    """Texts of special-token strings, pieces of them, tokens cut into other tokens, whitespace
    runs (Gemma's run tokens overlap each other) and plain words."""
    rng = random.Random(seed)
    plain = ["a", "Hello", " world", "x<", ">", "<", "|", "_", "é", "日本", "🙂"]
    ws = [" ", "\t", "\n", "\r", "\v"]

    def piece():
        kind = rng.random()
        s = rng.choice(specials)
        if kind < 0.35:
            return s
        if kind < 0.55:  # a prefix, a suffix or a middle of a special token
            i, j = sorted(rng.randrange(len(s) + 1) for _ in range(2))
            return rng.choice([s[:j], s[i:], s[i:j]])
        if kind < 0.65:  # one special token inside another
            t = rng.choice(specials)
            k = rng.randrange(len(s) + 1)
            return s[:k] + t + s[k:]
        if kind < 0.85:
            return rng.choice(ws) * rng.randrange(1, 70) if rng.random() < 0.6 else "".join(
                rng.choice(ws) for _ in range(rng.randrange(1, 8)))
        return rng.choice(plain)

    return ["".join(piece() for _ in range(rng.randrange(0, 25))) for _ in range(count)]


def _check_against_longest_first(part: SpecialPartitioner, texts: list[str]) -> None:
    for text in texts:
        assert part.partition(text) == partition_longest_first(text, *part.spec), repr(text)


@pytest.mark.parametrize("parse_special", [True, False])
def test_one_pass_partition_equals_longest_first(starter_md, parse_special):
    tok = Tokenizer.from_metadata(starter_md)
    part = tok._partitioner(parse_special)
    assert part.spec[0] or not parse_special  # SmolLM2 has no USER_DEFINED tokens
    _check_against_longest_first(part, _random_texts(tok._special_texts, 11, 1500))


def test_one_pass_partition_with_strip_attributes(starter_md):
    """LSTRIP / RSTRIP tokens drop the whitespace beside them, inside their fragment only."""
    tok = Tokenizer.from_metadata(starter_md)
    rng = random.Random(5)
    texts, ids, _, _ = tok._partitioner(True).spec
    lstrip = [rng.random() < 0.4 for _ in ids]
    rstrip = [rng.random() < 0.4 for _ in ids]
    part = SpecialPartitioner(texts, ids, lstrip, rstrip)
    _check_against_longest_first(part, _random_texts(texts, 12, 1500))


def test_one_pass_partition_on_self_overlapping_tokens():
    """Tokens that overlap themselves and each other, on a small alphabet: every kind of
    conflict the order has to settle."""
    texts = ["abab", "a ba", "aaa", "bab", "aba", "  ", "aa", "ab", "ba", "b", " "]
    rng = random.Random(9)
    for trial in range(40):
        lstrip = [rng.random() < 0.3 for _ in texts]
        rstrip = [rng.random() < 0.3 for _ in texts]
        part = SpecialPartitioner(texts, list(range(len(texts))), lstrip, rstrip)
        _check_against_longest_first(part, ["".join(rng.choice("ab a\t<") for _ in range(
            rng.randrange(30))) for _ in range(200)])


def test_phi3_style_rstrip_through_the_tokenizer(starter_md):
    """llama.cpp gives every special token RSTRIP for a model named phi-3 (and takes it back from
    <s>, <unk>, <|endoftext|>): the whitespace after such a token is not tokenized."""
    md = dict(starter_md)
    md["general.name"] = "phi-3 test"
    tok, plain = Tokenizer.from_metadata(md), Tokenizer.from_metadata(starter_md)
    name = "<|im_start|>" if "<|im_start|>" in tok.vocab else "<start_of_turn>"
    sid = tok.token_to_id(name)
    assert tok.token_attr(sid) & ATTR_RSTRIP and not tok.token_attr(sid) & ATTR_LSTRIP
    ids = tok.encode(f"a{name}  \n user", add_special=False, parse_special=True)
    assert ids == (plain.encode("a", add_special=False) + [sid]
                   + plain.encode("user", add_special=False))


def test_partition_of_every_special_token_once(starter_md):
    """A prompt holding each special token once: each comes back as its id, in order (the
    longest-first loop, slow here, checks the first 500)."""
    tok = Tokenizer.from_metadata(starter_md)
    part = tok._partitioner(True)
    texts, ids = part.spec[0], part.spec[1]
    order = list(range(len(texts)))
    random.Random(3).shuffle(order)
    text = "\x01".join(texts[i] for i in order)
    frags = part.partition(text)
    assert [f for f in frags if isinstance(f, int)] == [ids[i] for i in order]
    text = "\x01".join(texts[i] for i in order[:500])
    assert part.partition(text) == partition_longest_first(text, *part.spec)
