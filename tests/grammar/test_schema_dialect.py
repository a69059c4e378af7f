"""Schemas read in the dialect their ``$schema`` names (``grammar.schema_dialect``), as the judge
reads them: drafts 3 to 7 ignore keywords beside a ``$ref``; drafts 3 and 4 write exclusive
bounds as booleans. Real compiles (Llama-3 tokenizer), texts walked through the matcher and mask,
verdicts from ``jsonschema``'s validator for the schema's own dialect.
"""

from __future__ import annotations

import json

import pytest
import torch
from grammar_walkers import assert_walks_valid_without_repeats
from jsonschema import Draft202012Validator, validators

from corral.grammar import ConstraintSpec, compile_constraint
from corral.grammar.core.walk import accepts
from corral.grammar.schema import rewrite_log as log
from corral.grammar.schema.dialect import dialect_of

DRAFT4 = "http://json-schema.org/draft-04/schema#"
DRAFT7 = "http://json-schema.org/draft-07/schema#"
LATEST = "https://json-schema.org/draft/2020-12/schema"

STRING_DEF = {"definitions": {"s": {"type": "string"}}}
#: schema -> instances judged by the schema's own dialect
CASES = {
    "draft-04 exclusive maximum": (
        {"$schema": DRAFT4, "type": "number", "maximum": 5, "exclusiveMaximum": True},
        [4, 4.5, 5, 5.0, 6, -1],
    ),
    "draft-04 exclusive minimum off": (
        {"$schema": DRAFT4, "type": "integer", "minimum": 2, "exclusiveMinimum": False},
        [1, 2, 3],
    ),
    "draft-04 both bounds": (
        {
            "$schema": DRAFT4,
            "type": "integer",
            "minimum": 0,
            "exclusiveMinimum": True,
            "maximum": 3,
            "exclusiveMaximum": True,
        },
        [0, 1, 2, 3],
    ),
    "draft-07 siblings of $ref": (
        {
            "$schema": DRAFT7,
            **STRING_DEF,
            "type": "object",
            "properties": {"x": {"$ref": "#/definitions/s", "maxLength": 1, "enum": ["a"]}},
        },
        [{"x": "a"}, {"x": "long"}, {"x": 1}, {}],
    ),
    "2020-12 siblings of $ref": (
        {
            "$schema": LATEST,
            **STRING_DEF,
            "type": "object",
            "properties": {"x": {"$ref": "#/definitions/s", "maxLength": 1}},
        },
        [{"x": "a"}, {"x": "long"}, {"x": 1}],
    ),
}


def _judge(schema):
    return validators.validator_for(schema, default=Draft202012Validator)(schema)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_instance_gets_its_dialects_verdict(name, llama3_tokenizer):
    schema, instances = CASES[name]
    compiled = compile_constraint(ConstraintSpec.json_schema(schema), llama3_tokenizer)
    bitmask = torch.zeros((1, llama3_tokenizer.mask_words), dtype=torch.int32)
    judge = _judge(schema)
    for x in instances:
        text = json.dumps(x, separators=(",", ":"))
        got = accepts(compiled.matcher(), llama3_tokenizer.encode(text), bitmask)
        assert got == judge.is_valid(x), (name, text)


def test_the_dialects_differ_on_these_instances():
    """The cases above test something: read as 2020-12, the old drafts' verdicts differ."""
    for name, x in [
        ("draft-04 exclusive maximum", 4),
        ("draft-07 siblings of $ref", {"x": "long"}),
    ]:
        schema = CASES[name][0]
        assert _judge(schema).is_valid(x) != Draft202012Validator(schema).is_valid(x)


@pytest.mark.parametrize("name", ["draft-04 exclusive maximum", "draft-07 siblings of $ref"])
def test_walks_are_valid_in_the_dialect(name, llama3_tokenizer):
    schema = CASES[name][0]
    compiled = compile_constraint(ConstraintSpec.json_schema(schema), llama3_tokenizer)
    assert_walks_valid_without_repeats(compiled.matcher, schema, llama3_tokenizer, 30, 40)


def test_the_receipt_names_what_the_dialect_changed(llama3_tokenizer):
    bounds = CASES["draft-04 exclusive maximum"][0]
    refs = CASES["draft-07 siblings of $ref"][0]
    got = {
        r
        for schema in (bounds, refs)
        for r in compile_constraint(ConstraintSpec.json_schema(schema), llama3_tokenizer).rewrites
    }
    assert ("/exclusiveMaximum", "exclusiveMaximum", log.BOOLEAN_BOUND) in got
    assert ("/properties/x/$ref", "$ref", log.REF_ALONE) in got


def test_an_unknown_or_missing_schema_uri_reads_as_2020_12():
    for root in ({}, {"$schema": "https://example.com/mine"}, {"$schema": 7}, True):
        assert dialect_of(root) == dialect_of({"$schema": LATEST})
    assert dialect_of({"$schema": DRAFT7}).ref_alone
    assert dialect_of({"$schema": DRAFT4}).boolean_bounds
