"""A small JSON Schema checker for request bodies, so that one schema per route is both what
/openapi.json publishes and what the server enforces (one home for each fact).

It knows the keywords the request schemas use (type, enum, minimum/maximum/exclusiveMinimum,
minLength/maxLength, minItems/maxItems, items, properties/required, additionalProperties,
propertyNames' pattern, anyOf) and answers the first violation as an APIError naming the field
("max_tokens: must be an integer between 1 and 2048, got -5"). Fields a schema does not list
are ignored, as vLLM and OpenAI ignore unknown fields. Numbers must be finite (Python's json
reads `Infinity`); an integral float counts as an integer, as JSON Schema says.
"""
from __future__ import annotations

import math
import re

from .errors import invalid

_PYTHON_TYPES = {"string": str, "object": dict, "array": list, "boolean": bool}
_NOUNS = {"string": "a string", "integer": "an integer", "number": "a number",
          "boolean": "a boolean", "object": "an object", "array": "an array", "null": "null"}


def check(value, schema: dict, name: str):
    """`value` checked against `schema`; returns it normalised (integral floats as ints).
    Raises APIError (invalid_request_error, param=name) at the first violation."""
    if "anyOf" in schema:
        for option in schema["anyOf"]:
            try:
                return check(value, option, name)
            except Exception:  # noqa: BLE001 - the next option may match
                continue
        raise invalid(name, f"must be {describe(schema)}, got {_shown(value)}")
    types = schema.get("type")
    if types is not None:
        value = _check_type(value, [types] if isinstance(types, str) else types, schema, name)
    if "enum" in schema and value not in schema["enum"]:
        raise invalid(name, f"must be one of {', '.join(map(repr, schema['enum']))}, "
                            f"got {_shown(value)}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        _check_range(value, schema, name)
    elif isinstance(value, str):
        _check_length(len(value), schema, "minLength", "maxLength", name, "characters")
    elif isinstance(value, list):
        _check_length(len(value), schema, "minItems", "maxItems", name, "items")
        if "items" in schema:
            value = [check(v, schema["items"], f"{name}[{i}]") for i, v in enumerate(value)]
    elif isinstance(value, dict):
        value = _check_object(value, schema, name)
    return value


def _check_type(value, types: list[str], schema: dict, name: str):
    for t in types:
        if t == "null" and value is None:
            return value
        if t in ("integer", "number") and isinstance(value, (int, float)) \
                and not isinstance(value, bool):
            if isinstance(value, float) and not math.isfinite(value):
                raise invalid(name, f"must be a finite number, got {value!r}")
            if t == "number":
                return value
            if isinstance(value, int) or value.is_integer():
                return int(value)
        if t in _PYTHON_TYPES and isinstance(value, _PYTHON_TYPES[t]):
            return value
    raise invalid(name, f"must be {describe(schema)}, got {_shown(value)}")


def _check_range(value, schema: dict, name: str) -> None:
    low, high = schema.get("minimum"), schema.get("maximum")
    above = schema.get("exclusiveMinimum")
    if (low is not None and value < low) or (high is not None and value > high) \
            or (above is not None and value <= above):
        raise invalid(name, f"must be {describe(schema)}, got {_shown(value)}")


def _check_length(n: int, schema: dict, lo_key: str, hi_key: str, name: str, unit: str) -> None:
    low, high = schema.get(lo_key), schema.get(hi_key)
    if low is not None and n < low:
        raise invalid(name, f"must have at least {low} {unit}, got {n}")
    if high is not None and n > high:
        raise invalid(name, f"must have at most {high} {unit}, got {n}")


def _check_object(value: dict, schema: dict, name: str) -> dict:
    def field(key):
        return f"{name}.{key}" if name else key

    for key in schema.get("required", ()):
        if key not in value:
            raise invalid(field(key), "is required")
    out = dict(value)
    props = schema.get("properties", {})
    for key, sub in props.items():
        if key in value:
            out[key] = check(value[key], sub, field(key))
    pattern = schema.get("propertyNames", {}).get("pattern")
    extra = schema.get("additionalProperties")
    for key in value:
        if key in props:
            continue
        if pattern is not None and not re.fullmatch(pattern, key):
            raise invalid(name, f"key {key!r} does not match {pattern}")
        if isinstance(extra, dict):
            out[key] = check(value[key], extra, field(key))
    return out


def describe(schema: dict) -> str:
    """The schema in words: "an integer between 1 and 2048", "a string or an array of ..."."""
    if "anyOf" in schema:
        return " or ".join(describe(s) for s in schema["anyOf"])
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else types
    words = " or ".join(_NOUNS.get(t, t) for t in types) or "a value"
    low, high = schema.get("minimum"), schema.get("maximum")
    if low is not None and high is not None:
        words += f" between {_num(low)} and {_num(high)}"
    elif low is not None:
        words += f" ≥ {_num(low)}"
    elif high is not None:
        words += f" ≤ {_num(high)}"
    if schema.get("exclusiveMinimum") is not None:
        words += f" > {_num(schema['exclusiveMinimum'])}"
    if "items" in schema and "array" in types:
        words += f" of {_plural(describe(schema['items']))}"
    if "enum" in schema:
        words += f" (one of {', '.join(map(repr, schema['enum']))})"
    return words


def _plural(words: str) -> str:
    for article in ("an ", "a "):
        if words.startswith(article):
            head, _, rest = words[len(article):].partition(" ")
            return f"{head}s {rest}".rstrip()
    return words


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _num(x) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"
