"""No repeated object key (``grammar.distinct_keys``) and what it makes exact: ``minProperties``
over free-form keys, and optional properties in any order (``grammar.schema_order``).

Real tokenizer, real compiles; random walks are judged by ``jsonschema`` and read back with a
hook that fails on a repeated key, so a walk that reaches a dead end or repeats a key fails.
"""

from __future__ import annotations

import pytest
from grammar_walkers import assert_walks_valid_without_repeats

from corral.grammar import ConstraintError, ConstraintSpec, JsonFormat, compile_constraint
from corral.grammar.checks.distinct_keys import DistinctKeysMatcher, Scan, dead_end_risk, scan
from corral.grammar.core.compiled import CompiledConstraint
from corral.grammar.core.walk import accepts

MIN_PROPS = {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2}


def _compile(schema, **kw):
    return compile_constraint(ConstraintSpec.json_schema(schema, **kw), _compile.tok)


@pytest.fixture(autouse=True)
def _tok(llama3_tokenizer):
    _compile.tok = llama3_tokenizer


def _accepts(c: CompiledConstraint, text: str, tok) -> bool:
    import torch

    bitmask = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    return accepts(c.matcher(), tok.encode(text), bitmask)


def test_scan_finds_a_repeated_key_however_it_is_spelled():
    state = scan(Scan(), b'{"a":1,"b":[{"a":2}],')
    assert state is not None and state.stack == (frozenset({"a", "b"}),)
    assert scan(state, b'"a"') is None
    assert scan(state, b'"\\u0061"') is None  # the same key, escaped
    assert scan(state, b'"ab"') is not None
    assert scan(Scan(), b'{"x":"\\"a\\"","a":1}') is not None  # quotes inside a string value


def test_min_properties_over_free_keys_is_enforced_without_repeats(llama3_tokenizer):
    tok = llama3_tokenizer
    c = _compile(MIN_PROPS)
    assert c.distinct_keys and isinstance(c.matcher(), DistinctKeysMatcher)
    assert _accepts(c, '{"a":1,"b":2}', tok)
    assert not _accepts(c, '{"a":1}', tok)
    assert not _accepts(c, '{"a":1,"a":2}', tok)
    assert not _accepts(c, '{"a":1,"\\u0061":2}', tok)
    assert not _accepts(c, '{"x":{},"a":1,"a":2}', tok)
    again = CompiledConstraint.from_bytes(c.to_bytes(), tok)  # the cache keeps the check
    assert again.distinct_keys and not _accepts(again, '{"a":1,"a":2}', tok)


def test_optional_properties_come_in_any_order(llama3_tokenizer):
    tok = llama3_tokenizer
    schema = {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "a": {"type": "string"},
            "b": {"type": "integer"},
        },
        "required": ["id"],
    }
    c = _compile(schema)
    assert c.distinct_keys
    assert _accepts(c, '{"id":1,"a":"x","b":2}', tok)
    assert _accepts(c, '{"id":1,"b":2,"a":"x"}', tok)
    assert _accepts(c, '{"id":1,"zz":null,"a":"x"}', tok)
    assert not _accepts(c, '{"id":1,"b":2,"b":3}', tok)
    assert not _accepts(c, '{"id":1,"b":"x"}', tok)


@pytest.mark.parametrize(
    "schema",
    [
        {**MIN_PROPS, "additionalProperties": {"type": "string", "maxLength": 2}},
        {
            "type": "object",
            "patternProperties": {"^x-": {"type": "integer"}},
            "additionalProperties": False,
            "minProperties": 3,
        },
        # anchored, but every key begun can still grow (``regex_algebra.never_runs_out``)
        {
            "type": "object",
            "patternProperties": {"^[a-b_]+$": {"type": "integer"}, "^x\\d+$": {}},
            "additionalProperties": False,
            "minProperties": 4,
        },
        {
            "type": "object",
            "properties": {"n": {"type": "integer"}},
            "required": ["n"],
            "additionalProperties": {"type": "object", "minProperties": 1},
            "minProperties": 3,
        },
        {
            "type": "object",
            "properties": {"a": {"type": "boolean"}, "b": {"type": "null"}, "c": {"enum": [1]}},
            "additionalProperties": {"type": "boolean"},
            "maxProperties": 4,
        },
    ],
)
def test_walks_are_valid_and_never_repeat_a_key(schema, llama3_tokenizer):
    c = _compile(schema)
    assert c.distinct_keys
    assert_walks_valid_without_repeats(c.matcher, schema, llama3_tokenizer, 12, 400)


@pytest.mark.parametrize("pattern", ["^[a-d]$", "^(?:OUT1|OUT2|IO1)$", "^[a-z]{1,3}$"])
def test_a_key_set_that_may_run_out_is_still_refused(pattern):
    schema = {
        "type": "object",
        "patternProperties": {pattern: {}},
        "additionalProperties": False,
        "minProperties": 2,
    }
    assert dead_end_risk(schema) is not None
    with pytest.raises(ConstraintError) as e:
        _compile(schema)
    assert e.value.keyword == "minProperties"
    lenient = _compile(schema, strict=False)
    assert not lenient.distinct_keys
    assert [u.keyword for u in lenient.unenforced] == ["minProperties"]


def test_no_key_check_after_a_reasoning_block():
    spec = ConstraintSpec.json_schema(MIN_PROPS).after_reasoning("<think>", "</think>")
    with pytest.raises(ConstraintError) as e:
        compile_constraint(spec, _compile.tok)
    assert e.value.keyword == "minProperties"
    order_only = {"type": "object", "properties": {"a": {}, "b": {}}}
    spec = ConstraintSpec.json_schema(order_only).after_reasoning("<think>", "</think>")
    assert not compile_constraint(spec, _compile.tok).distinct_keys


def test_layouts_with_whitespace_keep_the_check(llama3_tokenizer):
    tok = llama3_tokenizer
    c = _compile(MIN_PROPS, json_format=JsonFormat(flexible=True, max_whitespace=2))
    assert _accepts(c, '{ "a": 1,  "b" :2}', tok)
    assert not _accepts(c, '{ "a": 1, "a": 2 }', tok)
