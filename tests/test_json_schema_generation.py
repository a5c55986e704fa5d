"""The schema output is generated from (inference/chat/json_schema.py, llama.cpp's converter's rules):
objects hold only the keys they list unless the schema allows others, date-time and time strings
are bounded. The transform itself, and the compiled grammar (ConstraintSpec's real path into
llguidance) matched byte by byte against JSON texts; every text the grammar accepts must still
validate against the user's schema."""
import copy
import json

import jsonschema
import llguidance
import pytest

from llamatui.inference import ConstraintError, ConstraintSpec, generation_schema


class _Bytes:
    """A byte-level vocabulary for llguidance (256 tokens and an end token)."""
    is_tokenizer_wrapper = True

    def __init__(self):
        self.tokens = [bytes([i]) for i in range(256)] + [b"<end>"]
        self.eos_token_id = 256
        self.bos_token_id = None
        self.special_token_ids = [256]

    def __call__(self, text):
        return list(text.encode())


BYTES = llguidance.LLTokenizer(_Bytes())


def _accepts(schema: dict, text: str) -> bool:
    matcher = llguidance.LLMatcher(BYTES, ConstraintSpec("json_schema", schema).compile(),
                                   log_level=0)
    ids = list(text.encode())
    if matcher.validate_tokens(ids) < len(ids):
        return False
    matcher.consume_tokens(ids)
    return matcher.is_accepting()


def _check(schema: dict, allowed: list[str], refused: list[str]) -> None:
    for text in allowed:
        assert _accepts(schema, text), text
        jsonschema.validate(json.loads(text), schema)
    for text in refused:
        assert not _accepts(schema, text), text


POINT = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
         "required": ["x"]}


def test_listed_keys_only_when_the_schema_says_nothing_of_others():
    _check(POINT, ['{"x": 1}', '{"x": 1, "y": 2}'], ['{"x": 1, "z": 3}', '{"x": 1, "y": 2, "a": 0}'])
    nested = {"type": "object", "properties": {"p": POINT}, "required": ["p"]}
    _check(nested, ['{"p": {"x": 1}}'], ['{"p": {"x": 1, "w": 0}}', '{"p": {"x": 1}, "q": 0}'])
    in_array = {"type": "array", "items": POINT}
    _check(in_array, ['[{"x": 1}, {"x": 2, "y": 3}]'], ['[{"x": 1, "k": true}]'])


def test_the_input_schema_is_not_modified():
    schema = {"$defs": {"p": POINT}, "type": "object", "properties": {"a": {"$ref": "#/$defs/p"}}}
    before = copy.deepcopy(schema)
    closed = generation_schema(schema)
    assert schema == before
    assert closed["additionalProperties"] is False
    assert closed["$defs"]["p"]["additionalProperties"] is False


@pytest.mark.parametrize("other", [
    {"additionalProperties": True}, {"additionalProperties": {"type": "integer"}},
    {"patternProperties": {"^z": {"type": "integer"}}}, {"maxProperties": 3},
    {"minProperties": 1}, {"unevaluatedProperties": {"type": "integer"}},
])
def test_a_schema_that_speaks_of_other_keys_keeps_them(other):
    # llguidance bounds the keys only when every listed one is required
    schema = {**POINT, "required": ["x", "y"], **other}
    assert generation_schema(schema) == schema
    if "unevaluatedProperties" not in other:  # llguidance does not implement it
        assert _accepts(schema, '{"x": 1, "y": 2, "z": 3}')


def test_required_keys_missing_from_properties_stay_possible():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]}
    _check(schema, ['{"a": 1, "b": "anything"}'], ['{"a": 1, "b": 2, "c": 3}'])


def test_allof_of_objects_closes_as_one_object():
    schema = {"allOf": [
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
        {"type": "object", "properties": {"b": {"type": "boolean"}}, "required": ["b"]}]}
    _check(schema, ['{"a": 1, "b": true}'], ['{"a": 1, "b": true, "c": 1}', '{"a": 1}'])


def test_allof_through_a_reference_closes_as_one_object():
    schema = {"$defs": {"base": {"type": "object", "properties": {"id": {"type": "integer"}},
                                 "required": ["id"]}},
              "allOf": [{"$ref": "#/$defs/base"},
                        {"properties": {"name": {"type": "string"}}, "required": ["name"]}]}
    _check(schema, ['{"id": 1, "name": "n"}'], ['{"id": 1, "name": "n", "x": 0}'])


def test_intersections_not_merged_keep_the_spec_default():
    beside_anyof = {"type": "object", "properties": {"kind": {"enum": ["c", "s"]}},
                    "required": ["kind"],
                    "anyOf": [{"properties": {"r": {"type": "integer"}}, "required": ["r"]},
                              {"properties": {"s": {"type": "integer"}}, "required": ["s"]}]}
    assert generation_schema(beside_anyof) == beside_anyof
    _check(beside_anyof, ['{"kind": "c", "r": 1}', '{"kind": "s", "s": 2}'], [])
    mixed_allof = {"allOf": [POINT, {"anyOf": [{"required": ["y"]}]}]}
    assert generation_schema(mixed_allof) == mixed_allof
    _check(mixed_allof, ['{"x": 1, "y": 2}'], [])


def test_unresolvable_references_leave_the_schema_as_given():
    schema = {"type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}}
    assert generation_schema(schema) is schema
    looping = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
               "properties": {"v": {"$ref": "#/$defs/a"}}}
    assert generation_schema(looping) is looping


def test_times_are_bounded_as_llama_cpp_writes_them():
    when = {"type": "object", "required": ["at", "t"], "additionalProperties": False,
            "properties": {"at": {"type": "string", "format": "date-time"},
                           "t": {"type": "string", "format": "time"}}}
    _check(when, ['{"at": "2024-01-31T23:59:59.999+01:00", "t": "23:59:59.999+01:00"}',
                  '{"at": "2024-01-31T23:59:59Z", "t": "08:00:00Z"}'],
           ['{"at": "2024-01-31T23:59:59.0000000000Z", "t": "08:00:00Z"}',
            '{"at": "2024-01-31T23:59:59Z", "t": "08:00:00.000000000Z"}',
            '{"at": "2024-02-30T23:59:59Z", "t": "08:00:00Z"}'])  # the format still holds
    mine = {"type": "string", "format": "date-time", "maxLength": 40}
    assert generation_schema(mine) == mine  # a length the schema gives is its own
    long = {"type": "string", "format": "time", "minLength": 20}
    assert generation_schema(long) == long  # never a bound below the schema's minimum


@pytest.mark.parametrize("depth", [80, 3000])
def test_a_deeply_nested_schema_is_a_clear_error(depth):
    # llguidance refuses the 80 levels itself; 3000 is beyond Python's own recursion
    schema = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    assert generation_schema(schema) is not None  # no RecursionError out of the transform
    with pytest.raises(ConstraintError, match="cannot use this JSON schema"):
        ConstraintSpec("json_schema", schema).compile()


def test_tool_call_arguments_are_closed_too():
    from llamatui.inference.chat.tool_calls import _json
    text = _json({"type": "object", "properties": {"city": {"type": "string"}}})
    assert '"additionalProperties": false' in text
