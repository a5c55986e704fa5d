"""The schema output is generated from: the user's JSON schema with the room llama.cpp's
converter (`json-schema-to-grammar.cpp`) does not give a model taken away, so that a small model
cannot run on forever where the schema leaves the length open. Every output it allows still
validates against the user's schema: it only narrows what is generated.

- Objects hold only the keys they list, unless the schema says otherwise (llama.cpp's
  `_build_object_rule` admits other keys only when `additionalProperties` is given; also
  xgrammar's strict mode and what OpenAI's strict structured outputs require). JSON Schema's
  default admits any other key, and a small model invents keys ("c", "d", … in an object whose
  schema named "a" and "b") until max_tokens cuts the JSON. A schema that wants other keys says
  so (`"additionalProperties": true` or a schema, `patternProperties`, `unevaluatedProperties`,
  `minProperties`, `maxProperties`).
- `date-time` and `time` strings are at most as long as llama.cpp's rules make them
  (`HH:MM:SS.sss+HH:MM`: a 3-digit fraction; maxLength 29 and 18), where llguidance's formats
  allow any number of fraction digits ("00:00:00.000000000…" until max_tokens).

    generation_schema({"type": "object", "properties": {"a": {...}}})
    → {"type": "object", "properties": {"a": {...}}, "additionalProperties": false}

Intersections are closed as one object, as llama.cpp merges `allOf`: the schema holding an
`allOf` of plain objects gets their keys and `additionalProperties: false`, its branches stay
open (closing each would forbid the others' keys). Objects that meet others in an intersection
llama.cpp does not merge (`anyOf`/`oneOf`/`$ref` beside `properties`, `if`/`then`) keep the
spec's default, as does every schema holding a reference this cannot resolve.
"""
from __future__ import annotations

__all__ = ["generation_schema"]

# keywords whose value is a map of names to subschemas, one subschema, or a list of them
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_ONE = ("items", "additionalItems", "additionalProperties", "unevaluatedItems",
               "unevaluatedProperties", "contains", "not", "if", "then", "else",
               "propertyNames")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
# a schema with one of these already says which other keys are allowed
_OTHER_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties",
               "minProperties", "maxProperties", "propertyNames")
# beside `properties`, these intersect the object with other schemas
_COMBINERS = ("allOf", "anyOf", "oneOf", "$ref", "if", "then", "else", "not",
              "dependentSchemas", "dependentRequired")
# what a plain object (an allOf branch that can be merged) may hold
_PLAIN_OBJECT = {"type", "properties", "required", "title", "description", "$comment",
                 "default", "examples"}


class _Unresolvable(Exception):
    pass


# llama.cpp's longest date-time / time: 2024-01-31T23:59:59.999+01:00, 23:59:59.999+01:00
FORMAT_MAX_LENGTH = {"date-time": 29, "time": 18}


def generation_schema(schema):
    """A copy of `schema` with objects closed and times bounded (see the module docstring);
    `schema` itself is unchanged."""
    try:
        return _close(schema, _intersected(schema, schema))
    except (_Unresolvable, RecursionError):  # left as given: the compiler judges it
        return schema


def _subschemas(node):
    for key in _SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            yield from node[key].values()
    for key in _SCHEMA_ONE:
        if isinstance(node.get(key), dict):
            yield node[key]
    for key in _SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            yield from node[key]


def _resolve(root, node):
    """`node` with a local `$ref` followed (JSON pointer into `root`); _Unresolvable else."""
    seen = set()
    while isinstance(node, dict) and "$ref" in node:
        ref = node["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#") or ref in seen:
            raise _Unresolvable(ref)
        seen.add(ref)
        node = root
        for part in filter(None, ref[1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise _Unresolvable(ref)
    return node


def _intersected(root, node, out=None, seen=None) -> set[int]:
    """ids of the schemas that meet another object schema in an intersection (allOf branches,
    anyOf/oneOf/$ref beside an object's own keywords), references followed: those stay open."""
    out = set() if out is None else out
    seen = set() if seen is None else seen
    if not isinstance(node, dict) or id(node) in seen:
        return out
    seen.add(id(node))
    target = _resolve(root, {"$ref": node["$ref"]}) if "$ref" in node else None
    partners = list(node.get("allOf") or [])
    if "properties" in node or "required" in node:
        partners += list(node.get("anyOf") or []) + list(node.get("oneOf") or [])
        partners += [node[k] for k in ("if", "then", "else") if k in node]
        if target is not None:
            partners.append(target)
    for partner in partners:
        out.add(id(partner))
        out.add(id(_resolve(root, partner)))
    for child in _subschemas(node):
        _intersected(root, child, out, seen)
    if target is not None:
        _intersected(root, target, out, seen)
    return out


def _close(node, keep_open: set[int], root=None):
    """A copy of `node` and its subschemas with times bounded and objects closed (unless their
    id is in keep_open)."""
    if not isinstance(node, dict):
        return node
    root = node if root is None else root
    out = dict(node)
    for key in _SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            out[key] = {k: _close(v, keep_open, root) for k, v in node[key].items()}
    for key in _SCHEMA_ONE:
        if isinstance(node.get(key), dict):
            out[key] = _close(node[key], keep_open, root)
    for key in _SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            out[key] = [_close(v, keep_open, root) for v in node[key]]
    bound = FORMAT_MAX_LENGTH.get(node.get("format"))
    if bound and "maxLength" not in node and _number(node.get("minLength", 0)) <= bound:
        out["maxLength"] = bound
    if id(node) in keep_open or any(k in node for k in _OTHER_KEYS):
        return out
    names = _merged_keys(root, node)
    if names is not None:
        out["properties"] = {**{n: True for n in names}, **out.get("properties", {})}
        out["additionalProperties"] = False
    return out


def _merged_keys(root, node) -> list[str] | None:
    """The keys `node` lists (its own and its plain allOf branches', required ones included),
    or None when it is not an object that can be closed."""
    if "allOf" in node:
        if any(k in node for k in _COMBINERS if k != "allOf") or not isinstance(
                node.get("properties", {}), dict) or not isinstance(node["allOf"], list):
            return None
        names = _keys(node)
        for branch in node["allOf"]:
            branch = _resolve(root, branch)
            if not isinstance(branch, dict) or not isinstance(branch.get("properties"), dict) \
                    or set(branch) - _PLAIN_OBJECT or branch.get("type", "object") != "object":
                return None
            names += [n for n in _keys(branch) if n not in names]
        return names
    if not isinstance(node.get("properties"), dict) or any(k in node for k in _COMBINERS):
        return None
    return _keys(node)


def _number(value) -> float:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _keys(node) -> list[str]:
    """The names an object schema lists in `properties` and `required`."""
    names = list(node.get("properties", {}))
    required = node.get("required")
    if isinstance(required, list):
        names += [n for n in required if isinstance(n, str) and n not in names]
    return names
