"""close_objects: which objects it closes, and which it must leave open to stay a narrowing."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from jsonschema import Draft202012Validator

from corral.grammar import ConstraintSpec, compile_constraint
from corral.grammar.core.walk import accepts
from corral.grammar.schema.closed_objects import close_objects

PLAIN = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "object", "properties": {"k": {}}}},
        "meta": {"type": "object", "properties": {"a": {"type": "integer"}}},
    },
    "required": ["name"],
}


def test_plain_objects_are_closed_at_every_depth():
    closed = close_objects(PLAIN)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["meta"]["additionalProperties"] is False
    assert closed["properties"]["tags"]["items"]["additionalProperties"] is False
    assert "additionalProperties" not in PLAIN, "the input is not modified"


@pytest.mark.parametrize(
    "schema",
    [
        {"properties": {"a": {}}, "additionalProperties": True},
        {"properties": {"a": {}}, "patternProperties": {"^x": {}}},
        {"properties": {"a": {}}, "propertyNames": {"maxLength": 3}},
        {"properties": {"a": {}}, "required": ["a", "b"]},  # b is required but undeclared
        {"properties": {"a": {}}, "minProperties": 2},
        {"properties": {"a": {}}, "dependentRequired": {"a": ["c"]}},
        {"properties": {"a": {}}, "enum": [{"a": 1, "z": 2}]},
        {"properties": {"a": {}}, "allOf": [{"properties": {"b": {}}}]},
        {"properties": {"a": {}}, "$ref": "#/$defs/x", "$defs": {"x": {}}},
    ],
)
def test_objects_that_would_lose_valid_instances_or_all_of_them_stay_open(schema):
    assert close_objects(schema) == schema


@pytest.mark.parametrize("keyword", ["allOf", "oneOf"])
def test_branches_of_conjunctions_and_exclusive_unions_stay_open(keyword):
    # allOf of two closed branches would admit nothing; in a oneOf, a closed branch could let
    # through an instance that also matches another branch (and so is invalid).
    schema = {keyword: [{"properties": {"a": {}}}, {"properties": {"b": {}}}]}
    assert close_objects(schema) == schema
    negated = {"not": {"properties": {"a": {}}}}
    assert close_objects(negated) == negated


def test_a_pure_union_closes_its_branches_but_not_next_to_member_constraints():
    union = {"anyOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]}
    assert all(b["additionalProperties"] is False for b in close_objects(union)["anyOf"])
    guarded = {"required": ["b"], "anyOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]}
    assert close_objects(guarded) == guarded


def test_closed_grammar_refuses_undeclared_keys_and_keeps_declared_ones(llama3_tokenizer):
    compiled = compile_constraint(
        ConstraintSpec.json_schema(close_objects(PLAIN)), llama3_tokenizer
    )
    judge = Draft202012Validator(PLAIN)
    good = {"name": "x", "tags": [{"k": 1}], "meta": {"a": 2}}
    extra = {"name": "x", "other": 1}
    assert judge.is_valid(good) and judge.is_valid(extra)  # both valid against PLAIN ...
    tok = llama3_tokenizer
    bitmask = torch.zeros((1, tok.mask_words), dtype=torch.int32)

    def tokens(x):
        return tok.encode(json.dumps(x, separators=(",", ":")))

    assert accepts(compiled.matcher(), tokens(good), bitmask)
    # ... but only the declared keys are generated
    assert not accepts(compiled.matcher(), tokens(extra), bitmask)


def test_boolean_and_non_object_schemas_pass_through():
    for schema in (True, False, {"type": "string"}, {"items": {"type": "integer"}}):
        assert close_objects(copy.deepcopy(schema)) == schema


ADDRESS = {"type": "object", "properties": {"city": {"type": "string"}}}


def test_a_definition_used_only_through_plain_aliases_is_closed():
    schema = {
        "$defs": {"Address": ADDRESS},
        "type": "object",
        "properties": {
            "home": {"$ref": "#/$defs/Address"},
            "work": {"$ref": "#/$defs/Address", "description": "office"},
            "past": {"type": "array", "items": {"$ref": "#/$defs/Address"}},
        },
    }
    closed = close_objects(schema)
    assert closed["additionalProperties"] is False
    assert closed["$defs"]["Address"]["additionalProperties"] is False
    assert "additionalProperties" not in schema["$defs"]["Address"], "the input is not modified"
    draft4 = {"$ref": "#/definitions/M", "definitions": {"M": ADDRESS}}
    assert close_objects(draft4)["definitions"]["M"]["additionalProperties"] is False


def test_a_definition_also_used_from_a_conjunctive_context_stays_open():
    schema = {
        "$defs": {"Address": ADDRESS},
        "type": "object",
        "properties": {
            "home": {"$ref": "#/$defs/Address"},
            "not_there": {"not": {"$ref": "#/$defs/Address"}},
        },
    }
    closed = close_objects(schema)
    assert closed["$defs"]["Address"] == ADDRESS
    assert closed["additionalProperties"] is False  # the root itself is still plain


@pytest.mark.parametrize(
    "schema",
    [
        # `not` of the whole document: closing the root would change what it excludes
        {"properties": {"a": {}, "b": {"not": {"$ref": "#"}}}},
        {"properties": {"a": ADDRESS, "b": {"not": {"$ref": "#/properties/a"}}}},
        {"properties": {"a": {"$id": "http://example.com/a", "properties": {"x": {}}}}},
        {"properties": {"a": {"$dynamicRef": "#node"}}},
    ],
)
def test_references_that_could_see_a_closed_node_leave_the_schema_alone(schema):
    assert close_objects(schema) == schema


def test_a_false_property_does_not_count_towards_min_properties():
    schema = {"properties": {"a": False, "b": {}}, "minProperties": 2}
    assert close_objects(schema) == schema
