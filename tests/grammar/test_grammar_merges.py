"""Optional properties in any order next to merged nodes (``grammar.schema_merges``): only what
the backend merges keeps its layout, the rest of the schema is freed; random walks of compiled
grammars are judged by ``jsonschema`` and never repeat a key.
"""

from __future__ import annotations

import pytest
from grammar_walkers import assert_walks_valid_without_repeats

from corral.grammar import ConstraintSpec, compile_constraint
from corral.grammar.schema_order import backend_layout
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
