"""/openapi.json: the OpenAPI 3.0 description of the routes, made from the route table and the
same request schemas the server enforces, with the answers' schemas below (the shapes of
shapes.py), so a property-based run (schemathesis) can check the server against it.
"""
from __future__ import annotations

from .requests import Limits

_INT, _STR, _NUM, _BOOL = ({"type": t} for t in ("integer", "string", "number", "boolean"))
_NULLABLE_STR = {"type": "string", "nullable": True}

ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["code", "message", "type"],
    "properties": {"code": _INT, "message": _STR, "type": _STR, "param": _STR,
                   "n_prompt_tokens": _INT, "n_ctx": _INT}}}}
USAGE = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
         "properties": {"prompt_tokens": _INT, "completion_tokens": _INT, "total_tokens": _INT,
                        "prompt_tokens_details": {"type": "object",
                                                  "properties": {"cached_tokens": _INT}}}}
FINISH = {"type": "string", "enum": ["stop", "length"]}
TOP = {"type": "object", "required": ["id", "token", "bytes", "logprob"],
       "properties": {"id": _INT, "token": _STR, "bytes": {"type": "array", "items": _INT},
                      "logprob": _NUM}}
TOKEN_LOGPROB = {"type": "object", "required": [*TOP["required"], "top_logprobs"],
                 "properties": {**TOP["properties"],
                                "top_logprobs": {"type": "array", "items": TOP}}}
ENVELOPE = {"id": _STR, "object": _STR, "created": _INT, "model": _STR,
            "system_fingerprint": _STR, "usage": USAGE, "timings": {"type": "object"}}


def _envelope(choice: dict) -> dict:
    return {"type": "object", "required": ["id", "object", "created", "model", "choices"],
            "properties": {**ENVELOPE, "choices": {"type": "array", "items": choice}}}


RESPONSES = {
    "Health": {"type": "object", "required": ["status"], "properties": {"status": _STR}},
    "ModelList": {"type": "object", "required": ["object", "data"], "properties": {
        "object": _STR, "data": {"type": "array", "items": {
            "type": "object", "required": ["id", "object", "created", "owned_by"],
            "properties": {"id": _STR, "object": _STR, "created": _INT, "owned_by": _STR,
                           "meta": {"type": "object"}}}}}},
    "ChatCompletion": _envelope({
        "type": "object", "required": ["index", "finish_reason", "message"],
        "properties": {"index": _INT, "finish_reason": FINISH, "message": {
            "type": "object", "required": ["role", "content"],
            "properties": {"role": _STR, "content": _NULLABLE_STR,
                           "reasoning_content": _STR, "tool_calls": {
                               "type": "array", "items": {
                                   "type": "object", "required": ["id", "type", "function"],
                                   "properties": {"id": _STR, "type": _STR, "function": {
                                       "type": "object", "required": ["name", "arguments"],
                                       "properties": {"name": _STR,
                                                      "arguments": _STR}}}}}}},
            "logprobs": {"type": "object", "nullable": True, "properties": {
                "content": {"type": "array", "items": TOKEN_LOGPROB}}}}}),
    "Completion": _envelope({
        "type": "object", "required": ["index", "finish_reason", "text"],
        "properties": {"index": _INT, "finish_reason": FINISH, "text": _STR,
                       "logprobs": {"type": "object", "nullable": True}}}),
    "NativeCompletion": {
        "type": "object", "required": ["content", "stop", "tokens_predicted",
                                       "tokens_evaluated", "stop_type"],
        "properties": {"index": _INT, "content": _STR, "tokens": {"type": "array",
                                                                  "items": _INT},
                       "id_slot": _INT, "stop": _BOOL, "model": _STR,
                       "tokens_predicted": _INT, "tokens_evaluated": _INT,
                       "generation_settings": {"type": "object"}, "has_new_line": _BOOL,
                       "truncated": _BOOL, "stop_type": _STR, "stopping_word": _STR,
                       "tokens_cached": _INT, "timings": {"type": "object"},
                       "completion_probabilities": {"type": "array",
                                                    "items": TOKEN_LOGPROB}}},
    "Embeddings": {"type": "object", "required": ["object", "data", "model", "usage"],
                   "properties": {"object": _STR, "model": _STR, "usage": {"type": "object"},
                                  "data": {"type": "array", "items": {
                                      "type": "object", "required": ["index", "embedding"],
                                      "properties": {"index": _INT, "object": _STR,
                                                     "embedding": {}}}}}},
    "Tokens": {"type": "object", "required": ["tokens"], "properties": {"tokens": {
        "type": "array", "items": {}}}},
    "Content": {"type": "object", "required": ["content"], "properties": {"content": _STR}},
    "Prompt": {"type": "object", "required": ["prompt"], "properties": {"prompt": _STR}},
    "Props": {"type": "object", "required": ["total_slots", "default_generation_settings"],
              "properties": {"total_slots": _INT,
                             "default_generation_settings": {"type": "object"}}},
    "Slots": {"type": "array", "items": {
        "type": "object", "required": ["id", "n_ctx", "is_processing", "state"],
        "properties": {"id": _INT, "id_task": _INT, "n_ctx": _INT, "is_processing": _BOOL,
                       "state": _STR, "n_prompt_tokens": _INT, "n_cached": _INT,
                       "n_reused": _INT, "n_decoded": _INT, "prompt_per_second": _NUM,
                       "predicted_per_second": _NUM}}},
    "Metrics": _STR,
    "OpenAPI": {"type": "object", "required": ["openapi", "paths"]},
}
TEXT_ANSWERS = {"Metrics"}  # text/plain
# one server-sent event (`data:` a JSON object as text, `data: [DONE]`, or a `:` comment)
SSE_EVENT = {"type": "object", "properties": {"data": _STR, "event": _STR, "id": _STR}}
# error statuses every route may answer: bad request, no key, not enabled, busy or loading
ERROR_STATUSES = {"400": "bad request (the field is named)", "401": "missing or wrong API key",
                  "500": "generation failed", "501": "not enabled on this server",
                  "503": "loading, or every slot busy and the queue full"}


def document(routes, limits: Limits) -> dict:
    """The OpenAPI 3.0 document for `routes` (routes.ROUTES) at the loaded model's limits."""
    paths = {}
    for route in routes:
        op = {"summary": route.summary, "operationId": route.handler.__name__,
              "responses": _responses(route)}
        if route.public:
            op["security"] = []
        if route.body is not None:
            op["requestBody"] = {"required": True, "content": {
                "application/json": {"schema": _openapi_schema(route.body(limits))}}}
        paths[route.paths[0]] = {route.method.lower(): op}
    return {"openapi": "3.0.3",
            "info": {"title": "llamatui serve", "version": "1",
                     "description": "An OpenAI-compatible server (llama-server's routes)."},
            "paths": paths,
            "components": {"securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-Api-Key"}}},
            "security": [{"bearer": []}, {"apiKey": []}]}


def _responses(route) -> dict:
    schema = RESPONSES[route.response]
    kind = "text/plain" if route.response in TEXT_ANSWERS else "application/json"
    content = {kind: {"schema": schema}}
    if route.stream:
        content["text/event-stream"] = {"schema": SSE_EVENT}
    out = {"200": {"description": "OK", "content": content}}
    for status, what in ERROR_STATUSES.items():
        out[status] = {"description": what,
                       "content": {"application/json": {"schema": ERROR}}}
    return out


def _openapi_schema(schema):
    """JSON Schema → OpenAPI 3.0's dialect: a type list with "null" becomes `nullable`, a
    `{"type": "null"}` branch of anyOf becomes `nullable` on the others, exclusiveMinimum
    becomes the boolean form, propertyNames (not in 3.0) is dropped."""
    if isinstance(schema, list):
        return [_openapi_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "propertyNames":
            continue
        if key == "exclusiveMinimum":
            out["minimum"], out["exclusiveMinimum"] = value, True
        elif key in ("properties",):
            out[key] = {k: _openapi_schema(v) for k, v in value.items()}
        else:
            out[key] = _openapi_schema(value)
    types = out.get("type")
    if isinstance(types, list):
        rest = [t for t in types if t != "null"]
        if len(rest) == 1:
            out["type"] = rest[0]
        else:
            del out["type"]
            out["anyOf"] = [{"type": t} for t in rest]
        if "null" in types:
            out["nullable"] = True
        if "enum" in out and None in out["enum"]:
            out["enum"] = [v for v in out["enum"] if v is not None] + [None]
    if "anyOf" in out and {"type": "null"} in out["anyOf"]:
        branches = [b for b in out["anyOf"] if b != {"type": "null"}]
        out["anyOf"] = [{**b, "nullable": True} for b in branches]
        if len(branches) == 1:
            del out["anyOf"]
            out.update(branches[0])
    return out
