"""Negations taken beside a context (``grammar.negate_context``): what the other ``oneOf``
branch rules out at a member or an item is left out of the negation, so it needs no ``contains``.

Real compiles, random walks judged by ``jsonschema`` with the schema as sent.
"""

from __future__ import annotations

import pytest
from grammar_walkers import assert_walks_valid_without_repeats

from corral.grammar import ConstraintError, ConstraintSpec, compile_constraint
from corral.grammar.schema.analysis import analyze_schema

EVENTS = {"type": "string", "enum": ["all", "changed", "added"]}
#: each needed `contains` before: the other branch's context makes it unnecessary
SCHEMAS = {
    # `events` is an array in one branch and a string in the other (grunt-watch's shape)
    "member-types": {
        "type": "object",
        "oneOf": [
            {"properties": {"events": {"type": "array", "items": EVENTS}}},
            {"properties": {"events": EVENTS}},
        ],
    },
    # the items of one branch are strings, of the other numbers: only the empty array is in both
    "item-types": {
        "oneOf": [
            {"type": "array", "items": {"type": "string"}, "maxItems": 3},
            {"type": "array", "items": {"type": "number"}, "maxItems": 3},
        ]
    },
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_a_negation_beside_its_context_is_exact(name, llama3_tokenizer):
    schema = SCHEMAS[name]
    compiled = compile_constraint(ConstraintSpec.json_schema(schema), llama3_tokenizer)
    assert_walks_valid_without_repeats(compiled.matcher, schema, llama3_tokenizer, 40, 80)


def test_the_empty_array_that_both_branches_accept_is_left_out():
    plan = analyze_schema(SCHEMAS["item-types"])
    from jsonschema import Draft202012Validator

    judge = Draft202012Validator(plan.judged_schema())
    assert not judge.is_valid([])  # in both branches: not exactly one
    assert judge.is_valid(["a"]) and judge.is_valid([1.5]) and not judge.is_valid(["a", 1])


def test_without_a_context_that_rules_it_out_contains_is_still_refused():
    schema = {
        "oneOf": [
            {"type": "array", "items": {"type": "string"}},
            {"type": "array", "items": {"type": "string", "minLength": 2}},
        ]
    }
    with pytest.raises(ConstraintError) as info:
        analyze_schema(schema)
    assert "contains" in str(info.value)


@pytest.mark.parametrize("name", ["max-properties", "closed"])
def test_branches_apart_by_property_counts_compile_and_walk_validly(name, llama3_tokenizer):
    """No negation needed (``schema_disjoint`` counts properties): compiled as it is."""
    from test_schema_analysis import COUNTED

    schema = COUNTED[name]
    compiled = compile_constraint(ConstraintSpec.json_schema(schema), llama3_tokenizer)
    assert_walks_valid_without_repeats(compiled.matcher, schema, llama3_tokenizer, 40, 80)
