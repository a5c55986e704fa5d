"""Gemma 4's tool calls (inference/chat/gemma4.py) beyond what tests/test_harmony.py compares
with llama.cpp's recordings: the calls stream as they are written, a reply cut short keeps its
call as far as it goes (as llama.cpp's lenient parse does), and the calls' grammar, checked with
Gemma 4's own vocabulary (llama.cpp's ggml-vocab-gemma-4.gguf, where the markers are tokens no
text can spell), takes the model's calls and refuses what llama.cpp's grammar refuses."""
import json

import pytest

from llamatui.inference.chat.constraint import Constraint
from llamatui.inference.chat.gemma4 import Gemma4Stream, read_calls
from llamatui.inference.chat.reasoning import GEMMA4
from llamatui.inference.chat.replies import reply_stream
from llamatui.inference.chat.tool_calls import ToolPlan, family_named
from llamatui.inference.tokenizers.tokenizer import Tokenizer
from test_vocab_files import llama_vocabs  # noqa: F401 - a fixture: llama.cpp's test vocabularies

Q = '<|"|>'
WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string"}}}}}]
CALL = f"<|tool_call>call:get_weather{{city:{Q}Paris{Q},days:2}}<tool_call|>"
THOUGHT_CALL = "<|channel>thought\nNeed the weather.<channel|>" + CALL
TWO_CALLS = CALL + f"<|tool_call>call:get_time{{zone:{Q}Europe/Rome{Q}}}<tool_call|>"
NESTED = (f"<|tool_call>call:get_weather{{city:{Q}say \"hi\" \\o/{Q},days:-1.5e2,"
          f"more:{{list:[1, {Q}a{Q},true,null,[]],none:{{}}}}}}<tool_call|>")


def _plan(choice="auto", parallel=False):
    return ToolPlan(family_named("gemma4"), WEATHER, choice, parallel)


def _deltas(text: str, plan, size: int = 3):
    stream = reply_stream(GEMMA4, plan, "auto", "<|turn>model\n")
    deltas = [d for i in range(0, len(text), size) for d in stream.feed(text[i:i + size])]
    return stream, deltas, deltas + stream.finish()


def test_a_call_streams_as_it_is_written():
    stream, before_finish, deltas = _deltas(THOUGHT_CALL, _plan())
    parts = [p for d in before_finish for p in d.get("tool_calls", [])]
    assert parts[0]["function"]["name"] == "get_weather" and parts[0]["id"] and \
        parts[0]["type"] == "function" and parts[0]["index"] == 0
    assert len(parts) > 3  # the arguments came in pieces, before the end
    kinds = [next(iter(d)) for d in deltas]
    assert kinds.index("tool_calls") > kinds.index("reasoning_content")
    args = "".join(p["function"]["arguments"] for d in deltas for p in d.get("tool_calls", []))
    assert args == '{"city":"Paris","days":2}'
    assert stream.message()["tool_calls"][0]["id"] == parts[0]["id"]
    assert stream.message()["reasoning_content"] == "Need the weather."


@pytest.mark.parametrize("size", [1, 2, 5, 1000])
@pytest.mark.parametrize("text", [CALL, THOUGHT_CALL, TWO_CALLS, NESTED])
def test_streamed_deltas_add_up_to_the_message(text, size):
    stream, _, deltas = _deltas(text, _plan(parallel=True), size)
    calls: dict[int, list] = {}
    for d in deltas:
        for part in d.get("tool_calls", []):
            if "id" in part:
                calls[part["index"]] = [part["function"]["name"], ""]
            calls[part["index"]][1] += part["function"]["arguments"]
    message = stream.message()
    assert [tuple(c) for _, c in sorted(calls.items())] == \
        [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
    for c in message["tool_calls"]:
        json.loads(c["function"]["arguments"])


def test_arguments_become_json_as_llama_cpp_writes_it():
    [(_, args)] = read_calls(NESTED, ["get_weather"], None)
    assert args == ('{"city":"say \\"hi\\" \\\\o/","days":-1.5e2,'
                    '"more":{"list":[1,"a",true,null,[]],"none":{}}}')


def test_calls_end_where_llama_cpp_ends_them():
    names = ["get_weather", "get_time"]
    assert len(read_calls(TWO_CALLS, names, None)) == 2
    assert len(read_calls(TWO_CALLS, names, 1)) == 1  # parallel calls off
    assert read_calls(TWO_CALLS, ["get_weather"], None) == [("get_weather",
                                                            '{"city":"Paris","days":2}')]
    # a call that does not parse ends the calls: "1 ," (no space before a comma), "01", text
    for bad in ("{days:[1 ,2]}", "{days:01}", "{days:2}x", "{days:2}}"):
        assert read_calls(f"<|tool_call>call:get_weather{bad}<tool_call|>", names, None) == []


@pytest.mark.parametrize("cut, arguments", [
    # what llama.cpp 11434's common_chat_parse makes of these ends (recorded by hand)
    (f"{{city:{Q}Par", '{"city":"Par'), (f"{{city:{Q}Par<|\"", '{"city":"Par'),
    ("{cit", '{"cit'), (f"{{city:{Q}Paris{Q},", '{"city":"Paris",'), ("{days:tr", '{"days":tr'),
    ("{days:2.", '{"days":2.'), ("{ ", "{"), ("{days:2}<tool_c", '{"days":2}')])
def test_a_reply_cut_short_keeps_its_call_as_far_as_it_goes(cut, arguments):
    stream = Gemma4Stream(_plan(), True)
    stream.feed("<|tool_call>call:get_weather" + cut)
    stream.finish()
    assert stream.message()["tool_calls"][0]["function"]["arguments"] == arguments


def test_thinking_off_prompt_shows_its_empty_thought_without_reasoning_format():
    stream = Gemma4Stream(None, False, "<|turn>model\n<|channel>thought\n<channel|>")
    deltas = stream.feed("Hi") + stream.finish()
    assert "".join(d["content"] for d in deltas) == "<|channel>thought\n<channel|>Hi"


# ------------------------------------------------------------------ the grammar

@pytest.fixture(scope="module")
def gemma4_vocab(llama_vocabs):  # noqa: F811 - the fixture
    return Tokenizer.from_gguf(llama_vocabs / "ggml-vocab-gemma-4.gguf")


def _accepts(tokenizer, spec, text: str) -> bool:
    """Whether the grammar takes `text`, tokenized as Gemma 4 writes it (its markers are single
    tokens), to a match; after tokens the grammar forces, the rest is tokenized anew."""
    def ids_of(t: str) -> list[int]:
        return tokenizer.encode(t, add_special=False, parse_special=True)
    c = Constraint.build(tokenizer, None, spec)
    rest, forced, ids = text.encode(), c.take_forced(), ids_of(text)
    while rest:
        if forced:
            piece = b"".join(tokenizer.token_to_piece(t, True) for t in forced)
            if not rest.startswith(piece):
                return False
            rest, forced = rest[len(piece):], []
            ids = ids_of(rest.decode()) if rest else []
            continue
        token = ids.pop(0)
        if not c.allows(token):
            return False
        forced, rest = c.commit(token), rest[len(tokenizer.token_to_piece(token, True)):]
    return c.accepting


@pytest.mark.parametrize("text", [CALL, THOUGHT_CALL, "Let me look." + CALL, NESTED,
                                  "<|channel>thought\nNo call.<channel|>It is sunny."])
def test_lazy_grammar_takes_text_thoughts_and_calls(gemma4_vocab, text):
    assert _accepts(gemma4_vocab, _plan().constraint(), text)


def test_required_grammar_takes_only_calls(gemma4_vocab):
    required = _plan("required").constraint()
    assert _accepts(gemma4_vocab, required, CALL)
    assert _accepts(gemma4_vocab, required, THOUGHT_CALL)
    assert not _accepts(gemma4_vocab, required, "Let me look." + CALL)
    assert not _accepts(gemma4_vocab, required, "It is sunny.")


def test_grammar_holds_calls_to_the_tools_and_their_count(gemma4_vocab):
    plan = _plan()
    assert not _accepts(gemma4_vocab, plan.constraint(),
                        f"<|tool_call>call:rm_rf{{path:{Q}/{Q}}}<tool_call|>")
    assert not _accepts(gemma4_vocab, plan.constraint(),
                        "<|tool_call>call:get_weather{days:01}<tool_call|>")
    assert not _accepts(gemma4_vocab, plan.constraint(), TWO_CALLS)
    assert _accepts(gemma4_vocab, _plan(parallel=True).constraint(), TWO_CALLS)
