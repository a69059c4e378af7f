"""Optional properties in any order next to merged nodes (``grammar.schema_merges``): only what
the backend merges keeps its layout, the rest of the schema is freed; random walks of compiled
grammars are judged by ``jsonschema`` and never repeat a key.
"""

from __future__ import annotations

import json

import pytest
from grammar_walkers import assert_walks_valid_without_repeats, merged_properties

from corral.grammar import ConstraintSpec, compile_constraint
from corral.grammar.core.walk import accepts
from corral.grammar.schema.order import backend_layout

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


@pytest.mark.parametrize("where", ["anyOf", "allOf", "$ref"])
@pytest.mark.parametrize("holder_first", [True, False])
def test_merged_properties_keep_the_order_the_schema_writes(where, holder_first, llama3_tokenizer):
    """Properties merged from anyOf/allOf/$ref come after the node's own when the schema writes
    `properties` first, before them otherwise (llguidance's order): sorting keywords into the
    canonical text must not swap them (MaskBench Github_easy---o58839)."""
    from jsonschema import Draft202012Validator

    schema = merged_properties(where, holder_first)
    own_first = {"ast": "B", "type": "R", "data": 1}
    merged_first = {"type": "R", "data": 1, "ast": "B"}
    written = own_first if holder_first else merged_first
    assert Draft202012Validator(schema).is_valid(written)
    c = _compile(schema, llama3_tokenizer)
    assert _accepts(c, json.dumps(written, separators=(",", ":")), llama3_tokenizer)
    assert not _accepts(c, '{"ast":"B","type":"R","data":"x"}', llama3_tokenizer)
    assert not _accepts(c, '{"type":"R","data":"x","ast":"B"}', llama3_tokenizer)


@pytest.mark.parametrize("applicator", ["allOf", "anyOf", "oneOf"])
def test_pattern_keys_written_after_an_applicator_still_apply(applicator, llama3_tokenizer):
    """llguidance merges an applicator with the keywords read before it; `patternProperties`
    written after it was lost to the merge, so a satisfiable schema was refused as
    "unsatisfiable" (MaskBench Handwritten---dep7). The backend now reads pattern keys first."""
    from jsonschema import Draft202012Validator

    from corral.grammar.schema.backend_merges import pattern_keys_first

    schema = {
        "type": "object",
        "additionalProperties": False,
        applicator: [{"required": ["a"]}],
        "patternProperties": {"^[a-c]$": {"type": "integer"}},
        "maxProperties": 2,
    }
    assert list(pattern_keys_first(schema))[:3] == [
        "type",
        "additionalProperties",
        "patternProperties",
    ]
    c = _compile(schema, llama3_tokenizer)
    judge = Draft202012Validator(schema)
    for text in ('{"a":1}', '{"a":1,"c":2}', '{"a":2,"b":1}'):  # required keys come first
        assert judge.is_valid(json.loads(text)) and _accepts(c, text, llama3_tokenizer), text
    for text in ('{"b":1}', '{"a":"x"}', '{"a":1,"d":2}', '{"a":1,"b":2,"c":3}', "{}"):
        assert not judge.is_valid(json.loads(text)), text
        assert not _accepts(c, text, llama3_tokenizer), text
    assert_walks_valid_without_repeats(c.matcher, schema, llama3_tokenizer, 12, 60)


def test_pattern_keys_first_moves_nothing_else():
    """Only pattern and additional keys move: `properties` against an `allOf` is the order the
    backend lays keys out in (test above), and shared subtrees are copied once."""
    from corral.grammar.schema.backend_merges import pattern_keys_first

    shared = {"anyOf": [{"type": "string"}], "patternProperties": {"x": {}}}
    schema = {
        "allOf": [{"properties": {"p": {}}}],
        "properties": {"q": shared, "r": shared},
        "additionalProperties": shared,
        "enum": [{"allOf": 1, "patternProperties": 2}],
    }
    out = pattern_keys_first(schema)
    assert list(out) == ["additionalProperties", "allOf", "properties", "enum"]
    assert list(out["properties"]["q"]) == ["patternProperties", "anyOf"]
    assert out["properties"]["q"] is out["properties"]["r"] is out["additionalProperties"]
    assert list(out["enum"][0]) == ["allOf", "patternProperties"]  # a value, not a schema
    assert list(schema) == ["allOf", "properties", "additionalProperties", "enum"]  # a copy
