"""Request bodies: one JSON Schema per route (published in /openapi.json and enforced by
schema.check) and their translation into `Job`s: the prompts, sampling options and output
options of one HTTP request.

Fields follow the OpenAI API and llama-server (tools/server/server-common.cpp,
`oaicompat_chat_params_parse` / `params_from_json_cmpl`): `max_tokens` or
`max_completion_tokens`, `temperature`, `top_p`, `top_k`, `min_p`, `typical_p`,
`presence_penalty`, `frequency_penalty`, `repeat_penalty`, `repeat_last_n`, `seed`, `stop`,
`logit_bias`, `n`, `logprobs`/`top_logprobs`, `stream`, `stream_options.include_usage`,
`cache_prompt`. Unknown fields are ignored (as vLLM does).

Structured output (`constraint_of`): OpenAI's `response_format` (`json_object`, `json_schema`
with its `schema`; `strict` is always in effect: the grammar allows nothing else) and
llama-server's `grammar` (GBNF) and `json_schema` fields, on every generating route. Tools
(`tools`, `tool_choice`, `parallel_tool_calls`, assistant `tool_calls` and `role: "tool"`
messages) and `reasoning_format` on chat completions; inference/chat/tool_calls.py does the rest.
Reasoning as llama-server takes it (server-common.cpp, oaicompat_chat_params_parse):
`chat_template_kwargs` (template variables; a boolean `enable_thinking` among them switches
thinking), `reasoning_effort` ("none" switches thinking off, another level goes to the template,
gpt-oss's "Reasoning: high"), `reasoning_budget_tokens` (alias `thinking_budget_tokens`; -1
unlimited, 0 ends thinking at once) and `reasoning_budget_message`, over the server's defaults
(ServerConfig: --reasoning-format, --chat-template-kwargs, --reasoning, --reasoning-effort,
--reasoning-budget, --reasoning-budget-message).

Limits depend on the loaded model and the slots: `n` ≤ the slots (each choice is a request in a
slot), `max_tokens` ≤ a slot's context, token ids < the vocabulary.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from llamatui.inference import REASONING_FORMATS, ConstraintError, ConstraintSpec

from .config import ServerConfig
from .errors import invalid
from .schema import check

MAX_TOP_LOGPROBS = 20  # OpenAI's limit for top_logprobs
ROLES = ["system", "user", "assistant", "tool", "developer"]


@dataclass(frozen=True)
class Limits:
    n_slots: int
    n_ctx_slot: int
    n_vocab: int


@dataclass
class Job:
    """What one HTTP request asks the engine for. prompts: raw strings, token-id lists or one
    chat (a message list); each prompt gets `n` choices (choice index = prompt index * n + i)."""
    prompts: list
    chat: bool
    sampling: dict
    n: int = 1
    n_probs: int = 0  # top log-probabilities per token (0: none)
    logprobs: bool = False  # whether the answer carries log-probabilities
    stream: bool = False
    include_usage: bool = False
    cache_prompt: bool = True
    extra: dict = field(default_factory=dict)
    constraint: ConstraintSpec | None = None
    constraint_param: str = ""  # the field the constraint came from (named in errors)
    tools: list = field(default_factory=list)
    tool_choice: str = "auto"  # "auto", "none", "required" or a function's name
    parallel_tool_calls: bool = False  # llama-server's default
    reasoning_format: str = "auto"
    template_vars: dict = field(default_factory=dict)  # enable_thinking, chat_template_kwargs
    reasoning_budget: int = -1  # tokens of thinking before its end is forced; -1: unlimited
    reasoning_budget_message: str = ""

    @property
    def n_choices(self) -> int:
        return len(self.prompts) * self.n


# ------------------------------------------------------------------------------ schemas

def _nullable(schema: dict) -> dict:
    return {"anyOf": [*schema.get("anyOf", [schema]), {"type": "null"}]}


# Sampling runs in float32: a temperature or repeat penalty that divides a logit past float32's
# range would make it infinite, so the ranges stop well before (≤ 0 is greedy, as llama.cpp).
TEMPERATURE = {"anyOf": [{"type": "number", "maximum": 0}, {"type": "number", "minimum": 1e-6}]}
PENALTY = {"type": "number", "minimum": -2, "maximum": 2}  # OpenAI's range
INT32 = {"type": "integer", "minimum": -2**31, "maximum": 2**31 - 1}  # llama.cpp's int32_t
UNIT = {"type": "number", "minimum": 0, "maximum": 1}
TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
STOP = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}},
                  {"type": "null"}]}
TEXT_PART = {"type": "object", "required": ["type", "text"],
             "properties": {"type": {"type": "string", "enum": ["text"]},
                            "text": {"type": "string"}}}
TOOL_CALL = {"type": "object", "required": ["function"], "properties": {
    "id": {"type": "string"}, "type": {"type": "string", "enum": ["function"]},
    "function": {"type": "object", "required": ["name"],
                 "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}}}}}
MESSAGE = {"type": "object", "required": ["role"],
           "properties": {"role": {"type": "string", "enum": ROLES},
                          "content": {"anyOf": [{"type": "string"}, {"type": "null"},
                                                {"type": "array", "items": TEXT_PART}]},
                          "name": {"type": "string"},
                          "tool_calls": {"type": ["array", "null"], "items": TOOL_CALL},
                          "tool_call_id": {"type": "string"},
                          "reasoning_content": {"type": ["string", "null"]}}}
TOOL = {"type": "object", "required": ["type", "function"], "properties": {
    "type": {"type": "string", "enum": ["function"]},
    "function": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string", "pattern": "^[a-zA-Z0-9_.-]{1,64}$"},
        "description": {"type": "string"},
        "parameters": {"type": "object"},
        "strict": {"type": ["boolean", "null"]}}}}}
TOOL_CHOICE = {"anyOf": [
    {"type": "string", "enum": ["auto", "none", "required"]},
    {"type": "object", "required": ["type", "function"], "properties": {
        "type": {"type": "string", "enum": ["function"]},
        "function": {"type": "object", "required": ["name"],
                     "properties": {"name": {"type": "string"}}}}},
    {"type": "null"}]}
RESPONSE_FORMAT = {"anyOf": [{"type": "null"}, {
    "type": "object", "required": ["type"], "properties": {
        "type": {"type": "string", "enum": ["text", "json_object", "json_schema"]},
        "schema": {"type": "object"},  # llama-server's json_object with a schema
        "json_schema": {"type": "object", "properties": {
            "name": {"type": "string"}, "description": {"type": "string"},
            "schema": {"type": "object"}, "strict": {"type": ["boolean", "null"]}}}}}]}
# llama-server's own fields, on every generating route
CONSTRAINT_FIELDS = {"response_format": RESPONSE_FORMAT, "grammar": {"type": ["string", "null"]},
                     "json_schema": {"type": ["object", "null"]}}


def sampling_schema(limits: Limits) -> dict:
    """The sampling fields every generating route takes."""
    max_tokens = {"type": ["integer", "null"], "minimum": 1, "maximum": limits.n_ctx_slot}
    return {
        "model": {"type": "string"},
        "max_tokens": max_tokens,
        "max_completion_tokens": max_tokens,
        "temperature": _nullable(TEMPERATURE),
        "top_p": _nullable(UNIT),
        "top_k": _nullable(INT32),
        "min_p": _nullable(UNIT),
        "typical_p": _nullable(UNIT),
        "presence_penalty": _nullable(PENALTY),
        "frequency_penalty": _nullable(PENALTY),
        "repeat_penalty": _nullable({"type": "number", "minimum": 1e-6, "maximum": 1e6}),
        "repeat_last_n": _nullable({**INT32, "minimum": -1}),
        "seed": {"type": ["integer", "null"], "minimum": -1, "maximum": 2**64 - 1},
        "stop": STOP,
        "logit_bias": {"type": ["object", "null"], "propertyNames": {"pattern": "^[0-9]{1,9}$"},
                       "additionalProperties": {"type": "number", "minimum": -100,
                                                "maximum": 100}},
        "n": {"type": ["integer", "null"], "minimum": 1, "maximum": limits.n_slots},
        "stream": {"type": ["boolean", "null"]},
        "stream_options": {"type": ["object", "null"],
                           "properties": {"include_usage": {"type": "boolean"}}},
        "cache_prompt": {"type": "boolean"},
        "user": {"type": "string"},
        **CONSTRAINT_FIELDS,
    }


def chat_schema(limits: Limits) -> dict:
    props = sampling_schema(limits)
    props.update({
        "messages": {"type": "array", "items": MESSAGE, "minItems": 1},
        "logprobs": {"type": ["boolean", "null"]},
        "top_logprobs": {"type": ["integer", "null"], "minimum": 0,
                         "maximum": MAX_TOP_LOGPROBS},
        "tools": {"type": ["array", "null"], "items": TOOL},
        "tool_choice": TOOL_CHOICE,
        "parallel_tool_calls": {"type": ["boolean", "null"]},
        "reasoning_format": {"type": ["string", "null"], "enum": [*REASONING_FORMATS, None]},
        "chat_template_kwargs": {"type": ["object", "null"]},
        "reasoning_effort": {"type": ["string", "null"]},
        "reasoning_budget_tokens": REASONING_BUDGET,
        "thinking_budget_tokens": REASONING_BUDGET,
        "reasoning_budget_message": {"type": ["string", "null"]},
    })
    return {"type": "object", "required": ["messages"], "properties": props}


REASONING_BUDGET = {"type": ["integer", "null"], "minimum": -1, "maximum": 2**31 - 1}


def reasoning_options(body: dict, config: ServerConfig) -> tuple[dict, int, str]:
    """The template variables, reasoning budget and budget message of a checked chat body, as
    oaicompat_chat_params_parse reads them: the request's kwargs over the server's
    (config.template_kwargs); `enable_thinking` is true unless the kwargs say false or
    `reasoning_effort` is "none"; the kwargs reach the template as they are. A budget that is
    absent, null or -1, or a message that is absent or null, is the server's."""
    kwargs = {**config.template_kwargs, **(body.get("chat_template_kwargs") or {})}
    enable_thinking = kwargs.get("enable_thinking", True)
    if isinstance(enable_thinking, str):
        raise invalid("chat_template_kwargs", 'invalid type for "enable_thinking" '
                                              '(expected boolean, got string)')
    enable_thinking = enable_thinking is not False
    effort = body.get("reasoning_effort")
    if effort == "none":
        enable_thinking = False
        kwargs.pop("reasoning_effort", None)
    elif effort:
        kwargs["reasoning_effort"] = effort
    budget = body.get("reasoning_budget_tokens")
    if budget is None:
        budget = body.get("thinking_budget_tokens")
    if budget is None or budget == -1:
        budget = config.reasoning_budget
    message = body.get("reasoning_budget_message")
    if message is None:
        message = config.reasoning_budget_message
    return {"enable_thinking": enable_thinking, **kwargs}, budget, message


def completions_schema(limits: Limits) -> dict:
    props = sampling_schema(limits)
    prompts = {"anyOf": [{"type": "string"}, TOKEN_IDS,
                         {"type": "array", "items": {"type": "string"}, "minItems": 1,
                          "maxItems": limits.n_slots},
                         {"type": "array", "items": TOKEN_IDS, "minItems": 1,
                          "maxItems": limits.n_slots}]}
    props.update({
        "prompt": prompts,
        "logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_TOP_LOGPROBS},
        "echo": {"type": ["boolean", "null"]},
    })
    return {"type": "object", "required": ["prompt"], "properties": props}


def native_completion_schema(limits: Limits) -> dict:
    """llama-server's /completion: n_predict (-1 = until the end), n_probs, logit_bias also as
    [[token id, bias], ...]."""
    props = sampling_schema(limits)
    props.pop("n")
    props.update({
        "prompt": {"anyOf": [{"type": "string"}, TOKEN_IDS]},
        "n_predict": {"type": ["integer", "null"], "minimum": -1,
                      "maximum": limits.n_ctx_slot},
        "n_probs": {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_TOP_LOGPROBS},
        "logit_bias": {"anyOf": [
            props["logit_bias"],
            {"type": "array", "items": {"type": "array", "minItems": 2, "maxItems": 2,
                                        "items": {"type": "number"}}}]},
    })
    return {"type": "object", "required": ["prompt"], "properties": props}


def tokenize_schema(limits: Limits) -> dict:
    return {"type": "object", "required": ["content"], "properties": {
        "content": {"type": "string"}, "add_special": {"type": "boolean"},
        "parse_special": {"type": "boolean"}, "with_pieces": {"type": "boolean"}}}


def detokenize_schema(limits: Limits) -> dict:
    ids = {"type": "array", "items": {"type": "integer", "minimum": 0,
                                      "maximum": limits.n_vocab - 1}}
    return {"type": "object", "required": ["tokens"], "properties": {"tokens": ids}}


def apply_template_schema(limits: Limits) -> dict:
    chat = chat_schema(limits)["properties"]
    return {"type": "object", "required": ["messages"],
            "properties": {k: chat[k] for k in ("messages", "chat_template_kwargs",
                                                "reasoning_effort")}}


def embeddings_schema(limits: Limits) -> dict:
    return {"type": "object", "required": ["input"], "properties": {
        "model": {"type": "string"},
        "input": {"anyOf": [{"type": "string"},
                            {"type": "array", "items": {"type": "string"}, "minItems": 1},
                            TOKEN_IDS, {"type": "array", "items": TOKEN_IDS, "minItems": 1}]},
        "encoding_format": {"type": ["string", "null"], "enum": ["float", "base64", None]}}}


# ------------------------------------------------------------------------------ jobs

def chat_job(body, limits: Limits, config: ServerConfig) -> Job:
    body = check(body, chat_schema(limits), "")
    messages = [_flat_message(m) for m in body["messages"]]
    n_probs = 0
    if body.get("logprobs"):
        n_probs = body.get("top_logprobs") or 0
    elif body.get("top_logprobs"):
        raise invalid("top_logprobs", "needs logprobs set to true")
    job = _job([messages], True, body, limits)
    job.n_probs, job.logprobs = n_probs, bool(body.get("logprobs"))
    job.tools = body.get("tools") or []
    choice = body.get("tool_choice") or "auto"
    job.tool_choice = choice if isinstance(choice, str) else choice["function"]["name"]
    names = [t["function"]["name"] for t in job.tools]
    if job.tool_choice not in ("auto", "none", "required") and job.tool_choice not in names:
        raise invalid("tool_choice", f"names function {job.tool_choice!r}, which is not among "
                                     f"the tools ({', '.join(names) or 'none given'})")
    if job.tool_choice == "required" and not job.tools:
        raise invalid("tool_choice", "is 'required' but no tools were given")
    if job.tools and job.tool_choice != "none" and job.constraint is not None:
        raise invalid(job.constraint_param, "cannot be combined with tools (llama-server "
                                            "refuses a grammar with tools too)")
    job.parallel_tool_calls = bool(body.get("parallel_tool_calls"))
    job.reasoning_format = body.get("reasoning_format") or config.reasoning_format
    job.template_vars, job.reasoning_budget, job.reasoning_budget_message = \
        reasoning_options(body, config)
    return job


def completions_job(body, limits: Limits) -> Job:
    body = check(body, completions_schema(limits), "")
    prompt = body["prompt"]
    prompts = prompt if isinstance(prompt, list) and isinstance(prompt[0], (str, list)) \
        else [prompt]
    job = _job(prompts, False, body, limits)
    logprobs = body.get("logprobs")
    job.n_probs, job.logprobs = logprobs or 0, logprobs is not None
    return job


def native_completion_job(body, limits: Limits) -> Job:
    body = check(body, native_completion_schema(limits), "")
    n_predict = body.get("n_predict")
    if n_predict is not None and "max_tokens" not in body:  # llama-server: n_predict wins
        body = {**body, "max_tokens": None if n_predict in (-1, 0) else n_predict}
    bias = body.get("logit_bias")
    if isinstance(bias, list):
        body = {**body, "logit_bias": {str(int(t)): b for t, b in bias}}
    job = _job([body["prompt"]], False, body, limits)
    job.n_probs = body.get("n_probs") or 0
    job.logprobs = job.n_probs > 0
    job.extra["n_predict_zero"] = n_predict == 0
    return job


def _job(prompts: list, chat: bool, body: dict, limits: Limits) -> Job:
    n = body.get("n") or 1
    if len(prompts) * n > limits.n_slots:
        raise invalid("n", f"{len(prompts)} prompt(s) × n={n} choices need "
                           f"{len(prompts) * n} slots; this server has {limits.n_slots}")
    stream = bool(body.get("stream"))
    options = body.get("stream_options") or {}
    if options and not stream:
        raise invalid("stream_options", "is only allowed when stream is true")
    constraint, param = constraint_of(body)
    return Job(prompts=prompts, chat=chat, sampling=sampling_options(body, limits), n=n,
               stream=stream, include_usage=bool(options.get("include_usage")),
               cache_prompt=body.get("cache_prompt", True), constraint=constraint,
               constraint_param=param)


SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "typical_p", "presence_penalty",
                   "frequency_penalty", "repeat_penalty", "repeat_last_n")


def sampling_options(body: dict, limits: Limits) -> dict:
    """SamplingParams' keyword arguments from a checked body (absent or null: the default)."""
    out = {k: body[k] for k in SAMPLING_FIELDS if body.get(k) is not None}
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    # No limit asked: at most a slot's context, so that a model that never ends its turn
    # cannot hold a slot forever under context shift.
    out["max_tokens"] = max_tokens or limits.n_ctx_slot
    seed = body.get("seed")
    if seed is not None and seed >= 0:
        out["seed"] = seed
    stop = body.get("stop")
    if stop:
        out["stop"] = (stop,) if isinstance(stop, str) else tuple(s for s in stop if s)
    bias = body.get("logit_bias") or {}
    for key in bias:
        if int(key) >= limits.n_vocab:
            raise invalid("logit_bias", f"token id {key} is outside the vocabulary "
                                        f"[0, {limits.n_vocab})")
    if bias:
        out["logit_bias"] = {int(k): float(v) for k, v in bias.items()}
    return out


def constraint_of(body: dict) -> tuple[ConstraintSpec | None, str]:
    """The constraint a body asks for and the field it came from: `response_format`
    (json_object, json_schema), or llama-server's `grammar` / `json_schema`; at most one."""
    given = {}
    fmt = body.get("response_format") or {}
    kind = fmt.get("type", "text")
    if kind == "json_object":
        schema = fmt.get("schema")
        given["response_format"] = ("json_schema", schema) if schema else ("json_object", None)
    elif kind == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema", fmt.get("schema"))
        if schema is None:
            raise invalid("response_format", "of type json_schema needs json_schema.schema")
        given["response_format"] = ("json_schema", schema)
    if body.get("grammar"):
        given["grammar"] = ("gbnf", body["grammar"])
    if body.get("json_schema") is not None:
        given["json_schema"] = ("json_schema", body["json_schema"])
    if len(given) > 1:
        raise invalid(list(given)[1], f"give one of {', '.join(given)}, not several")
    if not given:
        return None, ""
    param, (kind, source) = next(iter(given.items()))
    try:
        return ConstraintSpec(kind, source), param
    except ConstraintError as e:
        raise invalid(param, str(e)) from None


def _flat_message(message: dict) -> dict:
    """A message with its content as one string (text parts joined by newlines)."""
    content = message.get("content")
    if isinstance(content, list):
        content = "\n".join(part["text"] for part in content)
    out = {"role": message["role"], "content": content or ""}
    for key in ("name", "tool_call_id", "tool_calls", "reasoning_content"):
        if message.get(key):
            out[key] = message[key]
    return out
