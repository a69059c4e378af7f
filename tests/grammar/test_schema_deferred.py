"""A `not` whose negation the backend cannot take, settled by the finite domain beside it
(``grammar.schema_deferred``): folded into one `enum` where the values are listed, refused (or
reported, lenient) where they are not. Judged by ``jsonschema`` with the schema as sent."""

from __future__ import annotations

import json

import pytest
import torch
from grammar_walkers import assert_walks_valid_without_repeats
from jsonschema import Draft202012Validator

from corral.fuzz.targets import FORMAT
from corral.grammar import ConstraintError, ConstraintSpec, compile_constraint
from corral.grammar.core.walk import accepts
from corral.grammar.schema.analysis import analyze_schema
from corral.grammar.schema.rewrite_log import FOLDED_ENUM

SETTLED = [
    {"allOf": [{"enum": [{"a": 0}, {"a": False}, [1]]}, {"not": {"enum": [{"a": False}]}}]},
    {
        "allOf": [
            {"enum": [2, 6, 30, 7]},
            {"not": {"anyOf": [{"multipleOf": 2}, {"multipleOf": 3}]}},
        ]
    },
    {
        "enum": [{"aaaa": 31}, {"aaaa": 3}, {"b": "x"}],
        "not": {"patternProperties": {"a*": {"type": "integer"}, "aaa*": {"maximum": 20}}},
    },
]


@pytest.mark.parametrize("schema", SETTLED, ids=range(len(SETTLED)))
def test_a_not_beside_listed_values_folds_to_exactly_the_values_it_allows(schema):
    plan = analyze_schema(schema)
    judge = Draft202012Validator(schema)
    candidates = schema["allOf"][0]["enum"] if "allOf" in schema else schema["enum"]
    expected = [v for v in candidates if judge.is_valid(v)]
    assert plan.schema == {"enum": expected}
    assert 0 < len(expected) < len(candidates)  # the `not` ruled some values out


def test_a_not_no_fold_settles_is_refused_or_reported_as_before():
    schema = {"type": "object", "not": {"patternProperties": {"a": {"type": "integer"}}}}
    with pytest.raises(ConstraintError) as info:
        analyze_schema(schema)
    assert (info.value.pointer, info.value.keyword) == ("/not", "not")
    assert "patternProperties" in info.value.reason
    lenient = analyze_schema(schema, lenient=True)
    assert [(u.pointer, u.keyword) for u in lenient.unenforced] == [("/not", "not")]
    assert "not" not in str(lenient.schema)  # dropped, never handed to the backend


def test_a_held_not_under_another_negation_is_refused_with_its_own_reason():
    schema = {"oneOf": [{"not": {"multipleOf": 3}}, {"type": "string"}]}
    with pytest.raises(ConstraintError) as info:
        analyze_schema(schema)
    assert "multipleOf" in info.value.reason


ONE_OF_LISTS = [
    {  # MaskBench Handwritten---key8: arrays listed in each branch, one kept by if/then
        "type": "array",
        "oneOf": [
            {"enum": [[1], [3, 4], [5]]},
            {"enum": [[1], [1, 2]]},
            {"$ref": "#/$defs/z"},
        ],
        "if": {"minItems": 1},
        "then": {"minItems": 2, "items": {"exclusiveMaximum": 5}},
        "$defs": {"z": {"enum": [[1], [3, 4], [5], [{"k": [2]}]]}},
    },
    {"oneOf": [{"const": {"a": [1]}}, {"enum": [{"a": [1]}, {"b": 1}, 2]}, {"type": "integer"}]},
]
POOL = [[1], [3, 4], [5], [1, 2], [{"k": [2]}], [], {"a": [1]}, {"b": 1}, {"a": [1], "b": 0}, 2, 3]


@pytest.mark.parametrize("schema", ONE_OF_LISTS, ids=range(len(ONE_OF_LISTS)))
def test_a_oneof_branch_of_listed_values_keeps_those_no_other_branch_takes(
    schema, llama3_tokenizer
):
    """A branch that lists its values needs no negation the backend can take: each value is
    kept when the judge finds it in that branch alone (before: "negating an array value in
    enum/const is not supported"). The compiled grammar accepts exactly the judge's values."""
    tok = llama3_tokenizer
    plan = analyze_schema(schema)
    assert any(r.rewrite == FOLDED_ENUM for r in plan.rewrites)
    judge = Draft202012Validator(schema)
    c = compile_constraint(ConstraintSpec.json_schema(schema, json_format=FORMAT), tok)
    bitmask = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    assert any(judge.is_valid(v) for v in POOL)
    for value in POOL:
        text = json.dumps(value, separators=(", ", ": "))
        assert accepts(c.matcher(), tok.encode(text), bitmask) == judge.is_valid(value), text
    assert_walks_valid_without_repeats(c.matcher, schema, tok, 8, 40)


def test_a_oneof_branch_that_is_not_listed_still_needs_its_negations():
    schema = {"oneOf": [{"const": {"a": [1]}}, {"type": "object", "required": ["a"]}]}
    with pytest.raises(ConstraintError) as info:  # the second branch must rule the object out
        analyze_schema(schema)
    assert (info.value.pointer, info.value.keyword) == ("/oneOf", "oneOf")


@pytest.mark.parametrize(
    "schema", [{"oneOf": [True, {"enum": [1, "a"]}]}, {"oneOf": [{"enum": [[1]]}, True]}]
)
def test_a_oneof_beside_a_true_branch_is_analysed_or_refused_never_crashes(schema):
    """`true` is a live branch that lists nothing (found by the schema-copies fuzz test: the
    listed-branch check read it as an object: an AttributeError instead of an analysis)."""
    try:
        plan = analyze_schema(schema)
    except ConstraintError as e:
        assert e.keyword == "oneOf"
        return
    judge = Draft202012Validator(schema)
    rewritten = Draft202012Validator(plan.judged_schema())
    for value in POOL:
        assert rewritten.is_valid(value) == judge.is_valid(value), value
