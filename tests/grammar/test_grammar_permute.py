"""Required properties in any order (``grammar.schema_permute``): exact by construction, so the
tests check both sides with ``jsonschema`` as the judge -- the rewritten schema accepts exactly
what the original does (random instances), every order of the required keys compiles to an
accepted output, and random walks of the compiled grammar are valid and never repeat a key.
"""

from __future__ import annotations

import itertools
import random

import pytest
from grammar_walkers import assert_walks_valid_without_repeats
from jsonschema import Draft202012Validator

from corral.grammar import ConstraintSpec, compile_constraint
from corral.grammar.schema_order import backend_layout
from corral.grammar.schema_permute import MAX_REQUIRED, permute_required
from corral.grammar.walk import accepts

NESTED = {
    "type": "object",
    "properties": {
        "note": {"type": "string", "maxLength": 3},
        "point": {
            "type": "object",
            "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
            "required": ["x"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
        "id": {"type": "integer", "minimum": 0},
    },
    "required": ["id", "point", "tags"],
}
CLOSED = {
    "type": "object",
    "properties": {"a": {"type": "boolean"}, "b": {"type": "null"}, "c": {"enum": [1, 2]}},
    "required": ["c", "a"],
    "additionalProperties": False,
}
LATE_REQUIRED = {
    "type": "object",
    "properties": {"opt": {"type": "boolean"}, "name": {"type": "string", "maxLength": 4}},
    "required": ["name"],
}
SCHEMAS = [NESTED, CLOSED, LATE_REQUIRED]


def _compile(schema, tok):
    return compile_constraint(ConstraintSpec.json_schema(schema), tok)


def _accepts(c, text: str, tok) -> bool:
    import torch

    bitmask = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    return accepts(c.matcher(), tok.encode(text), bitmask)


def _value(rng: random.Random, depth: int = 0):
    kinds = ["null", "bool", "int", "str"] + (["list", "obj"] if depth < 2 else [])
    kind = rng.choice(kinds)
    if kind == "null":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "int":
        return rng.choice([-1, 0, 1, 2, 7])
    if kind == "str":
        return rng.choice(["", "a", "b", "abcd", "ab"])
    if kind == "list":
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    names = ["a", "b", "c", "x", "y", "id", "note", "point", "tags", "opt", "name", "zz"]
    return {k: _value(rng, depth + 1) for k in rng.sample(names, rng.randint(0, 5))}


_SAMPLES = {
    "integer": [0, 1, 3, -1],
    "string": ["", "ab", "abcde"],
    "boolean": [True, False],
    "null": [None],
    "array": [[], ["a"], ["a", "b", "a"], [1]],
}


def _like(schema: dict, rng: random.Random):
    """An instance near ``schema``: mostly fitting values for its properties, some keys left
    out or added, in random order."""
    if rng.random() < 0.1:
        return _value(rng)
    if "properties" not in schema:
        options = schema.get("enum") or _SAMPLES.get(schema.get("type"), [None])
        return rng.choice(options)
    names = list(schema["properties"])
    out = {}
    for name in rng.sample(names, len(names)):
        if rng.random() < 0.9:
            out[name] = _like(schema["properties"][name], rng)
    if rng.random() < 0.2:
        out["zz"] = _value(rng, 1)
    return out


@pytest.mark.parametrize("schema", SCHEMAS)
def test_the_layouts_accept_exactly_what_the_schema_does(schema):
    rewritten = permute_required(schema)
    assert rewritten is not schema and "anyOf" in rewritten
    judge, judge2 = Draft202012Validator(schema), Draft202012Validator(rewritten)
    rng = random.Random(7)
    valid = 0
    for _ in range(3000):
        instance = _like(schema, rng)
        assert judge.is_valid(instance) == judge2.is_valid(instance), instance
        valid += judge.is_valid(instance)
    assert valid >= 30


def test_nodes_the_backend_merges_keep_their_layout():
    merged = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "anyOf": [{"required": ["c"]}, {"required": ["d"]}],
    }
    assert permute_required(merged) is merged
    referenced = {
        "$defs": {
            "p": {"type": "object", "properties": {"a": {}, "b": {}}, "required": ["b", "a"]}
        },
        "allOf": [{"$ref": "#/$defs/p"}, {"required": ["c"]}],
    }
    assert permute_required(referenced) is referenced
    too_many = {"type": "object", "properties": {str(i): {} for i in range(MAX_REQUIRED + 1)}}
    too_many["required"] = list(too_many["properties"])
    assert permute_required(too_many) is too_many


def test_the_layouts_copy_the_object(llama3_tokenizer):
    out = permute_required(NESTED)
    assert len(out["anyOf"]) == 7  # the declared order ("note" first), then 3! required-first
    assert [list(layout["properties"])[:3] for layout in out["anyOf"][1:3]] == [
        ["id", "point", "tags"],
        ["id", "tags", "point"],
    ]
    # an object around layouts keeps its order: copies of copies would multiply
    inner = {"type": "object", "properties": {"a": {}, "b": {}}, "required": ["b", "a"]}
    outer = {"type": "object", "properties": {"p": inner, "q": {}}, "required": ["q", "p"]}
    out = permute_required(outer)
    assert list(out["properties"]) == ["p", "q"] and len(out["properties"]["p"]["anyOf"]) == 2
    # a required property the backend finds unsatisfiable still only drops its branch
    unsat = {"type": "array", "enum": [f"v{i}" for i in range(60)]}
    schema = {
        "anyOf": [
            {"type": "object", "properties": {"b": {}, "a": unsat}, "required": ["a", "b"]},
            {"type": "string", "maxLength": 2},
        ]
    }
    assert "anyOf" in permute_required(schema)["anyOf"][0]
    c = _compile(schema, llama3_tokenizer)
    assert _accepts(c, '"ab"', llama3_tokenizer)
    assert not _accepts(c, '{"a":"v1","b":1}', llama3_tokenizer)


def test_every_order_of_the_required_keys_is_accepted(llama3_tokenizer):
    tok = llama3_tokenizer
    c = _compile(NESTED, tok)
    assert c.distinct_keys  # the optional "note" is a free key: no key may repeat
    parts = {"id": '"id":3', "point": '"point":{"x":1,"y":2}', "tags": '"tags":["a"]'}
    for order in itertools.permutations(parts):
        body = ",".join(parts[k] for k in order)
        assert _accepts(c, "{" + body + "}", tok), body
        assert _accepts(c, "{" + body + ',"note":"ab"}', tok), body
        # an optional key before the required ones: only in the declared layout
        declared = order == ("point", "tags", "id")
        assert _accepts(c, '{"note":"ab",' + body + "}", tok) == declared, body
    assert not _accepts(c, '{"id":3,"tags":["a"]}', tok)  # a required key missing
    assert not _accepts(c, '{"id":3,"point":{"y":1},"tags":[]}', tok)
    assert not _accepts(c, '{"id":3,"tags":[],"point":{"x":1,"y":2},"id":4}', tok)
    assert not _accepts(c, '{"id":3,"tags":[],"point":{"x":1,"y":2,"z":0}}', tok)

    closed = _compile(CLOSED, tok)
    for body in ('"a":true,"c":1', '"c":1,"a":true', '"c":2,"a":false,"b":null'):
        assert _accepts(closed, "{" + body + "}", tok), body
    assert not _accepts(closed, '{"c":1,"b":null}', tok)
    assert not _accepts(closed, '{"c":1,"a":true,"z":1}', tok)

    late = _compile(LATE_REQUIRED, tok)
    for body in ('"opt":true,"name":"x"', '"name":"x","opt":true', '"name":"x"'):
        assert _accepts(late, "{" + body + "}", tok), body
    assert not _accepts(late, '{"opt":true}', tok)


def test_the_freed_layouts_are_recorded_as_the_object_they_copy():
    schema, distinct, freed = backend_layout(NESTED, False)
    assert distinct and freed == [NESTED]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_walks_are_valid_and_never_repeat_a_key(schema, llama3_tokenizer):
    c = _compile(schema, llama3_tokenizer)
    assert_walks_valid_without_repeats(c.matcher, schema, llama3_tokenizer, 16, 300)


def test_a_merge_elsewhere_keeps_only_its_own_order(llama3_tokenizer):
    tok = llama3_tokenizer
    part = {"type": "object", "properties": {"p": {"type": "integer"}, "q": {}}}
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {}}},
            "b": {"allOf": [part, {"required": ["p"]}]},
        },
    }
    out, distinct, freed = backend_layout(schema, False)
    assert distinct and schema in freed and schema["properties"]["a"] in freed
    assert out["patternProperties"]["^b$"]["allOf"][0] == part  # inside the merge: as it was
    c = _compile(schema, tok)
    for text in ('{"a":{"y":1,"x":2}}', '{"b":{"p":1},"a":{}}', '{"b":{"p":1,"q":0}}'):
        assert _accepts(c, text, tok), text
    assert not _accepts(c, '{"a":{"x":1,"x":2}}', tok)
    assert not _accepts(c, '{"b":{"q":1}}', tok)
