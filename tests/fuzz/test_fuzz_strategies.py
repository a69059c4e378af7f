"""The schema strategy draws valid Draft 2020-12 schemas covering the keyword families."""

from __future__ import annotations

import collections

from jsonschema import Draft202012Validator

from corral.fuzz.judge import schema_keywords
from corral.fuzz.strategies import draw_examples, schemas

WANTED = {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "prefixItems",
    "uniqueItems",
    "enum",
    "const",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "anyOf",
    "oneOf",
    "allOf",
    "not",
    "$defs",
    "$ref",
    "dependentRequired",
}


def test_drawn_schemas_are_valid_and_cover_the_keywords():
    drawn = draw_examples(schemas(), 100, 12345)
    assert len(drawn) == 100
    seen = collections.Counter()
    for s in drawn:
        Draft202012Validator.check_schema(s)  # raises on an invalid schema
        seen.update(schema_keywords(s))
    missing = WANTED - set(seen)
    assert not missing, f"keywords never drawn: {missing}"


def test_recursive_refs_are_drawn():
    drawn = draw_examples(schemas(), 60, 7)
    recursive = [
        s
        for s in drawn
        if isinstance(s, dict) and s.get("$ref") == "#/$defs/node" and "node" in s.get("$defs", {})
    ]
    assert recursive
    # A recursive schema validates nested instances through the reference.
    s = recursive[0]
    node = s["$defs"]["node"]
    assert "#/$defs/node" in str(node)


def test_drawing_is_deterministic_per_seed():
    assert draw_examples(schemas(), 20, 99) == draw_examples(schemas(), 20, 99)
    assert draw_examples(schemas(), 20, 99) != draw_examples(schemas(), 20, 100)
