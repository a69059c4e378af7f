"""The analysis records each keyword rewrite it applies (keyword, pointer into the input, what it
did) and nothing for keywords the backend takes as written; a compile keeps the records, with
pointers into a structural tag's source for its schemas."""

from __future__ import annotations

import pytest

from corral.grammar import ConstraintSpec, compile_constraint
from corral.grammar.schema import rewrite_log as log
from corral.grammar.schema.analysis import analyze_schema
from corral.grammar.schema.rewrite_log import Rewritten

OBJ = {"type": "object", "additionalProperties": False}

CASES = [
    (
        {"oneOf": [{"type": "integer"}, {"type": "string"}]},
        [("/oneOf", "oneOf", log.ONE_OF_DISJOINT)],
    ),
    (
        OBJ | {"properties": {"x": {"oneOf": [{"minimum": 0}, {"maximum": 5}], "type": "integer"}}},
        [("/properties/x/oneOf", "oneOf", log.ONE_OF_NEGATED)],
    ),
    ({"not": {"type": "string"}}, [("/not", "not", log.NOT_FOLDED)]),
    ({"not": {"not": {"type": "string"}}}, [("/not", "not", log.NOT_NOT)]),
    ({"type": "string", "pattern": r"^\d+$"}, [("/pattern", "pattern", log.PATTERN_NARROWED)]),
    ({"type": "string", "pattern": "^a(?=b)"}, [("/pattern", "pattern", log.PATTERN_LOOKAROUND)]),
    ({"type": "string", "format": "date"}, [("/format", "format", log.FORMAT_PATTERN)]),
    (
        {"type": "string", "if": {"maxLength": 2}, "then": {"pattern": "^a"}},
        [("/if", "if", log.IF_ANY_OF)],
    ),
    (
        {"type": "array", "items": {"enum": [1, 2]}, "uniqueItems": True},
        [("/uniqueItems", "uniqueItems", log.UNIQUE_ITEMS_ENUM)],
    ),
    (
        {"type": "object", "propertyNames": {"enum": ["a", "b"]}},
        [("/propertyNames", "propertyNames", log.PROPERTY_NAMES_KEYS)],
    ),
    (
        {"type": "object", "minProperties": 2, "additionalProperties": {"type": "integer"}},
        [("/minProperties", "minProperties", log.DISTINCT_KEYS)],
    ),
    (
        {"type": "array", "items": [{"type": "integer"}]},
        [("/items", "items", log.ITEMS_TUPLE)],
    ),
    (
        {"enum": [1, 2, 3], "allOf": [{"minimum": 2}]},
        [("", "allOf", log.FOLDED_ENUM)],
    ),
    (
        {"type": "array", "items": {"enum": list("abcdefg")}, "uniqueItems": True},
        [("/uniqueItems", "uniqueItems", log.UNIQUE_CHECK_LISTED)],
    ),
    (
        {"$schema": "http://json-schema.org/draft-07/schema#", "$ref": "#/$defs/a", "type": "null"}
        | {"$defs": {"a": {"type": "string"}}},
        [("/$ref", "$ref", log.REF_ALONE)],
    ),
    (
        {"$schema": "http://json-schema.org/draft-04/schema#", "maximum": 1}
        | {"exclusiveMaximum": True},
        [("/exclusiveMaximum", "exclusiveMaximum", log.BOOLEAN_BOUND)],
    ),
]


@pytest.mark.parametrize(("schema", "expected"), CASES)
def test_each_rewrite_is_recorded_where_it_applies(schema, expected):
    assert analyze_schema(schema).rewrites == tuple(Rewritten(*e) for e in expected)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
        {"type": "string", "pattern": "^[a-z]+$", "maxLength": 8},
        {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}]},
    ],
)
def test_keywords_taken_as_written_leave_no_record(schema):
    assert analyze_schema(schema).rewrites == ()


def test_a_refused_keyword_is_unenforced_not_rewritten():
    plan = analyze_schema({"type": "string", "pattern": "a(?!x)"}, lenient=True)
    assert plan.rewrites == () and [u.keyword for u in plan.unenforced] == ["pattern"]


def test_compiles_keep_the_records(llama3_tokenizer):
    one_of = {"oneOf": [{"type": "integer"}, {"type": "string"}]}
    compiled = compile_constraint(
        ConstraintSpec.json_schema(OBJ | {"properties": {"a": one_of}}), llama3_tokenizer
    )
    assert compiled.rewrites == (Rewritten("/properties/a/oneOf", "oneOf", log.ONE_OF_DISJOINT),)
    inner = {"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"}}}
    open_objects = {"type": "array", "items": inner}
    laid_out = compile_constraint(ConstraintSpec.json_schema(open_objects), llama3_tokenizer)
    assert laid_out.rewrites == (Rewritten("/items/properties", "properties", log.ANY_ORDER),)
    tag = {
        "type": "structural_tag",
        "triggers": ["<call>"],
        "structures": [
            {"begin": "<call>f", "schema": {"type": "string"}, "end": "</call>"},
            {"begin": "<call>g", "schema": one_of, "end": "</call>"},
        ],
    }
    tagged = compile_constraint(ConstraintSpec.structural_tag_of(tag), llama3_tokenizer)
    assert tagged.rewrites == (
        Rewritten("/structures/1/schema/oneOf", "oneOf", log.ONE_OF_DISJOINT),
    )
