"""gpt-oss (Harmony), Qwen 3.5 and Gemma 4 chats against what llama.cpp's common/chat.cpp does
with them (tests/golden/llama_cpp_chat_formats.json, recorded by tests/record_chat_formats.py
through tests/llama_chat.cpp): the prompt our sandboxed Jinja renders from the model's own
template, and the message our reply readers make of the model's output, fed in pieces as a
stream delivers it."""
import json
import random
import re

import conftest
import pytest

from llamatui.inference.chat.harmony import HarmonyStream, harmony_messages, parse_harmony
from llamatui.inference.chat.reasoning import HARMONY, reasoning_style
from llamatui.inference.chat.replies import reply_stream
from llamatui.inference.chat.template import ChatTemplate
from llamatui.inference.chat.tool_calls import ToolPlan, family_of, family_named

RECORDED = json.loads((conftest.GOLDEN / "llama_cpp_chat_formats.json").read_text())["answers"]
TEMPLATES = conftest.GOLDEN.parent / "data" / "chat_templates"
DATE = re.compile(r"Current date: \d{4}-\d{2}-\d{2}")  # gpt-oss's strftime_now
WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]


def _ids(answer):
    return answer["case"]["name"]


def _source(case) -> str:
    return (TEMPLATES / case["template"]).read_text()


def _plan(case) -> ToolPlan:
    return ToolPlan(family_of(_source(case), False), case.get("tools") or [], "auto",
                    case.get("parallel_tool_calls", False))


def _render(case) -> str:
    """The prompt as the server renders it (app/server/routes.py's _render)."""
    source, plan = _source(case), _plan(case)
    messages = plan.messages([dict(m) for m in case["messages"]])
    if reasoning_style(source) is HARMONY:
        messages = harmony_messages(messages)
    variables = {"enable_thinking": case.get("enable_thinking", True), **case.get("kwargs", {})}
    variables.update(plan.template_variables())
    return ChatTemplate(source).render(messages, **variables)


@pytest.mark.parametrize("answer", RECORDED, ids=_ids)
def test_prompt_renders_as_llama_cpp_renders_it(answer):
    expected = answer["llama_cpp"]["prompt"]
    assert DATE.sub("", _render(answer["case"])) == DATE.sub("", expected)


def _comparable(message: dict) -> dict:
    """A message without empty fields, its calls without ids (llama.cpp leaves them to the
    server)."""
    out = {k: v for k, v in message.items() if v not in (None, "", [])}
    if "tool_calls" in out:
        out["tool_calls"] = [{"type": "function", "function": c["function"]}
                             for c in out["tool_calls"]]
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("answer", [a for a in RECORDED if a["case"]["outputs"]], ids=_ids)
def test_reply_parses_as_llama_cpp_parses_it(answer, seed):
    case, recorded = answer["case"], answer["llama_cpp"]
    style = reasoning_style(_source(case))
    rng = random.Random(seed)
    for output, expected in zip(case["outputs"], recorded["parsed"]):
        reply = reply_stream(style, _plan(case), case.get("reasoning_format", "auto"),
                             recorded["prompt"])
        i = 0
        while i < len(output):  # pieces of 1-6 characters (seed 0: the whole text at once)
            n = rng.randint(1, 6) if seed else len(output)
            reply.feed(output[i:i + n])
            i += n
        reply.finish()
        assert _comparable(reply.message()) == _comparable(expected), output


def test_template_styles_follow_llama_cpp_detection():
    for answer in RECORDED:
        style = reasoning_style(_source(answer["case"]))
        recorded = answer["llama_cpp"]
        assert style.start == recorded["thinking_start_tag"]
        assert [*style.end_tags, *filter(None, [style.call_ends])] == \
            recorded["thinking_end_tags"]
        assert list(style.preserved) == recorded["preserved_tokens"]


# ------------------------------------------------------------------ what a client sees

TOKENS = ["<|channel|>", "analysis", "<|message|>", "The", " user", " asks", ".", "<|end|>",
          "<|start|>", "assistant", "<|channel|>", "final", "<|message|>", "Hello", "!"]


def _stream(tokens, plan=None, reasoning=True):
    stream = HarmonyStream(plan, reasoning)
    deltas = [d for t in tokens for d in stream.feed(t)]
    return stream, deltas + stream.finish()


def test_streamed_reply_gives_reasoning_then_content():
    stream, deltas = _stream(TOKENS)
    kinds = [next(iter(d)) for d in deltas]
    assert kinds == ["reasoning_content"] * 4 + ["content"] * 2
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "The user asks."
    assert "".join(d.get("content", "") for d in deltas) == "Hello!"
    assert stream.message() == {"role": "assistant", "content": "Hello!",
                                "reasoning_content": "The user asks."}


def test_no_marker_reaches_the_client():
    _, deltas = _stream(TOKENS)
    text = "".join(v for d in deltas for v in d.values())
    assert "<|" not in text and "assistant" not in text


def test_reasoning_format_none_keeps_the_analysis_in_the_content():
    stream, deltas = _stream(TOKENS, reasoning=False)
    assert all("reasoning_content" not in d for d in deltas)
    assert stream.message()["content"] == \
        "<|channel|>analysis<|message|>The user asks.<|end|>Hello!"


def test_streamed_tool_call_comes_out_as_tool_calls():
    plan = ToolPlan(family_named("harmony"), WEATHER, "auto", False)
    tokens = ["<|channel|>", "analysis", "<|message|>", "Weather", ".", "<|end|>", "<|start|>",
              "assistant", "<|channel|>", "commentary", " to", "=", "functions", ".", "get",
              "_weather", " ", "<|constrain|>", "json", "<|message|>", '{"', "city", '":"',
              "Paris", '"}']
    stream, deltas = _stream(tokens, plan)
    parts = [p for d in deltas for p in d.get("tool_calls", [])]
    assert parts[0]["function"]["name"] == "get_weather" and parts[0]["id"] and \
        parts[0]["type"] == "function" and parts[0]["index"] == 0
    assert "".join(p["function"]["arguments"] for p in parts) == '{"city":"Paris"}'
    assert deltas.index({"reasoning_content": "Weather"}) < deltas.index(
        next(d for d in deltas if "tool_calls" in d))
    message = stream.message()
    assert message["content"] is None and message["reasoning_content"] == "Weather."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in message["tool_calls"]] == [("get_weather", {"city": "Paris"})]


def test_a_call_without_tools_offered_is_dropped():
    text = ("<|channel|>analysis<|message|>Search.<|end|><|start|>assistant<|channel|>commentary"
            ' to=browser.search <|constrain|>json<|message|>{"query": "x"}')
    assert parse_harmony(text) == {"role": "assistant", "content": "",
                                   "reasoning_content": "Search."}
    # and so is a functions call when the request offered no tools
    text = text.replace("browser.search", "functions.get_weather")
    assert "tool_calls" not in parse_harmony(text)


def test_text_without_any_header_is_content():
    assert parse_harmony("Just words.")["content"] == "Just words."


def test_history_reasoning_becomes_thinking_and_tool_call_content_goes():
    messages = [{"role": "assistant", "content": "", "reasoning_content": "Why.",
                 "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
                {"role": "assistant", "content": "Answer.", "reasoning_content": "Because."}]
    first, second = harmony_messages(messages)
    assert first["thinking"] == "Why." and "content" not in first
    assert second["thinking"] == "Because." and second["content"] == "Answer."
