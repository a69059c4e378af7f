"""`grammar.shortest` on real schemas: every prefix of every valid MaskBench instance, completed
with the closing text it proposes, is an instance of the schema (jsonschema judges), and the
shortest instance of each schema is one too. A prefix it cannot complete answers None (the
engine then does not take the token that led there); that share is bounded here."""

from __future__ import annotations

import json

import pytest
import torch
from budget_schemas import AREA, OUT_OF_ORDER, SCHEMAS, TAGGED
from grammar_walkers import assert_closings_valid
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema
from jsonschema import Draft202012Validator

from corral.grammar import ConstraintError, ConstraintSpec, compile_constraint
from corral.grammar.closing.partial_json import PartialJson
from corral.grammar.closing.shortest import JsonCloser
from corral.grammar.core.walk import accepts as walk_accepts

NUM_SCHEMAS = 60


def cases(corpus):
    files = sorted(corpus("maskbench").glob("*.json"))
    for path in files[:: max(1, len(files) // NUM_SCHEMAS)]:
        data = json.loads(path.read_text())
        valid = [t["data"] for t in data.get("tests", []) if t.get("valid")]
        if valid:
            yield path.name, data["schema"], valid[0]


def test_closings_of_real_prefixes_are_valid(corpus):
    checked = unknown = 0
    for name, schema, instance in cases(corpus):
        try:
            closer = JsonCloser.for_spec(ConstraintSpec.json_schema(schema))
        except ConstraintError:
            continue
        judge = Draft202012Validator(schema)
        shortest = closer.shortest(closer.root)
        if shortest is not None:
            assert judge.is_valid(json.loads(shortest)), (name, shortest)
        text = json.dumps(instance, ensure_ascii=False)
        partial = PartialJson.empty(closer)
        for i, ch in enumerate(text):
            partial.feed(ch)
            found = partial.closing()
            checked += 1
            if found is None:
                unknown += 1
                continue
            done = text[: i + 1] + found[0]
            assert judge.is_valid(json.loads(done)), (name, done)
    assert checked > 5000
    assert unknown / checked < 0.1, (unknown, checked)


@pytest.mark.parametrize(
    ("schema", "prefix", "closing"),
    [
        ({"type": "array", "items": {"type": "integer"}, "minItems": 2}, "[1", ",0]"),
        ({"enum": ["alpha", "beta"]}, '"al', 'pha"'),
        # a pattern is searched: a string not yet matching grows into one that contains it
        ({"type": "string", "pattern": "1.2"}, '"2', '1a2"'),
        ({"type": "string", "pattern": "^x\\d"}, '"x', '0"'),
        ({"type": "string", "pattern": "b$"}, '"ba', 'b"'),
        # a listed number finishes as the backend spells it (1.0 as 1)
        ({"enum": [1.1, 20, 3.0]}, "1", ".1"),
        ({"enum": [1.1, 20, 3.0]}, "3", ""),
        # a half-written escape finishes as a listed string spells it
        ({"enum": ['a"b', "a\\c"]}, '"a\\', '"b"'),
        ({"enum": ['a"b', "a\\c"]}, '"a\\\\', 'c"'),
        ({"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}, '"AB', '-000"'),
        ({"type": "integer", "minimum": 10}, "1", "0"),
        (
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
            '{"',
            'a":""}',
        ),
        ({"type": "object"}, '{"x":[tr', "ue]}"),
        # a surrogate pair is one character: its high half is finished with a low one
        ({"type": "string", "minLength": 2}, '"\\ud8', '00\\udc00a"'),
        ({"type": "string", "minLength": 2}, '"\\ud800\\ude', '00a"'),
    ],
)
def test_closing_text(schema, prefix, closing):
    partial = PartialJson.empty(JsonCloser(schema))
    partial.feed(prefix)
    assert partial.closing()[0] == closing


@pytest.mark.parametrize(
    ("schema", "instance"),
    [
        (AREA, {"shape": "s", "dimensions": {"base": 1, "height": 2}}),
        (AREA, {"shape": "s", "dimensions": {"base": 1, "length": 2}}),
        (AREA, {"shape": "s", "dimensions": {"radius": 1.5}}),
        (TAGGED, [{"kind": "box", "w": "ab"}, {"kind": "circle", "r": 1}]),
    ],
)
def test_closings_follow_the_branch_entered(schema, instance):
    text = json.dumps(instance, separators=(",", ":"))
    assert assert_prefixes_close(schema, text) == len(text)  # every prefix has one


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema=SCHEMAS, data=st.data())
def test_closings_of_drawn_instances_are_valid(schema, data):
    """Drawn schemas (with `oneOf`/`anyOf` unions), a drawn valid instance: the closing of each
    of its prefixes, where one is proposed, completes a valid instance."""
    instance = data.draw(from_schema(schema))
    assert_prefixes_close(schema, json.dumps(instance, separators=(",", ":")))


def test_a_repeated_name_is_made_unique():
    """The grammar refuses a repeated key: a name typed so far that equals a present one is
    extended, not closed as it is."""
    partial = PartialJson.empty(JsonCloser({"type": "object"}))
    partial.feed('{"ab":1,"ab')
    assert partial.closing()[0] == '0":0}'


def assert_prefixes_close(schema, text: str) -> int:
    """Every closing proposed for a prefix of `text` completes a valid instance (the grammar's
    view of the schema, as the engine builds it); returns how many were proposed."""
    try:
        closer = JsonCloser.for_spec(ConstraintSpec.json_schema(schema))
    except ConstraintError:  # a drawn union the grammar cannot enforce exactly: not a case
        assume(False)
    judge = Draft202012Validator(schema)
    partial, proposed = PartialJson.empty(closer), 0
    for i, ch in enumerate(text):
        partial.feed(ch)
        found = partial.closing()
        if found is not None:
            done = text[: i + 1] + found[0]
            assert judge.is_valid(json.loads(done)), done
            proposed += 1
    return proposed


def test_no_instance_means_no_closing():
    assert PartialJson.empty(JsonCloser({"type": "string", "minLength": 10**9})).closing() is None


ONE_OF_REQUIRED = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "name": {"type": "boolean"},
        "tags": {"type": "boolean"},
        "a": {"type": "boolean"},
    },
    "oneOf": [
        {"required": ["a"]},
        {"required": ["a", "id"]},
        {"required": ["a", "name"]},
        {"required": ["a", "tags"]},
        {"required": ["id"]},
        {"required": ["id", "name"]},
        {"required": ["id", "tags"]},
    ],
}
PATTERN_BRANCHES = {
    "type": "object",
    "properties": {
        "a": {
            "anyOf": [
                {
                    "properties": {"kind": {"const": "k0"}, "id": {"pattern": "^[A-Z]{2}$"}},
                    "required": ["kind", "id"],
                },
                {"properties": {"kind": {"const": "k1"}, "id": {"type": "string"}}},
            ]
        }
    },
}


@pytest.mark.parametrize(
    ("schema", "text"),
    [
        (ONE_OF_REQUIRED, '{"id": ""}'),  # more branches than the closer follows
        (PATTERN_BRANCHES, '{"a": {"id": "0", "kind": "k1"}}'),  # "0" rules out k0's pattern
    ],
)
def test_a_closing_never_follows_a_branch_the_text_has_ruled_out(schema, text):
    closer = JsonCloser.for_spec(ConstraintSpec.json_schema(schema))
    judge = Draft202012Validator(schema)
    partial = PartialJson.empty(closer)
    for i, ch in enumerate(text):
        partial.feed(ch)
        found = partial.closing()
        if found is not None:
            assert judge.is_valid(json.loads(text[: i + 1] + found[0])), text[: i + 1] + found[0]


def test_a_closing_keeps_the_declared_order_the_grammar_writes(llama3_tokenizer):
    """Found by hypothesis (the budget test with the real model): after `{"a":true,` the closer
    proposed `"b_c":true}`, which the grammar refuses, so the output was cut."""
    compiled = compile_constraint(ConstraintSpec.json_schema(OUT_OF_ORDER), llama3_tokenizer)
    closed = assert_closings_valid(OUT_OF_ORDER, compiled, '{"a":true,', llama3_tokenizer)
    assert closed >= 3  # after `{"a":`, `{"a":true` and `{"a":true,`


@pytest.mark.parametrize(
    ("node", "shortest"),
    [
        # no integer in the range: a short decimal inside it (found through a real server,
        # where such an output ran to `max_tokens` unclosed: "no shortest valid instance")
        ({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}, "0.1"),
        ({"type": "number", "exclusiveMinimum": -1, "exclusiveMaximum": -0.5}, "-0.6"),
        ({"type": "number", "exclusiveMinimum": 0.3, "exclusiveMaximum": 0.30001}, "0.300001"),
        ({"type": "number", "minimum": 2.25, "maximum": 2.75}, "2.3"),
        ({"type": "number", "exclusiveMaximum": -3}, "-4"),
        ({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 1}, None),
    ],
)
def test_the_shortest_number_lies_inside_its_bounds(node, shortest, llama3_tokenizer):
    closer = JsonCloser({"type": "object", "properties": {"n": node}, "required": ["n"]})
    text = closer.shortest(closer.root)
    assert text == (None if shortest is None else '{"n":' + shortest + "}")
    if text is not None:
        assert Draft202012Validator(closer.root).is_valid(json.loads(text))
        compiled = compile_constraint(ConstraintSpec.json_schema(closer.root), llama3_tokenizer)
        bitmask = torch.zeros((1, llama3_tokenizer.mask_words), dtype=torch.int32)
        assert walk_accepts(compiled.matcher(), llama3_tokenizer.encode(text), bitmask)


def test_a_pattern_key_begun_is_finished_by_its_pattern(llama3_tokenizer):
    """A key begun in an object whose other keys must match a pattern: the closing finishes
    it as the pattern allows (before, no closing was known, so budget closing ended such an
    output at once, as `length`)."""
    schema = {
        "type": "object",
        "properties": {"devices": {"type": "object", "additionalProperties": False}},
        "required": ["devices"],
    }
    schema["properties"]["devices"]["patternProperties"] = {"^[0-9a-f]{4}$": {"type": "integer"}}
    compiled = compile_constraint(ConstraintSpec.json_schema(schema), llama3_tokenizer)
    text = '{"devices":{"0a1f":1,"b'
    assert_closings_valid(schema, compiled, text, llama3_tokenizer, always=True)


MIN_PROPERTIES = [
    {"type": "object", "patternProperties": {"^B[0-9]+$": {}}, "additionalProperties": False},
    {"type": "object", "additionalProperties": {"type": "integer"}},
    {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {}}},
    {"type": "object", "properties": {"x": False}, "patternProperties": {"^x": {"const": 1}}},
]


@pytest.mark.parametrize("bound", [1, 2])
@pytest.mark.parametrize("node", MIN_PROPERTIES, ids=range(len(MIN_PROPERTIES)))
def test_closings_fill_min_properties_with_keys_the_object_allows(node, bound, llama3_tokenizer):
    """`minProperties` above the required keys: the closing writes the shortest further
    members the object allows (declared ones, then keys of each pattern, then other keys),
    judged by the schema and accepted by its matcher (MaskBench bitbucket-pipelines: before,
    `{}` was proposed, which both refuse)."""
    schema = {"type": "object", "properties": {"o": {**node, "minProperties": bound}}}
    schema["required"] = ["o"]
    compiled = compile_constraint(ConstraintSpec.json_schema(schema), llama3_tokenizer)
    closings = assert_closings_valid(schema, compiled, '{"o":{', llama3_tokenizer, always=True)
    assert closings >= 5


@pytest.mark.parametrize("excluded", ['"', "\\", "a\u00e9"])
def test_a_string_that_must_not_equal_a_value_closes(excluded, llama3_tokenizer):
    """`not: {const: ...}` writes a regex with `\\u` escapes, which the closer's automaton
    reader did not take: no shortest instance, so budget closing ended such outputs unclosed
    (a real server, `max_tokens` 12: `{"s":"heroes~12345`, `complete: false`)."""
    schema = {"type": "object", "properties": {"s": {"not": {"const": excluded}}}}
    schema["required"] = ["s"]
    compiled = compile_constraint(ConstraintSpec.json_schema(schema), llama3_tokenizer)
    text = '{"s":"' + excluded.replace("\\", "\\\\").replace('"', '\\"') + 'x"}'
    assert assert_closings_valid(schema, compiled, text, llama3_tokenizer, always=True)


@pytest.mark.parametrize(
    ("pattern", "text"), [("^([^,]+(,|$)){3,}$", "ab,c,d"), ("^(?!fo)[a-z]+$", "fa")]
)
def test_a_pattern_the_closer_cannot_read_closes_through_its_rewritten_form(
    pattern, text, llama3_tokenizer
):
    """A pattern with a look-around or an end anchor inside is completed through the form the
    backend got (written without them): before, the closer could not read it, so no closing
    was known at any point of such a string."""
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}}
    schema["required"] = ["s"]
    compiled = compile_constraint(ConstraintSpec.json_schema(schema), llama3_tokenizer)
    found = assert_closings_valid(schema, compiled, '{"s":"' + text, llama3_tokenizer)
    assert found >= len(text)
