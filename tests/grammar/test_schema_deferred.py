"""A `not` whose negation the backend cannot take, settled by the finite domain beside it
(``grammar.schema_deferred``): folded into one `enum` where the values are listed, refused (or
reported, lenient) where they are not. Judged by ``jsonschema`` with the schema as sent."""

from __future__ import annotations

import pytest
from jsonschema import Draft202012Validator

from corral.grammar import ConstraintError
from corral.grammar.schema_analysis import analyze_schema

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
