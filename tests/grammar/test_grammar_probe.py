"""The compile-time probe: no compiled constraint fails at its first masks (issue 11's reproducers).

Each reproducer used to compile and then put llguidance's matcher into its error state at the
first tokens (a 200 with empty content). Now each either compiles, and a valid instance walks
through a real matcher token by token - canonically tokenized, and again one byte per token
wherever the mask allows that (llguidance insists on canonical tokens for forced text), so every
row boundary is visited - to an accepting end (judged by jsonschema where it is JSON), or is
refused with a ConstraintError naming the llguidance limit.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from corral.grammar import ConstraintError, ConstraintSpec, TokenizerInfo, compile_constraint
from corral.grammar.core.walk import token_allowed


def optional_object(n: int, sub: dict | None = None) -> dict:
    return {"type": "object", "properties": {f"p{i}": sub or {"type": "string"} for i in range(n)}}


def tool_like(n: int) -> dict:
    """A function call with n optional parameters, as tools with tool_choice "required" ask."""
    params = {f"a{i}": {"type": "integer" if i % 2 else "string"} for i in range(n)}
    return {
        "type": "object",
        "properties": {
            "name": {"const": "lookup"},
            "parameters": {"type": "object", "properties": params, "additionalProperties": False},
        },
        "required": ["name", "parameters"],
        "additionalProperties": False,
    }


def one_property_branches(n: int) -> dict:
    return {
        "anyOf": [
            {
                "type": "object",
                "properties": {f"k{i}": {"type": "integer"}},
                "required": [f"k{i}"],
                "additionalProperties": False,
            }
            for i in range(n)
        ]
    }


def alternatives(n: int, syntax: str) -> ConstraintSpec:
    words = [f'"w{i}"' for i in range(n)]
    if syntax == "lark":
        return ConstraintSpec.lark("start: " + " | ".join(words))
    return ConstraintSpec.ebnf("root ::= " + " | ".join(words))


# name -> (spec, a valid output) for those that must compile and serve
SERVED = {
    "object with 501 optional properties": (
        ConstraintSpec.json_schema(optional_object(501)),
        '{"p0":"a","p250":"b","p500":"c"}',
    ),
    "object with 1,000 optional properties": (
        ConstraintSpec.json_schema(optional_object(1000)),
        '{"p7":"x","p999":"y"}',
    ),
    "800 optional maxLength strings": (
        ConstraintSpec.json_schema(optional_object(800, {"type": "string", "maxLength": 10})),
        '{"p1":"abc","p799":""}',
    ),
    "anyOf of 2,500 one-property objects": (
        ConstraintSpec.json_schema(one_property_branches(2500)),
        '{"k1234":5}',
    ),
    "Lark grammar with 3,000 alternatives": (alternatives(3000, "lark"), "w2999"),
    "tool with 600 optional parameters": (
        ConstraintSpec.json_schema(tool_like(600)),
        '{"name":"lookup","parameters":{"a0":"q","a599":3}}',
    ),
}

# name -> (spec, the limit its refusal names)
REFUSED = {
    "object with 1,100 optional properties": (
        ConstraintSpec.json_schema(optional_object(1100)),
        "max_items_in_row",
    ),
    "minItems 100000 of const 1": (
        ConstraintSpec.json_schema({"type": "array", "items": {"const": 1}, "minItems": 100000}),
        "step_max_items",
    ),
    "regex a{1000000}": (ConstraintSpec.regex("a{1000000}"), "lexer_fuel"),
    "regex (a{1000}){1000}": (ConstraintSpec.regex("(a{1000}){1000}"), "lexer_fuel"),
    'pattern "^a{1000000}$"': (
        ConstraintSpec.json_schema({"type": "string", "pattern": "^a{1000000}$"}),
        "lexer_fuel",
    ),
    "Lark grammar with 5,000 alternatives": (alternatives(5000, "lark"), "max_items_in_row"),
    "EBNF with 20,000 alternatives": (alternatives(20000, "ebnf"), "max_items_in_row"),
}


def walk(tok: TokenizerInfo, compiled, token_ids: list[int]) -> None:
    """Every token allowed by its mask and accepted, no error on the way, EOS accepted at the end."""
    m = compiled.matcher()
    bitmask = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    for i, t in enumerate(token_ids):
        m.fill_mask(bitmask, 0)
        assert m.error() is None, f"error state before token {i}: {m.error()}"
        assert token_allowed(bitmask, 0, t), f"token {i} ({t}) is not allowed by its mask"
        assert m.accept(t), f"token {i} refused: {m.error()}"
    finish(tok, m, bitmask)


def walk_bytewise(tok: TokenizerInfo, compiled, text: str) -> int:
    """Walk ``text`` one byte per token where the mask allows a one-byte token, else with the
    next canonical token; returns how many one-byte steps were taken."""
    m = compiled.matcher()
    bitmask = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    rest, single = text.encode(), 0
    while rest:
        m.fill_mask(bitmask, 0)
        assert m.error() is None, f"error state with {rest!r} to go: {m.error()}"
        [one] = tok.llguidance.tokenize_bytes(rest[:1])
        t = one if token_allowed(bitmask, 0, one) else tok.llguidance.tokenize_bytes(rest)[0]
        single += t == one
        assert token_allowed(bitmask, 0, t) and m.accept(t), f"refused with {rest!r} to go"
        rest = rest[len(tok.llguidance.decode_bytes([t])) :]
    finish(tok, m, bitmask)
    return single


def finish(tok: TokenizerInfo, m, bitmask: torch.Tensor) -> None:
    m.fill_mask(bitmask, 0)
    assert m.error() is None and m.can_terminate()
    eos = tok.eos_token_ids[0]
    assert token_allowed(bitmask, 0, eos) and m.accept(eos)


@pytest.mark.parametrize("name", sorted(SERVED))
def test_reproducer_compiles_and_a_valid_output_walks_to_the_end(llama3_tokenizer, name):
    spec, text = SERVED[name]
    compiled = compile_constraint(spec, llama3_tokenizer)
    if spec.kind == "json_schema":
        jsonschema.validate(json.loads(text), spec.schema())
    walk(llama3_tokenizer, compiled, llama3_tokenizer.encode(text))
    assert walk_bytewise(llama3_tokenizer, compiled, text) > 0


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_reproducer_is_refused_naming_the_llguidance_limit(llama3_tokenizer, name):
    spec, limit = REFUSED[name]
    with pytest.raises(ConstraintError) as err:
        compile_constraint(spec, llama3_tokenizer)
    assert err.value.limit == limit
    assert "llguidance" in err.value.reason and "<state>" not in err.value.reason


def test_the_raised_row_limit_is_kept_with_the_compiled_constraint(llama3_tokenizer):
    small = compile_constraint(ConstraintSpec.json_schema(optional_object(3)), llama3_tokenizer)
    large = compile_constraint(ConstraintSpec.json_schema(optional_object(501)), llama3_tokenizer)
    assert dict(small.limits) == {}
    assert dict(large.limits) == {"max_items_in_row": 4100}
    # A copy loaded from bytes is built with the same limits, so it serves the same outputs.
    from corral.grammar import CompiledConstraint

    loaded = CompiledConstraint.from_bytes(large.to_bytes(), llama3_tokenizer)
    assert dict(loaded.limits) == {"max_items_in_row": 4100}
    walk(llama3_tokenizer, loaded, llama3_tokenizer.encode('{"p3":"x"}'))


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#"},
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
        {
            "type": "object",
            "properties": {"x": {"$ref": "#/$defs/a"}},
            "required": ["x"],
            "$defs": {"a": {"$ref": "#/$defs/a"}},
        },
    ],
)
def test_a_ref_cycle_with_no_instance_is_refused(llama3_tokenizer, schema):
    with pytest.raises(ConstraintError) as err:
        compile_constraint(ConstraintSpec.json_schema(schema), llama3_tokenizer)
    assert err.value.limit is None and "no output can satisfy" in err.value.reason
