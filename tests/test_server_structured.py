"""Structured output and tool calls through the official `openai` client against `llamatui serve`
(issue 14): `response_format` json_schema for every schema of tests/data/json_schemas.json on
SmolLM2 (a share on Gemma 3), json_object, llama-server's `grammar` / `json_schema` fields, and
tools: a call whose arguments validate against the declared parameters, streamed and not,
tool_choice required / none / named, a `role: "tool"` reply continued.

SmolLM2's template knows nothing of tools, so these run llama.cpp's generic format (the tools in
a system message, the reply constrained to `{"tool_call": ...}` / `{"response": ...}`); the
native families' formats are checked by tests/test_tool_calls.py from recorded outputs."""
import json
import pathlib
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

from server_helpers import http, serve

KEY = "sk-structured"
N_SLOTS = 4
SCHEMAS = json.loads((pathlib.Path(__file__).parent / "data" / "json_schemas.json").read_text())
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "additionalProperties": False,
                   "required": ["city", "unit"],
                   "properties": {"city": {"type": "string", "minLength": 1},
                                  "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a time zone.",
    "parameters": {"type": "object", "required": ["zone"],
                   "properties": {"zone": {"type": "string"}}}}}
ASK = [{"role": "user", "content": "What is the weather like in Paris right now?"}]


def _validate(value, schema: dict) -> None:
    cls = jsonschema.validators.validator_for(schema)
    cls(schema, format_checker=cls.FORMAT_CHECKER).validate(value)


@pytest.fixture(scope="module")
def server(smollm2_path):
    with serve(smollm2_path, "-c", str(N_SLOTS * 512), "-np", str(N_SLOTS), "-t", "2",
               "--api-key", KEY) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, timeout=300, max_retries=0)


def _schema_reply(client, entry, **sampling):
    r = client.chat.completions.create(
        model="x", temperature=0, max_tokens=entry["max_tokens"], **sampling,
        messages=[{"role": "user", "content": f"Give one example of {entry['name']} as JSON."}],
        response_format={"type": "json_schema", "json_schema": {
            "name": "answer", "schema": entry["schema"], "strict": True}})
    return entry, r.choices[0]


def _check_schemas(client, entries, **sampling):
    failures = []
    with ThreadPoolExecutor(N_SLOTS) as pool:  # the server's slots decode them side by side
        for entry, choice in pool.map(lambda e: _schema_reply(client, e, **sampling), entries):
            try:
                assert choice.finish_reason == "stop", f"stopped by {choice.finish_reason}"
                _validate(json.loads(choice.message.content), entry["schema"])
            except (AssertionError, ValueError, jsonschema.ValidationError) as e:
                failures.append(f"{entry['name']}: {choice.message.content[:200]!r}: "
                                f"{str(e).splitlines()[0]}")
    if failures:
        pytest.fail("\n".join(failures))


def test_every_schema_validates_through_response_format(client):
    assert len(SCHEMAS) >= 50
    _check_schemas(client, SCHEMAS)


def test_json_object_and_llama_server_fields(client, server):
    r = client.chat.completions.create(
        model="x", temperature=0, max_tokens=64, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}])
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    # llama-server's own fields: GBNF `grammar` on /v1/completions, `json_schema` on /completion
    r = client.completions.create(model="x", prompt="The answer is", max_tokens=16,
                                  temperature=0, extra_body={"grammar": 'root ::= "yes" | "no"'})
    assert r.choices[0].text in ("yes", "no")
    schema = {"type": "object", "required": ["n"], "additionalProperties": False,
              "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 9}}}
    status, _, raw = server.post("/completion", {"prompt": "A number as JSON:", "n_predict": 32,
                                                 "json_schema": schema, "temperature": 0},
                                 headers={"Authorization": f"Bearer {KEY}"})
    assert status == 200, raw
    _validate(json.loads(json.loads(raw)["content"]), schema)


def test_unusable_schema_is_a_400_naming_what_is_unsupported(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="x", messages=ASK, max_tokens=8, response_format={
                "type": "json_schema", "json_schema": {"name": "x", "schema": {
                    "type": "object", "not": {"required": ["a"]}}}})
    assert e.value.body["param"] == "response_format" and "not" in e.value.body["message"]


def _arguments(call, tool):
    assert call.type == "function" and call.id
    assert call.function.name == tool["function"]["name"]
    args = json.loads(call.function.arguments)
    _validate(args, tool["function"]["parameters"])
    return args


def test_required_tool_call_validates_against_its_parameters(client):
    r = client.chat.completions.create(model="x", messages=ASK, tools=[WEATHER, TIME],
                                       tool_choice="required", temperature=0, max_tokens=128)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert len(choice.message.tool_calls) == 1 and choice.message.content is None
    call = choice.message.tool_calls[0]
    tool = WEATHER if call.function.name == "get_weather" else TIME
    _arguments(call, tool)


def test_named_tool_choice_calls_that_function(client):
    r = client.chat.completions.create(
        model="x", messages=ASK, tools=[WEATHER, TIME], temperature=0, max_tokens=128,
        tool_choice={"type": "function", "function": {"name": "get_time"}})
    (call,) = r.choices[0].message.tool_calls
    _arguments(call, TIME)


def test_tool_choice_none_answers_in_text(client):
    r = client.chat.completions.create(model="x", messages=ASK, tools=[WEATHER],
                                       tool_choice="none", temperature=0, max_tokens=24)
    choice = r.choices[0]
    assert not choice.message.tool_calls and choice.message.content
    assert choice.finish_reason in ("stop", "length")


def test_auto_gives_a_call_or_an_answer(client):
    r = client.chat.completions.create(model="x", messages=ASK, tools=[WEATHER],
                                       temperature=0, max_tokens=128)
    choice = r.choices[0]
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls"
        _arguments(choice.message.tool_calls[0], WEATHER)
    else:
        assert choice.message.content and choice.finish_reason == "stop"


def test_streamed_tool_call_deltas_as_openai_sends_them(client):
    chunks = list(client.chat.completions.create(
        model="x", messages=ASK, tools=[WEATHER], tool_choice="required", temperature=0,
        max_tokens=128, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    parts = [tc for d in deltas for tc in d.tool_calls or []]
    assert parts and all(p.index == 0 for p in parts)
    first, rest = parts[0], parts[1:]
    assert first.id and first.type == "function" and first.function.name == "get_weather"
    assert rest and all(p.id is None and p.function.name is None for p in rest)
    arguments = "".join(p.function.arguments or "" for p in parts)
    _validate(json.loads(arguments), WEATHER["function"]["parameters"])
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    # the same call as the answer that is not streamed
    r = client.chat.completions.create(model="x", messages=ASK, tools=[WEATHER],
                                       tool_choice="required", temperature=0, max_tokens=128)
    assert json.loads(r.choices[0].message.tool_calls[0].function.arguments) == \
        json.loads(arguments)


def test_a_tool_reply_is_continued(client):
    r = client.chat.completions.create(model="x", messages=ASK, tools=[WEATHER],
                                       tool_choice="required", temperature=0, max_tokens=128)
    call = r.choices[0].message.tool_calls[0]
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id,
         "content": json.dumps({"temperature": 18, "sky": "clear"})}]
    r = client.chat.completions.create(model="x", messages=history, tools=[WEATHER],
                                       temperature=0, max_tokens=96)
    choice = r.choices[0]
    if choice.message.tool_calls:  # a small model may ask again; it must still be well formed
        _arguments(choice.message.tool_calls[0], WEATHER)
    else:
        assert choice.message.content.strip()
    # the reply reached the prompt, rendered by the template
    status, _, raw = _apply_template(client, history)
    assert status == 200 and "18" in json.loads(raw)["prompt"]


def _apply_template(client, messages):
    return http("POST", str(client.base_url).removesuffix("/v1/") + "/apply-template",
                {"messages": messages}, headers={"Authorization": f"Bearer {KEY}"})


# ---------------------------------------------------------------------------- a native family

@pytest.fixture(scope="module")
def qwen_style(smollm2_path):
    """SmolLM2 spoken to in Qwen 2.5's template: the tools go through the template's own
    `tools` block and calls come as <tool_call> JSON, constrained lazily."""
    template = pathlib.Path(__file__).parent / "data" / "chat_templates" / \
        "Qwen-Qwen2.5-7B-Instruct.jinja"
    with serve(smollm2_path, "-c", "2048", "-np", "2", "-t", "2", "--api-key", KEY,
               "--chat-template-file", str(template)) as s:
        yield openai.OpenAI(base_url=s.url + "/v1", api_key=KEY, timeout=300, max_retries=0), s


def test_hermes_family_renders_tools_and_constrains_the_call(qwen_style):
    client, server = qwen_style
    status, _, raw = http("POST", server.url + "/apply-template", {"messages": ASK},
                          headers={"Authorization": f"Bearer {KEY}"})
    assert status == 200 and "<|im_start|>" in json.loads(raw)["prompt"]
    r = client.chat.completions.create(model="x", messages=ASK, tools=[WEATHER, TIME],
                                       tool_choice="required", temperature=0, max_tokens=128)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    _arguments(call, WEATHER if call.function.name == "get_weather" else TIME)
    chunks = list(client.chat.completions.create(
        model="x", messages=ASK, tools=[WEATHER], temperature=0, max_tokens=128, stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    parts = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert parts[0].function.name == "get_weather" and parts[0].id
    _validate(json.loads("".join(p.function.arguments or "" for p in parts)),
              WEATHER["function"]["parameters"])


def test_hermes_family_lazy_grammar_lets_text_through(qwen_style):
    """tool_choice auto: free text is not constrained (the grammar waits for <tool_call>);
    whatever the model writes, a call it makes is well formed."""
    client, _ = qwen_style
    r = client.chat.completions.create(
        model="x", temperature=0, max_tokens=48, tools=[WEATHER],
        messages=[{"role": "user", "content": "Write one sentence about the sea."}])
    choice = r.choices[0]
    for call in choice.message.tool_calls or []:
        _arguments(call, WEATHER)
    if not choice.message.tool_calls:
        assert choice.message.content and "<tool_call>" not in choice.message.content


# ---------------------------------------------------------------------------- Gemma 3

def test_every_schema_validates_on_gemma3_through_response_format(gemma3_path):
    with serve(gemma3_path, "-c", str(N_SLOTS * 512), "-np", str(N_SLOTS), "-t", "2",
               "--api-key", KEY) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key=KEY, timeout=300, max_retries=0)
        _check_schemas(client, SCHEMAS)
