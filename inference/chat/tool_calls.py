"""Tool calls and reasoning in chat replies: how a chat-template family asks for tools, how its
calls are constrained, and how they are read back out of the model's text.

llama-server does this in common/chat.cpp: it recognises a template family from the template's
source, renders the tools through the template (or, for a template that knows nothing of tools,
describes them in a system message: its "generic" format), constrains the call with a grammar
that is switched on only when the model starts one (a lazy grammar, triggered by the family's
opening marker; from the first token when a call is required), and parses the output into
`content`, `tool_calls` and `reasoning_content` (`<think>...</think>`, --reasoning-format).

One small `Family` per format, in `FAMILIES` (first match wins; generic last):

- hermes: Hermes 2 Pro, Qwen 2.5, Qwen 3:
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`
- llama3: Llama 3.1-3.3 JSON calls: `{"name": ..., "parameters": {...}}` (after `<|python_tag|>`),
  and Llama 3.1's built-in tool calls `<|python_tag|>brave_search.call(query="...")`
- mistral: Mistral Nemo / Small: `[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}]`
- gemma4: Gemma 4: `<|tool_call>call:NAME{key:<|"|>text<|"|>,n:2}<tool_call|>` (chat.gemma4)
- generic: any other template: `{"tool_call": {"name": ..., "arguments": ...}}` (or
  `{"tool_calls": [...]}` with parallel calls), `{"response": "..."}` for a plain answer; the
  whole reply is constrained by this JSON schema, as llama.cpp's generic format does.

The lazy grammar is llguidance's Lark: a free-text lexeme that stops at the trigger
(`text[stop="<tool_call>"]`), then the calls as `%json` schemas; or free text to the end.
"""
from __future__ import annotations

import ast
import json
import re
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass, field

from .constraint import ConstraintSpec
from .json_schema import generation_schema
from .reasoning import THINK, ReasoningStyle

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ARGUMENT_FRAGMENT = 24  # characters of arguments per streamed delta (OpenAI sends fragments)
# llguidance's JSON layout for calls, as the rest of the server writes JSON
_X_GUIDANCE = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


class ToolCallError(ValueError):
    """A tools request that cannot be served (an unknown function named in tool_choice...)."""


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    # 9 letters and digits: what Mistral's templates demand of ids; opaque to other clients
    id: str = field(default_factory=lambda: "".join(
        secrets.choice(string.ascii_letters + string.digits) for _ in range(9)))

    def openai(self, index: int | None = None) -> dict:
        out = {"id": self.id, "type": "function",
               "function": {"name": self.name, "arguments": self.arguments}}
        return out if index is None else {"index": index, **out}


def _arguments_text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _json_values(text: str) -> list:
    """Every JSON value in `text`, in order, skipping what is between them (';', ',', spaces)."""
    decoder, out, i = json.JSONDecoder(), [], 0
    while i < len(text):
        if text[i] in "{[":
            try:
                value, end = decoder.raw_decode(text, i)
            except ValueError:
                i += 1
                continue
            out.append(value)
            i = end
        else:
            i += 1
    return out


def _calls_from(values, args_key: str = "arguments") -> list[ToolCall]:
    calls = []
    for v in values:
        for item in v if isinstance(v, list) else [v]:
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                args = item.get(args_key, item.get("arguments", {}))
                call = ToolCall(item["name"], _arguments_text(args))
                if isinstance(item.get("id"), str) and item["id"]:
                    call.id = item["id"]
                calls.append(call)
    return calls


# ---------------------------------------------------------------------------- the families

@dataclass(frozen=True)
class Family:
    """name; detect(template source) -> bool; trigger: the text that opens a call (None: the
    call is the whole reply); parse(text) -> (content, calls); grammar(call schema, parallel,
    required) -> a Lark grammar; native: the template renders `tools` itself."""
    name: str
    detect: Callable[[str], bool]
    trigger: str | None
    parse: Callable[[str], tuple[str, list[ToolCall]]]
    grammar: Callable[[dict, bool, bool], str] | None
    native: bool = True
    args_key: str = "arguments"
    call_ids: bool = False  # a call may carry its own id (Mistral's 9 characters)
    # tool names the template announces as built-in (its `builtin_tools` variable)
    builtin_tools: tuple[str, ...] = ()
    # the model writes its calls in its own channels, read by its own stream (chat.harmony);
    # no constraint: llguidance's Lark cannot name its control tokens
    unconstrained: bool = False
    # parse(text, tools): argument values are typed by the tools' parameter schemas
    typed_args: bool = False


def _split_at(text: str, marker: str) -> tuple[str, str]:
    i = text.find(marker)
    return (text, "") if i < 0 else (text[:i], text[i:])


def _parse_hermes(text: str):
    content, rest = _split_at(text, "<tool_call>")
    bodies = re.findall(r"<tool_call>(.*?)(?:</tool_call>|$)", rest, re.DOTALL)
    return content.strip(), _calls_from(v for b in bodies for v in _json_values(b)[:1])


def _parse_llama3(text: str):
    stripped = text.strip().removeprefix("<|python_tag|>").strip()
    if not stripped.startswith("{"):
        builtin = _builtin_call(stripped) if text.lstrip().startswith("<|python_tag|>") else None
        return ("", [builtin]) if builtin else (text.strip(), [])
    calls = _calls_from(_json_values(stripped), "parameters")
    return ("", calls) if calls else (text.strip(), [])


# Llama 3.1's built-in tools (brave_search, wolfram_alpha...) are called in Python syntax after
# <|python_tag|>; llama.cpp reads them as a call of that name with the keywords as arguments
_BUILTIN_CALL = re.compile(r"([A-Za-z_]\w*)\s*\.\s*call\s*\((.*)\)", re.DOTALL)


def _builtin_call(text: str) -> ToolCall | None:
    """`name.call(key=literal, ...)` as a ToolCall, or None when `text` is not one."""
    m = _BUILTIN_CALL.fullmatch(text)
    if m is None:
        return None
    try:  # parsed, never evaluated: only literal values are taken
        call = ast.parse(f"f({m.group(2)})", mode="eval").body
        if call.args or any(k.arg is None for k in call.keywords):
            return None
        args = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
        return ToolCall(m.group(1), json.dumps(args, ensure_ascii=False))
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
        return None


def _parse_mistral(text: str):
    content, rest = _split_at(text, "[TOOL_CALLS]")
    values = _json_values(rest[len("[TOOL_CALLS]"):]) if rest else []
    return content.strip(), _calls_from(values[:1])


def _parse_generic(text: str):
    values = _json_values(text)
    if not values or not isinstance(values[0], dict):
        return text.strip(), []
    v = values[0]
    if "tool_calls" in v:
        return "", _calls_from([v["tool_calls"]])
    if "tool_call" in v:
        return "", _calls_from([v["tool_call"]])
    if isinstance(v.get("response"), str):
        return v["response"], []
    return text.strip(), []


_XML_CALL = re.compile(r"<tool_call>\s*<function=([^>\n]+)>\n?(.*?)</function>", re.DOTALL)
_XML_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


def _parse_xml_calls(text: str, tools: list[dict]):
    """Qwen3-Coder / Qwen 3.5 calls (common/parsers/qwen3-coder.cpp): `<tool_call>`,
    `<function=NAME>`, one `<parameter=KEY>` block per argument, its value on the lines
    between; a value is text when its parameter's schema is only a string, else JSON when it
    reads as JSON. Content before the first call is kept as written."""
    content, rest = _split_at(text, "<tool_call>")
    schemas = {t["function"]["name"]: (t["function"].get("parameters") or {}).get(
        "properties") or {} for t in tools}
    calls = []
    for name, body in _XML_CALL.findall(rest):
        props, args = schemas.get(name, {}), {}
        for key, value in _XML_PARAM.findall(body):
            args[key] = _typed_value(value, props.get(key) or {})
        calls.append(ToolCall(name, json.dumps(args, ensure_ascii=False,
                                               separators=(",", ":"))))
    return content, calls


def _typed_value(value: str, schema: dict):
    types = schema.get("type")
    types = [types] if isinstance(types, str) else types or []
    if types == ["string"]:
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def _lazy(calls: str, trigger: str) -> str:
    """llama.cpp's lazy grammar in llguidance's Lark: free text to the end, or free text up to
    the trigger (stop= ends the text lexeme there) and then `after`, the calls (in `calls`)."""
    return (f"start: text | opened after\ntext[stop=\"\"]: /(?s:.*)/\n"
            f"opened[stop={json.dumps(trigger)}]: /(?s:.*)/\n{calls}")


def _json(schema: dict) -> str:
    return "%json " + json.dumps({**generation_schema(schema), "x-guidance": _X_GUIDANCE})


def _hermes_grammar(call: dict, parallel: bool, required: bool) -> str:
    one = f'"\\n" {_json(call)} "\\n</tool_call>"'
    more = ' (/\\s*/ "<tool_call>" body)*' if parallel else ""
    if required:
        return f'start: "<tool_call>" body{more}\nbody: {one}'
    return _lazy(f"after: body{more}\nbody: {one}", "<tool_call>")


def _llama3_grammar(call: dict, parallel: bool, required: bool) -> str:
    calls = f'{_json(call)}' + (f' (";" {_json(call)})*' if parallel else "")
    if required:
        return f"start: {calls}"
    # a reply is either a call (it starts with "{") or text that does not start with one
    return f'start: TEXT | {calls}\nTEXT: /[^{{\\s](?s:.*)/'


def _xml_grammar(tools: list[dict], parallel: bool, required: bool) -> str:
    """Qwen 3.5's calls: the function's name and its parameters' names are held to the tools;
    a value is free text up to its closing tag (llama.cpp also types non-string values)."""
    rules, names = [], []
    for i, t in enumerate(tools):
        fn = t["function"]
        keys = list(((fn.get("parameters") or {}).get("properties") or {}))
        names.append(f"f{i}")
        param = " | ".join(json.dumps(k) for k in keys) or '""'
        rules.append(f'f{i}: {json.dumps(fn["name"] + ">" + chr(10))} p{i}*\n'
                     f'p{i}: "<parameter=" ({param}) ">\\n" value')
    body = (f'body: "\\n<function=" ({" | ".join(names)}) "</function>\\n</tool_call>"\n'
            + "\n".join(rules) + '\nvalue[stop="\\n</parameter>\\n"]: /(?s:.*)/')
    more = ' (/\\s*/ "<tool_call>" body)*' if parallel else ""
    if required:
        return f'start: "<tool_call>" body{more}\n{body}'
    return _lazy(f"after: body{more}\n{body}", "<tool_call>")


def _mistral_grammar(call: dict, parallel: bool, required: bool) -> str:
    array = {"type": "array", "items": call, "minItems": 1}
    if not parallel:
        array["maxItems"] = 1
    if required:
        return f'start: "[TOOL_CALLS]" {_json(array)}'
    return _lazy(f"after: {_json(array)}", "[TOOL_CALLS]")


def _parse_harmony(text: str):
    from .harmony import HarmonyStream  # harmony builds on this module
    stream = HarmonyStream(_ANY_TOOL, True)
    stream.feed(text)
    stream.finish()
    return stream.content.strip(), stream.calls


def _parse_gemma4(text: str, tools: list[dict]):
    from .gemma4 import Gemma4Stream  # gemma4 builds on this module
    stream = Gemma4Stream(ToolPlan(family_named("gemma4"), tools, "auto", True), True)
    stream.feed(text)
    stream.finish()
    return stream.content, stream.calls


def _gemma4_grammar(tools: list[dict], parallel: bool, required: bool) -> str:
    from .gemma4 import grammar
    return grammar(tools, parallel, required)


FAMILIES: list[Family] = [
    Family("harmony", lambda src: "<|channel|>" in src and
           "chat_format=llm-jp-harmony-v1" not in src, None, _parse_harmony, None,
           unconstrained=True),
    # read by its own stream (chat.gemma4), which knows its thought channels
    Family("gemma4", lambda src: "'<|tool_call>call:'" in src, None, _parse_gemma4,
           _gemma4_grammar, typed_args=True),
    Family("qwen3_coder", lambda src: "<tool_call>" in src and "<function=" in src and
           "<parameter=" in src and "'<tool_call><function=' ~ tool_call.name ~ '>'" not in src,
           "<tool_call>", _parse_xml_calls, _xml_grammar, typed_args=True),
    Family("hermes", lambda src: "<tool_call>" in src, "<tool_call>", _parse_hermes,
           _hermes_grammar),
    Family("mistral", lambda src: "[TOOL_CALLS]" in src, "[TOOL_CALLS]", _parse_mistral,
           _mistral_grammar, call_ids=True),
    Family("llama3", lambda src: "<|start_header_id|>" in src and
           ("<|python_tag|>" in src or "ipython" in src or "tools" in src), "{", _parse_llama3,
           _llama3_grammar, args_key="parameters",
           builtin_tools=("wolfram_alpha", "web_search", "brave_search", "python",
                          "code_interpreter")),
    Family("generic", lambda src: True, None, _parse_generic, None, native=False),
]


def family_of(template_source: str | None, builtin: bool) -> Family:
    """The family of a chat template (a built-in template renders no tools: generic)."""
    if builtin or not template_source:
        return FAMILIES[-1]
    return next(f for f in FAMILIES if f.detect(template_source))


def family_named(name: str) -> Family:
    return next(f for f in FAMILIES if f.name == name)


# ---------------------------------------------------------------------------- the request

@dataclass
class ToolPlan:
    """What a chat request with tools does: which tools the model sees (`tools`, OpenAI's
    shape), whether calls are parsed, and the constraint (None: free text)."""
    family: Family
    tools: list[dict]
    choice: str  # "auto", "none", "required" or a function name
    parallel: bool

    @property
    def active(self) -> bool:
        return bool(self.tools) and self.choice != "none"

    def template_variables(self) -> dict:
        """What the chat template gets: the tools (native families), and the built-in ones
        among them by name (Llama 3.1's `builtin_tools`, as llama.cpp passes them)."""
        if not (self.family.native and self.tools):
            return {}
        names = [t["function"]["name"] for t in self.tools]
        builtin = [n for n in names if n in self.family.builtin_tools]
        # as common_chat_tools_to_json_oaicompat hands them over: a description always
        # (gpt-oss's template prints it), parameters {} when absent, nothing else
        tools = [{"type": "function", "function": {
            "name": t["function"]["name"], "description": t["function"].get("description", ""),
            "parameters": t["function"].get("parameters") or {}}} for t in self.tools]
        return {"tools": tools, **({"builtin_tools": builtin} if builtin else {})}

    def callable_tools(self) -> list[dict]:
        if self.choice in ("auto", "none", "required"):
            return self.tools
        return [t for t in self.tools if t["function"]["name"] == self.choice]

    def call_schema(self) -> dict:
        """One call: {name, arguments} for one of the callable tools (arguments per its
        parameters schema)."""
        key = self.family.args_key
        ids = {"id": {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}} \
            if self.family.call_ids else {}
        options = [{"type": "object", "additionalProperties": False, "required": ["name", key],
                    "properties": {"name": {"const": t["function"]["name"]},
                                   key: t["function"].get("parameters") or {"type": "object"},
                                   **ids}}
                   for t in self.callable_tools()]
        return options[0] if len(options) == 1 else {"anyOf": options}

    def constraint(self) -> ConstraintSpec | None:
        if not self.active or self.family.unconstrained:
            return None
        required = self.choice != "auto"
        call = self.call_schema()
        if self.family.typed_args:
            return ConstraintSpec("lark", self.family.grammar(self.callable_tools(),
                                                              self.parallel, required))
        if self.family.grammar is not None:
            return ConstraintSpec("lark", self.family.grammar(call, self.parallel, required))
        calls = {"type": "object", "additionalProperties": False, "required": ["tool_calls"],
                 "properties": {"tool_calls": {"type": "array", "items": call, "minItems": 1}}}
        single = {"type": "object", "additionalProperties": False, "required": ["tool_call"],
                  "properties": {"tool_call": call}}
        options = [calls if self.parallel else single]
        if not required:
            options.append({"type": "object", "additionalProperties": False,
                            "required": ["response"],
                            "properties": {"response": {"type": "string"}}})
        return ConstraintSpec("json_schema", options[0] if len(options) == 1
                              else {"anyOf": options})

    def messages(self, messages: list[dict]) -> list[dict]:
        """The history as the template gets it: native families see the tool calls and tool
        replies as Hugging Face templates expect them (arguments as objects); the generic one
        sees them as the JSON it writes, and a system message describing the tools."""
        if self.family.native:
            return [_native_message(m) for m in messages]
        names = {c.get("id"): c["function"]["name"] for m in messages
                 for c in m.get("tool_calls") or []}
        out = [_generic_message(m, names) for m in messages]
        if self.active:
            out = _with_system(out, self._generic_system_prompt())
        return out

    def _generic_system_prompt(self) -> str:
        tools = [{"name": t["function"]["name"],
                  "description": t["function"].get("description", ""),
                  "parameters": t["function"].get("parameters") or {"type": "object"}}
                 for t in self.callable_tools()]
        key = "tool_calls" if self.parallel else "tool_call"
        example = {"name": "tool_name", "arguments": {"arg1": "some_value"}}
        example = {key: [example] if self.parallel else example}
        text = ("You can call any of the following tools to satisfy the user's requests: "
                f"{json.dumps(tools, indent=2)}\n\nExample tool call syntax:\n\n"
                f"{json.dumps(example, indent=2)}\n\n")
        if self.choice == "auto":
            text += ("Respond in JSON format, either with `" + key + "` (a request to call "
                     "tools) or with `response` (your reply to the user's request).")
        else:
            text += f"Respond in JSON format with `{key}`."
        return text

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        if not self.active:
            return text, []
        if self.family.typed_args:
            return self.family.parse(text, self.callable_tools())
        return self.family.parse(text)


# a plan under which every call is read (what parsing a Harmony reply alone needs)
_ANY_TOOL = ToolPlan(family_named("generic"), [{"type": "function", "function": {"name": "_"}}],
                     "auto", True)


def _native_message(m: dict) -> dict:
    if not m.get("tool_calls"):
        return m
    calls = []
    for c in m["tool_calls"]:
        args = c["function"].get("arguments", "{}")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except ValueError:
            pass  # a template that prints it gets the text
        calls.append({"id": c.get("id", ""), "type": "function",
                      "function": {"name": c["function"]["name"], "arguments": args}})
    return {**m, "tool_calls": calls}


def _generic_message(m: dict, names: dict) -> dict:
    if m.get("tool_calls"):
        calls = [{"name": c["function"]["name"],
                  "arguments": _loads_or_text(c["function"].get("arguments", "{}")),
                  "id": c.get("id", "")} for c in m["tool_calls"]]
        body = {"tool_calls": calls} if len(calls) > 1 else {"tool_call": calls[0]}
        return {"role": "assistant", "content": json.dumps(body, ensure_ascii=False)}
    if m["role"] == "tool":
        reply = {"tool": names.get(m.get("tool_call_id"), m.get("name", "")),
                 "content": m.get("content", "")}
        if m.get("tool_call_id"):
            reply["id"] = m["tool_call_id"]
        return {"role": "tool", "content": json.dumps({"tool_response": reply},
                                                      ensure_ascii=False)}
    return {"role": m["role"], "content": m.get("content") or ""}


def _loads_or_text(text):
    try:
        return json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return text


def _with_system(messages: list[dict], text: str) -> list[dict]:
    if messages and messages[0]["role"] == "system":
        first = messages[0]
        return [{**first, "content": f"{first['content']}\n\n{text}"}] + messages[1:]
    return [{"role": "system", "content": text}] + messages


# ---------------------------------------------------------------------------- streaming

# a call's head: {"name": "...", "arguments": (Llama 3: "parameters"; Llama 3.1 may write
# "type": "function" first)
_CALL_HEAD = re.compile(r'\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:\s*'
                        r'"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:')


class _CallScanner:
    """Streams the calls of a growing text as OpenAI does: a call's first delta (index, id,
    type, name) as soon as `{"name": ..., "arguments":` is complete, then its arguments object
    as it arrives, until it closes. Anything else (keys in another order, arguments that are
    not an object) is left to the parse at the end."""

    def __init__(self):
        self.pos = 0  # where scanning resumes
        self.calls: list[ToolCall] = []
        self.in_args = False
        self.depth, self.in_string, self.escaped = 0, False, False

    def scan(self, text: str) -> list[dict]:
        deltas = []
        while self.pos < len(text):
            if not self.in_args:
                head = _CALL_HEAD.search(text, self.pos)
                if head is None:
                    break
                call = ToolCall(json.loads(f'"{head.group(1)}"'), "")
                deltas.append({"tool_calls": [call.openai(len(self.calls))]})
                self.calls.append(call)
                self.pos, self.in_args, self.depth = head.end(), True, 0
                continue
            call, start = self.calls[-1], self.pos
            if not call.arguments:  # the value has not begun: it must be an object
                rest = text[start:].lstrip()
                if not rest:
                    break
                if rest[0] != "{":
                    self.in_args = False
                    continue
                start = len(text) - len(rest)
            end = start
            while end < len(text) and self.in_args:
                end = self._step(text[end], end)
            call.arguments += text[start:end]
            deltas.append({"tool_calls": [{"index": len(self.calls) - 1,
                                           "function": {"arguments": text[start:end]}}]})
            self.pos = end
        return deltas

    def _step(self, ch: str, i: int) -> int:
        """One character of the arguments; the index after it (in_args ends at the close)."""
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch == '"':
                self.in_string = False
        elif ch == '"':
            self.in_string = True
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1
            self.in_args = self.depth > 0
        return i + 1


class ReplyText:
    """What a reply reader has passed on so far, the content and the reasoning (`thought`),
    and the delta that adds text to either: every reader (ReplyStream, chat.harmony's,
    chat.gemma4's) keeps both for the final message."""
    content: str
    thought: str | None

    def _out(self, key: str, text: str) -> list[dict]:
        if not text:
            return []
        if key == "content":
            self.content += text
        else:
            self.thought += text
        return [{key: text}]


class ReplyStream(ReplyText):
    """One choice's reply turned into OpenAI chat deltas as its text arrives: `reasoning_content`
    while inside <think> (or the style's own tags), `content`
    until a tool call may begin, then `tool_calls` deltas as the call is written (the first with
    its index, id, type and name; then its arguments in fragments); what the end's parse finds
    beyond them follows at the end.

    A piece of text that might be the start of a marker (`</thi`, `<tool_`) is held back until
    the next piece tells."""

    def __init__(self, plan: ToolPlan | None, reasoning: bool, opened: bool,
                 style: ReasoningStyle = THINK):
        self.plan = plan if plan is not None and plan.active else None
        self.reasoning = reasoning
        self.style = style
        self.open_tag, self.close_tag = style.start, style.end
        self.thinking = reasoning and opened
        self.skip_space = self.thinking  # the parsers skip the space after the opening tag
        self.after_close = False  # and after the closing one
        self.started = False  # any non-space text seen (a <think> opens only at the start)
        self.pending = ""
        self.held: str | None = None  # text from a call's start on, parsed at the end
        self.content = ""
        self.thought = "" if reasoning and opened else None
        self.calls: list[ToolCall] = []
        # families whose calls carry the model's own id are sent whole at the end
        self.scanner = _CallScanner() if self.plan and not self.plan.family.call_ids else None

    def feed(self, text: str) -> list[dict]:
        self.pending += text
        deltas: list[dict] = []
        while self.pending:
            before = self.pending
            deltas += self._step()
            if self.pending == before:
                break
        return deltas

    def _step(self) -> list[dict]:
        text = self.pending
        if self.held is not None:
            self.held += text
            self.pending = ""
            return self._scan()
        if self.reasoning and not self.thinking and not self.started:
            stripped = text.lstrip()
            if stripped.startswith(self.open_tag):
                self.thinking, self.thought = True, self.thought or ""
                self.pending, self.skip_space = stripped[len(self.open_tag):], True
                return []
            if self.open_tag.startswith(stripped):
                return []  # could still become <think>
        if self.thinking:
            if self.skip_space:
                text = self.pending = text.lstrip()
                if not text:
                    return []
                self.skip_space = False
            i = text.find(self.close_tag)
            call = self.style.call_ends if self.plan is not None else None
            j = text.find(call) if call else -1
            if j >= 0 and (i < 0 or j < i):  # Qwen 3.5 may start a call without closing
                self.thinking, self.started = False, True
                self.pending = text[j:]
                return self._out("reasoning_content", text[:j])
            if i >= 0:
                self.thinking, self.started, self.after_close = False, True, True
                self.pending = text[i + len(self.close_tag):]
                return self._out("reasoning_content", text[:i])
            keep = max(_partial_suffix(text, self.close_tag),
                       _partial_suffix(text, call) if call else 0)
            self.pending = text[len(text) - keep:] if keep else ""
            return self._out("reasoning_content", text[:len(text) - keep])
        if self.after_close:  # the space after the closing tag is no content
            text = self.pending = text.lstrip()
            if not text:
                return []
            self.after_close = False
        return self._content(text)

    def _content(self, text: str) -> list[dict]:
        plan = self.plan
        if plan is None:
            self.pending = ""
            self.started = self.started or bool(text.strip())
            return self._out("content", text)
        trigger = plan.family.trigger
        if trigger is None or (trigger == "{" and not self.started):
            # the whole reply may be the call: generic JSON, or a Llama 3 reply that begins
            # with "{" or <|python_tag|>
            stripped = text.lstrip()
            if not stripped:
                return []
            if trigger is None or stripped.startswith(("{", "<|python_tag|>")) or \
                    "<|python_tag|>".startswith(stripped):
                self.held, self.pending = text, ""
                return self._scan()
            trigger = None
        self.started = True
        if trigger is None:
            self.pending = ""
            return self._out("content", text)
        i = text.find(trigger)
        if i >= 0:
            self.held, self.pending = text[i:], ""
            return self._out("content", text[:i]) + self._scan()
        keep = _partial_suffix(text, trigger)
        self.pending = text[len(text) - keep:] if keep else ""
        return self._out("content", text[:len(text) - keep])

    def _scan(self) -> list[dict]:
        return self.scanner.scan(self.held) if self.scanner is not None else []

    def finish(self) -> list[dict]:
        """The deltas still owed at the end: held-back text, or the parsed tool calls."""
        deltas = []
        if self.pending:
            rest, self.pending = self.pending, ""
            if self.held is not None:
                self.held += rest
            elif self.thinking:
                deltas += self._out("reasoning_content", rest)
            else:
                deltas += self._out("content", rest)
        if self.held is not None:
            content, self.calls = self.plan.parse(self.held)
            deltas += self._out("content", content)
            streamed = self.scanner.calls if self.scanner is not None else []
            for i, call in enumerate(self.calls):
                sent = streamed[i] if i < len(streamed) else None
                if sent is None:
                    first = call.openai(i)
                    first["function"]["arguments"] = ""
                    deltas.append({"tool_calls": [first]})
                else:
                    call.id = sent.id  # what the stream announced
                    if _same_json(sent.arguments, call.arguments):
                        call.arguments = sent.arguments  # the model's own text
                        continue
                    if sent.arguments:
                        continue  # sent as written; the message has the parse
                args = call.arguments
                for k in range(0, len(args), ARGUMENT_FRAGMENT):
                    deltas.append({"tool_calls": [{"index": i, "function": {
                        "arguments": args[k:k + ARGUMENT_FRAGMENT]}}]})
        return deltas

    def message(self) -> dict:
        """The whole reply as an OpenAI message (after finish)."""
        # as llama.cpp trims (its specialised parsers keep the content as written)
        content = self.content.strip() if self.calls and self.style.trim else self.content
        msg = {"role": "assistant", "content": content if content or not self.calls else None}
        if self.thought is not None:
            msg["reasoning_content"] = self.thought.strip() if self.style.trim else self.thought
        if self.calls:
            msg["tool_calls"] = [c.openai() for c in self.calls]
        return msg


def _same_json(a: str, b: str) -> bool:
    try:
        return json.loads(a) == json.loads(b)
    except ValueError:
        return False


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that is a proper start of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
