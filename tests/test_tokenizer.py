"""Tokenizers against llama.cpp's own output (golden/llama_cpp_*.json) and llama.cpp's rules."""
import time

import pytest

from llamatui.inference.gguf import GGUFFile
from llamatui.inference.tokenizers.tokenizer import ATTR_CONTROL, StreamDecoder, Tokenizer
from llamatui.inference.tokenizers.bpe import GPT2_REGEX, LLAMA3_REGEX, QWEN2_REGEX, PreTokenizer

MODES = [(a, p) for a in (0, 1) for p in (0, 1)]


def _metadata(path) -> dict:
    with GGUFFile.open(path) as f:
        return {k: f.metadata[k] for k in f.metadata if k.startswith(("tokenizer.", "general."))}


@pytest.fixture(scope="module")
def smollm2_md(smollm2_path):
    return _metadata(smollm2_path)


@pytest.fixture(scope="module")
def gemma3_md(gemma3_path):
    return _metadata(gemma3_path)


@pytest.fixture(scope="module")
def smollm2(smollm2_md):
    return Tokenizer.from_metadata(smollm2_md)


@pytest.fixture(scope="module")
def gemma3(gemma3_md):
    return Tokenizer.from_metadata(gemma3_md)


@pytest.fixture(params=["smollm2", "gemma3"])
def model(request):
    """(tokenizer, golden) for each starter model."""
    return (request.getfixturevalue(request.param),
            request.getfixturevalue(f"golden_{request.param}"))


# ----------------------------------------------------------------------------- golden


def test_golden_tokenize_all_modes(model):
    tok, golden = model
    cases = golden["tokenize"]
    assert len(cases) == 72
    bad = []
    for case in cases:
        for add, parse in MODES:
            ids = tok.encode(case["text"], add_special=bool(add), parse_special=bool(parse))
            if ids != case[f"ids_add{add}_parse{parse}"]:
                bad.append((case["text"][:40], add, parse))
    assert not bad


def test_golden_detokenize(model):
    tok, golden = model
    bad = [c["text"][:40] for c in golden["tokenize"]
           if tok.decode(c["ids_add0_parse1"]) != c["detokenized"]]
    assert not bad


def test_golden_prompts_and_generated_content(model):
    """Greedy runs: the prompt (BOS, specials parsed) tokenizes as llama.cpp did, and the
    generated tokens detokenize (specials not printed) to llama.cpp's content."""
    tok, golden = model
    for run in golden["greedy"]:
        assert tok.encode(run["prompt"], add_special=True, parse_special=True) == run["prompt_ids"]
        assert tok.decode(run["tokens"], unparse_special=False) == run["content"]


def _stream(tok, ids, **flags):
    dec = StreamDecoder(tok, **flags)
    pieces = [dec.feed(i) for i in ids]
    pieces.append(dec.flush())
    return pieces


@pytest.mark.parametrize("flags", [{}, {"unparse_special": False},
                                   {"remove_special": True, "unparse_special": False}])
def test_stream_decoder_matches_decode(model, flags):
    tok, golden = model
    for case in golden["tokenize"]:
        for key in ("ids_add0_parse1", "ids_add1_parse1", "ids_add1_parse0"):
            ids = case[key]
            full = tok.decode(ids, **flags)
            pieces = _stream(tok, ids, **flags)
            assert "".join(pieces) == full, (case["text"][:40], key)
            if "\ufffd" not in full:
                assert not any("\ufffd" in p for p in pieces), case["text"][:40]


# ----------------------------------------------------------------------------- edge cases


def test_empty_string(smollm2, gemma3):
    assert smollm2.encode("") == []  # SmolLM2 does not add BOS
    assert smollm2.encode("", add_special=False) == []
    assert gemma3.encode("") == [gemma3.bos_id]
    assert gemma3.encode("", add_special=False) == []
    assert smollm2.decode([]) == "" and gemma3.decode([]) == ""
    dec = gemma3.stream_decoder()
    assert dec.flush() == ""


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_whitespace_runs_roundtrip(request, name):
    tok = request.getfixturevalue(name)
    for ws in (" ", "\t", "\n", "\r\n", "\u00a0", "\u3000"):
        for n in range(1, 20):
            text = ws * n
            ids = tok.encode(text, add_special=False)
            assert ids and tok.decode(ids) == text
            assert tok.decode(tok.encode("a" + text + "b", add_special=False)) == "a" + text + "b"


def test_gemma_user_defined_tokens_split_without_parse_special(gemma3):
    """USER_DEFINED tokens (Gemma's newline and space runs) are cut out even when special-token
    parsing is off; CONTROL ones only when it is on."""
    nn = gemma3.token_to_id("\n\n")
    spaces = gemma3.token_to_id("    ")
    assert gemma3.encode("x\n\ny", add_special=False) == (
        gemma3.encode("x", add_special=False) + [nn] + gemma3.encode("y", add_special=False))
    assert spaces in gemma3.encode("a    b", add_special=False)
    sot = gemma3.token_to_id("<start_of_turn>")
    assert gemma3.is_control(sot)
    assert sot not in gemma3.encode("<start_of_turn>user", parse_special=False)
    assert gemma3.encode("<start_of_turn>user", parse_special=True)[:2] == [gemma3.bos_id, sot]


def test_emoji_stream_never_splits_characters(smollm2, gemma3):
    text = "emoji 🙂🚀👍🏽 🦙!"
    for tok in (smollm2, gemma3):
        ids = tok.encode(text, add_special=False)
        assert tok.decode(ids) == text
        dec = tok.stream_decoder()
        pieces = [dec.feed(i) for i in ids] + [dec.flush()]
        assert "".join(pieces) == text
        assert not any("\ufffd" in p for p in pieces)
    # SmolLM2 spells 🦙 with three byte-level tokens: nothing comes out until the last one.
    ids = smollm2.encode("🦙", add_special=False)
    assert len(ids) == 3
    dec = smollm2.stream_decoder()
    assert [dec.feed(i) for i in ids] == ["", "", "🦙"]


def test_byte_tokens_and_invalid_utf8(gemma3):
    byte = {b: gemma3.token_to_id(f"<0x{b:02X}>") for b in (0xC3, 0xA9, 0xF0, 0x9F)}
    assert all(v is not None for v in byte.values())
    assert gemma3.detokenize([byte[0xC3], byte[0xA9]]) == b"\xc3\xa9"
    assert gemma3.decode([byte[0xC3], byte[0xA9]]) == "é"
    # a lone lead byte is not UTF-8: bytes come back as they are, text gets U+FFFD
    assert gemma3.detokenize([byte[0xF0]]) == b"\xf0"
    assert gemma3.decode([byte[0xF0]]) == "\ufffd"
    dec = gemma3.stream_decoder()
    assert dec.feed(byte[0xF0]) == "" and dec.feed(byte[0x9F]) == ""
    a = gemma3.encode("a", add_special=False)
    # the broken sequence is settled once a byte that cannot continue it arrives
    assert dec.feed(a[0]) == "\ufffda"
    assert dec.flush() == ""


def test_spm_byte_fallback(gemma3):
    """A character that is not in the vocabulary becomes one <0xXX> token per UTF-8 byte."""
    candidates = ["\U0001D7E0", "\U00010400", "\u0D7F", "\U0002A6D6", "\U000E0100", "\uE000",
                  "\U0001F9A9", "\u2FD5"]
    missing = [c for c in candidates if gemma3.token_to_id(c) is None
               and gemma3.token_to_id("\u2581" + c) is None]
    assert missing, "every candidate is a Gemma token"
    ch = missing[0]
    ids = gemma3.encode(ch, add_special=False)
    assert ids == [gemma3.token_to_id(f"<0x{b:02X}>") for b in ch.encode("utf-8")]
    assert gemma3.decode(ids) == ch


def test_spm_space_prefix_rules(gemma3_md, gemma3):
    """With add_space_prefix, a space goes before the text and after each special token, and the
    first token's leading space is dropped again when detokenizing."""
    md = dict(gemma3_md)
    md["tokenizer.ggml.add_space_prefix"] = True
    tok = Tokenizer.from_metadata(md)
    assert tok.encode("Hello world", add_special=False) == gemma3.encode(" Hello world",
                                                                        add_special=False)
    sot = tok.token_to_id("<start_of_turn>")
    ids = tok.encode("Hi<start_of_turn>user", add_special=True, parse_special=True)
    assert ids == ([tok.bos_id] + gemma3.encode(" Hi", add_special=False) + [sot]
                   + gemma3.encode(" user", add_special=False))
    assert tok.decode(tok.encode("Hello world", add_special=False)) == "Hello world"
    # after a BOS that remove_special drops, the space is kept
    with_bos = tok.encode("Hello", add_special=True)
    assert tok.decode(with_bos, remove_special=True) == " Hello"
    assert "".join(_stream(tok, with_bos, remove_special=True)) == " Hello"
    assert "".join(_stream(tok, with_bos[1:])) == "Hello"


def test_special_ids_and_end_of_generation(smollm2, gemma3):
    assert (smollm2.bos_id, smollm2.eos_id, smollm2.n_vocab) == (1, 2, 49152)
    assert smollm2.add_bos is False
    assert (gemma3.bos_id, gemma3.eos_id, gemma3.n_vocab) == (2, 1, 262144)
    assert gemma3.add_bos is True
    for tok, texts in ((smollm2, ["<|im_end|>", "<|endoftext|>"]),
                       (gemma3, ["<eos>", "<end_of_turn>"])):
        for text in texts:
            tid = tok.token_to_id(text)
            assert tok.is_eog(tid) and tid in tok.eog_ids and tok.is_control(tid)
        assert not tok.is_eog(tok.encode("Hello", add_special=False)[0])
    assert smollm2.token_text(2) == "<|im_end|>"
    assert smollm2.token_attr(1) & ATTR_CONTROL
    # the golden greedy runs that stopped early stopped on an end-of-generation token
    assert smollm2.is_eog(2)


def test_bpe_clean_spaces_and_stream(smollm2_md):
    """gpt-2's pre-tokenizer turns on llama.cpp's clean-up of spaces before punctuation and
    contractions; the stream decoder holds back what the next token could still change."""
    md = dict(smollm2_md)
    md["tokenizer.ggml.pre"] = "gpt-2"
    tok = Tokenizer.from_metadata(md)
    assert tok.clean_spaces
    text = "Hello , world ' s ! I 've got 'em . 'll 're x 'r e ' ' ' end ?"
    ids = tok.encode(text, add_special=False)
    assert tok.detokenize(ids, unparse_special=True).decode() == \
        "Hello, world's! I've got 'em. 'll're x 'r e'''end?"
    tricky = [text, " ' ", "a 're", "a 'r", "x ' 's", "  ,  .  ", " 'v", "'", "  ' ' 's ,"]
    for t in tricky:
        ids = tok.encode(t, add_special=False)
        pieces = _stream(tok, ids)
        assert "".join(pieces) == tok.decode(ids), t
    # per-byte worst case: one token per character, on random strings of the critical bytes
    import random
    rng = random.Random(7)
    for t in tricky + ["".join(rng.choice(" ' ' smrve.,x") for _ in range(rng.randrange(1, 12)))
                       for _ in range(3000)]:
        ids = [tok.token_to_id(c) for c in t.replace(" ", "\u0120")]
        assert "".join(_stream(tok, ids)) == tok.decode(ids), t


def _clean_spaces_reference(text: bytes) -> bytes:
    """Line-by-line port of the clean_spaces passes in llama_vocab::impl::detokenize."""
    t = bytearray(text)
    total1 = len(t)
    total = 1 if total1 else 0
    for i in range(1, total1):  # " ?", " !", " .", " ,"
        x = t[i]
        if t[i - 1] == 0x20 and x in b"?!.,":
            total -= 1
        t[total] = x
        total += 1
    total2 = total
    total = 1 if total2 else 0
    i = 1
    while i < total2:  # " ' "
        x = t[i]
        if x == 0x27 and i + 1 < total2 and t[i - 1] == 0x20 and t[i + 1] == 0x20:
            total -= 1
            i += 1
            t[i] = 0
        t[total] = x
        total += 1
        i += 1
    total3 = total
    total = 1 if total3 else 0
    for i in range(1, total3):  # " 's", " 'm", " 're", " 've"
        x = t[i]
        if t[i - 1] == 0x20 and x == 0x27 and i + 1 < total3:
            x1 = t[i + 1]
            if x1 in b"td":
                pass
            elif x1 in b"sm":
                total -= 1
            elif i + 2 < total3:
                if (x1, t[i + 2]) in ((0x72, 0x65), (0x76, 0x65)):
                    total -= 1
        t[total] = x
        total += 1
    return bytes(t[:total])


def test_clean_spaces_matches_llama_cpp_loops():
    import random
    from llamatui.inference.tokenizers.tokenizer import _clean_spaces
    rng = random.Random(1234)
    alphabet = b" ' ' smrvetdl.,?!x"
    for n in range(0, 14):
        for _ in range(300):
            text = bytes(rng.choice(alphabet) for _ in range(n))
            assert _clean_spaces(text) == _clean_spaces_reference(text), text


# ----------------------------------------------------------------------------- pre-tokenizers


def test_pretokenizer_splits():
    text = "Hello world 12345 \n\n  x"
    assert PreTokenizer([GPT2_REGEX]).split(text) == ["Hello", " world", " 12345", " \n\n ", " x"]
    assert PreTokenizer([r"\p{N}", GPT2_REGEX]).split(text) == [
        "Hello", " world", " ", "1", "2", "3", "4", "5", " \n\n ", " x"]
    assert PreTokenizer([LLAMA3_REGEX]).split(text) == [
        "Hello", " world", " ", "123", "45", " \n\n", " ", " x"]
    assert PreTokenizer([QWEN2_REGEX]).split("I'M ÀÖ 42\u00a0 ab") == [
        "I", "'M", " ÀÖ", " ", "4", "2", "\u00a0", " ab"]
    # contractions are case-sensitive for gpt-2, not for llama3
    assert PreTokenizer([GPT2_REGEX]).split("WE'LL") == ["WE", "'", "LL"]
    assert PreTokenizer([LLAMA3_REGEX]).split("WE'LL") == ["WE", "'LL"]


def test_llama3_pretokenizer_tokenizer(smollm2_md):
    """A llama-bpe vocabulary adds BOS by default and keeps whole-token words unmerged."""
    md = dict(smollm2_md)
    md["tokenizer.ggml.pre"] = "llama-bpe"
    del md["tokenizer.ggml.add_bos_token"]
    tok = Tokenizer.from_metadata(md)
    assert tok.add_bos
    ids = tok.encode("Hello world 12345")
    assert ids[0] == tok.bos_id
    assert tok.decode(ids[1:]) == "Hello world 12345"


# ----------------------------------------------------------------------------- speed (printed)


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_load_and_apache_speed(request, name, golden_dir):
    md = request.getfixturevalue(f"{name}_md")
    t0 = time.perf_counter()
    tok = Tokenizer.from_metadata(md)
    t1 = time.perf_counter()
    text = (golden_dir / "texts" / "apache-2.0.txt").read_text()
    ids = tok.encode(text)
    t2 = time.perf_counter()
    out = tok.decode(ids)
    t3 = time.perf_counter()
    print(f"\n{name}: load {t1 - t0:.3f}s, encode {len(text)} chars → {len(ids)} tokens "
          f"{t2 - t1:.3f}s, decode {t3 - t2:.3f}s")
    assert out == (text if not tok.add_bos else tok.token_text(tok.bos_id) + text)
