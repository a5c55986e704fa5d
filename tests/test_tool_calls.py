"""Tool-call parsing per chat-template family (inference/chat/tool_calls.py) from outputs in each
family's format (tests/data/tool_call_outputs.json: replies the model makers published from their
models, "recorded": Qwen 2.5's parallel calls, Llama 3.1's JSON and built-in tool calls; and
replies written from each family's documented format, as no model of those families is available
offline; each entry names its source), with the templates of
those families (tests/data/chat_templates/: Qwen 2.5, Qwen 3, Hermes 2 Pro, Llama 3.1 and
Mistral Nemo, as llama.cpp's models/templates carries them):

- the reply parses into its content, calls (name, arguments) and reasoning, whole or streamed in
  pieces of any size (the streamed deltas add up to the same message);
- the family's grammar (lazy, or required from the first token) accepts the output;
- each template is recognised as its family and renders the tools, an assistant's tool calls
  and the tool's reply into the prompt."""
import json
import pathlib

import pytest

from llamatui.inference.chat.tool_calls import (FAMILIES, ReplyStream, ToolPlan, family_named,
                                            family_of)
from llamatui.inference import ConstraintSpec
from llamatui.inference.chat.template import ChatTemplate
from llamatui.inference.chat.constraint import Constraint
from llamatui.inference.tokenizers.tokenizer import Tokenizer

DATA = pathlib.Path(__file__).parent / "data"
OUTPUTS = json.loads((DATA / "tool_call_outputs.json").read_text())
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "required": ["city", "unit"],
                   "properties": {"city": {"type": "string"},
                                  "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The local time in a zone.",
        "parameters": {"type": "object", "required": ["zone"],
                       "properties": {"zone": {"type": "string"}}}}},
    # the tools of the recorded Qwen 2.5 replies (QwenLM/Qwen2.5's function-calling guide)
    {"type": "function", "function": {
        "name": "get_current_temperature", "description": "Get current temperature at a location.",
        "parameters": {"type": "object", "required": ["location"], "properties": {
            "location": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}},
    {"type": "function", "function": {
        "name": "get_temperature_date", "description": "Get temperature at a location and date.",
        "parameters": {"type": "object", "required": ["location", "date"], "properties": {
            "location": {"type": "string"}, "date": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}}]
TEMPLATES = {"Qwen-Qwen2.5-7B-Instruct.jinja": "hermes", "Qwen-Qwen3-0.6B.jinja": "hermes",
             "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": "hermes",
             "meta-llama-Llama-3.1-8B-Instruct.jinja": "llama3",
             "mistralai-Mistral-Nemo-Instruct-2407.jinja": "mistral"}


def _plan(entry, choice="auto"):
    return ToolPlan(family_named(entry["family"]), TOOLS, choice, entry.get("parallel", False))


def _expected(entry):
    return [(name, args) for name, args in entry["calls"]]


def _ids(entry):
    return f"{entry['family']}: {entry['source']}: {entry['text'][:30]}"


def test_every_family_has_recorded_outputs():
    assert {e["family"] for e in OUTPUTS} == {f.name for f in FAMILIES}


@pytest.mark.parametrize("entry", OUTPUTS, ids=_ids)
def test_whole_reply_parses(entry):
    reply = ReplyStream(_plan(entry), reasoning=True, opened=False)
    reply.feed(entry["text"])
    reply.finish()
    msg = reply.message()
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
             for c in msg.get("tool_calls", [])]
    assert calls == _expected(entry)
    assert (msg["content"] or "") == entry["content"]
    assert msg.get("reasoning_content") == entry.get("reasoning")
    if "ids" in entry:
        assert [c["id"] for c in msg["tool_calls"]] == entry["ids"]


@pytest.mark.parametrize("size", [1, 3, 7])
@pytest.mark.parametrize("entry", OUTPUTS, ids=_ids)
def test_streamed_deltas_add_up_to_the_reply(entry, size):
    reply = ReplyStream(_plan(entry), reasoning=True, opened=False)
    text = entry["text"]
    deltas = [d for i in range(0, len(text), size) for d in reply.feed(text[i:i + size])]
    # calls stream as they are written (Mistral's and built-in ones are parsed at the end)
    if entry["calls"] and entry["family"] != "mistral" and entry.get("streamed", True):
        assert any("tool_calls" in d for d in deltas)
    deltas += reply.finish()
    content = "".join(d.get("content", "") for d in deltas)
    thought = "".join(d.get("reasoning_content", "") for d in deltas)
    assert content.strip() == entry["content"]
    assert thought.strip() == (entry.get("reasoning") or "")
    calls: dict[int, dict] = {}
    for d in deltas:
        for part in d.get("tool_calls", []):
            if "id" in part:  # a call's first delta: index, id, type, name
                assert part["type"] == "function" and part["index"] not in calls
                calls[part["index"]] = {"name": part["function"]["name"], "arguments": ""}
            calls[part["index"]]["arguments"] += part["function"]["arguments"]
    assert [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())] == \
        _expected(entry)


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    return Tokenizer.from_gguf(smollm2_path)


def _tokens(tokenizer, text: str, marker: str | None) -> list[int]:
    """`text` as a model of the family writes it: its call marker (<tool_call>, [TOOL_CALLS])
    is a token of its own there, so SmolLM2's BPE must not merge it with what follows."""
    if not marker or marker not in text:
        return tokenizer.encode(text, add_special=False)
    ids = []
    for i, part in enumerate(text.split(marker)):
        ids += tokenizer.encode(marker, add_special=False) if i else []
        ids += tokenizer.encode(part, add_special=False) if part else []
    return ids


def _accepts(tokenizer, spec: ConstraintSpec, text: str, marker: str | None = None) -> bool:
    """Whether the grammar takes `text` (tokenized as a model would write it) to a match; tokens
    the grammar forces are its own tokenization of the text, so the rest is tokenized anew."""
    c = Constraint.build(tokenizer, None, spec)
    rest, forced = text.encode(), c.take_forced()
    ids = _tokens(tokenizer, text, marker)
    while rest:
        if forced:
            piece = b"".join(tokenizer.token_to_piece(t) for t in forced)
            if not rest.startswith(piece):
                return False
            rest, forced = rest[len(piece):], []
            ids = _tokens(tokenizer, rest.decode(), marker) if rest else []
            continue
        token = ids.pop(0)
        if not c.allows(token):
            return False
        forced, rest = c.commit(token), rest[len(tokenizer.token_to_piece(token)):]
    return c.accepting


# (not the recorded replies our grammar would have written otherwise: pretty-printed JSON with
# an extra key, Llama 3.1's built-in calls)
@pytest.mark.parametrize("entry", [e for e in OUTPUTS if "reasoning" not in e
                                   and e.get("grammar", True)], ids=_ids)
def test_the_family_grammar_accepts_its_output(tokenizer, entry):
    plan = _plan(entry)
    marker = plan.family.trigger if plan.family.trigger != "{" else None
    assert _accepts(tokenizer, plan.constraint(), entry["text"], marker)
    # a call required from the first token: only calls, no text before them (and no
    # <|python_tag|>: a required Llama 3 call is its JSON at once)
    required = _plan(entry, "required").constraint()
    text = entry["text"].removeprefix("<|python_tag|>")
    assert _accepts(tokenizer, required, text, marker) == bool(entry["calls"] and
                                                            not entry["content"])


def test_grammar_refuses_a_call_to_an_undeclared_function_or_bad_arguments(tokenizer):
    plan = ToolPlan(family_named("hermes"), TOOLS, "auto", False)
    bad_name = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    bad_args = '<tool_call>\n{"name": "get_weather", "arguments": {"city": 3}}\n</tool_call>'
    assert not _accepts(tokenizer, plan.constraint(), bad_name)
    assert not _accepts(tokenizer, plan.constraint(), bad_args)
    named = ToolPlan(family_named("generic"), TOOLS, "get_time", False)
    weather = ('{"tool_call": {"name": "get_weather", '
               '"arguments": {"city": "P", "unit": "celsius"}}}')
    assert not _accepts(tokenizer, named.constraint(), weather)


@pytest.mark.parametrize("name, family", TEMPLATES.items())
def test_templates_render_tools_calls_and_replies(name, family):
    source = (DATA / "chat_templates" / name).read_text()
    assert family_of(source, builtin=False).name == family
    plan = ToolPlan(family_of(source, False), TOOLS, "auto", False)
    call = {"id": "call00001", "type": "function",
            "function": {"name": "get_weather",
                         "arguments": '{"city": "Paris", "unit": "celsius"}'}}
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": "", "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call00001", "content": '{"temperature": 18}'}]
    template = ChatTemplate(source, bos_token="<s>", eos_token="</s>")
    prompt = template.render(plan.messages(history), tools=plan.tools)
    assert "get_time" in prompt  # the declared tools are described
    assert '"city": "Paris"' in prompt  # the call
    assert "temperature" in prompt and "18" in prompt  # its reply (Llama 3.1's quotes it)


def test_llama31_announces_its_built_in_tools():
    source = (DATA / "chat_templates" / "meta-llama-Llama-3.1-8B-Instruct.jinja").read_text()
    search = {"type": "function", "function": {
        "name": "brave_search", "description": "Web search.",
        "parameters": {"type": "object", "required": ["query"],
                       "properties": {"query": {"type": "string"}}}}}
    plan = ToolPlan(family_of(source, False), [search, *TOOLS[:1]], "auto", False)
    variables = plan.template_variables()
    assert variables["builtin_tools"] == ["brave_search"]
    prompt = ChatTemplate(source, bos_token="<s>", eos_token="</s>").render(
        [{"role": "user", "content": "Gold price?"}], **variables)
    assert "Tools: brave_search" in prompt and "Environment: ipython" in prompt
    hermes = ToolPlan(family_named("hermes"), [search], "auto", False)
    assert "builtin_tools" not in hermes.template_variables()


def test_generic_family_describes_tools_in_a_system_message():
    plan = ToolPlan(family_named("generic"), TOOLS, "required", False)
    msgs = plan.messages([{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": "Weather?"}])
    assert msgs[0]["role"] == "system" and msgs[0]["content"].startswith("Be brief.")
    assert "get_weather" in msgs[0]["content"] and "tool_call" in msgs[0]["content"]
    assert ToolPlan(family_named("generic"), TOOLS, "none", False).constraint() is None


def _message(text, opened=False):
    reply = ReplyStream(None, reasoning=True, opened=opened)
    reply.feed(text)
    reply.finish()
    return reply.message()


def test_reasoning_split():
    """llama-server's --reasoning-format deepseek: a <think> block at the start, or one the
    prompt opened, becomes reasoning_content."""
    msg = _message("<think>a plan</think>\nThe answer.")
    assert (msg["reasoning_content"], msg["content"]) == ("a plan", "The answer.")
    msg = _message("a plan</think>The answer.", opened=True)
    assert (msg["reasoning_content"], msg["content"]) == ("a plan", "The answer.")
    assert _message("No thoughts.") == {"role": "assistant", "content": "No thoughts."}
    msg = _message("<think>cut short")
    assert (msg["reasoning_content"], msg["content"]) == ("cut short", "")
    reply = ReplyStream(None, reasoning=True, opened=True)  # the prompt opened <think>
    deltas = reply.feed("weighing it</thi") + reply.feed("nk>Done.") + reply.finish()
    assert deltas == [{"reasoning_content": "weighing it"}, {"content": "Done."}]
    plain = ReplyStream(None, reasoning=False, opened=False)
    assert plain.feed("<think>x</think>y") + plain.finish() == [{"content": "<think>x</think>y"}]


def test_history_without_call_ids_renders():
    """A client may leave out a call's id (schemathesis did): the history still renders."""
    call = {"type": "function", "function": {"name": "get_time", "arguments": "{}"}}
    history = [{"role": "assistant", "content": "", "tool_calls": [call]},
               {"role": "tool", "content": "noon"}]
    for name in ("generic", "hermes"):
        msgs = ToolPlan(family_named(name), TOOLS, "auto", False).messages(history)
        assert "get_time" in json.dumps(msgs) and "noon" in json.dumps(msgs)
