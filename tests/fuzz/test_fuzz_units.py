"""The judge, the mutator, the shrinker and the corpus loader, without any engine."""

from __future__ import annotations

import json
import random

import pytest
from jsonschema import Draft202012Validator

from corral.fuzz.corpus import load_file
from corral.fuzz.judge import Judge, Unjudgeable, parse_output, schema_keywords
from corral.fuzz.keyorder import schema_order
from corral.fuzz.mutate import mutations
from corral.fuzz.shrink import shrink

ORDER = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "maxLength": 8},
        "qty": {"type": "integer", "minimum": 1, "maximum": 10},
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
    },
    "required": ["id", "qty"],
    "additionalProperties": False,
}


def test_judge_uses_ascii_digit_classes_like_ecma():
    j = Judge({"type": "string", "pattern": "^\\d+$"})
    assert j.is_valid("123")
    assert not j.is_valid("\u0663")  # ARABIC-INDIC DIGIT THREE: Python's \d matches it, ECMA's not


def test_judge_checks_formats_and_never_fetches_remote_refs():
    assert not Judge({"format": "date"}).is_valid("2024-02-31")
    with pytest.raises(Unjudgeable):
        Judge({"$ref": "http://localhost:1234/tree.json"}).is_valid(1)
    with pytest.raises(Unjudgeable):
        Judge({"type": "frobnicate"})


def test_parse_output_flags_what_a_consumer_cannot_rely_on():
    assert parse_output(b'{"a": 1}') == ({"a": 1}, "")
    assert "duplicate" in parse_output(b'{"a": 1, "a": 2}')[1]
    assert "not JSON" in parse_output(b"NaN")[1]
    assert "UTF-8" in parse_output(b'"\xed\xa0"')[1]


def test_keywords_skip_property_names_and_annotations():
    s = {"title": "t", "properties": {"maximum": {"type": "integer", "description": "d"}}}
    assert schema_keywords(s) == {"properties", "type"}


def test_mutations_are_all_invalid_and_local():
    valid = {"id": "a1", "qty": 3, "tags": ["x", "y"]}
    plain = Draft202012Validator(ORDER)
    assert plain.is_valid(valid)
    muts = mutations(Judge(ORDER), valid, random.Random(0), 30)
    assert len(muts) >= 10
    for m in muts:
        assert not plain.is_valid(m)
    # The edits reach the keywords that matter: a bound, a type, a missing key, a duplicate.
    reasons = {e.validator for m in muts for e in plain.iter_errors(m)}
    assert {"maximum", "type", "required", "additionalProperties"} & reasons


def test_shrink_reaches_the_one_keyword_that_matters():
    # Failure under test: "the instance breaks `maximum` somewhere". The shrinker must end with
    # only that keyword and a one-number instance.
    def still_fails(schema, text):
        inst = json.loads(text)
        j = Judge(schema)
        without = json.loads(json.dumps(schema).replace('"maximum"', '"x-max"'))
        return not j.is_valid(inst) and Judge(without).is_valid(inst)

    schema, text, evals = shrink(ORDER, json.dumps({"id": "a", "qty": 12345}), still_fails)
    assert schema == {"maximum": 10}
    assert 10 < json.loads(text) < 100
    assert evals < 400


def test_corpus_formats_are_recognised(tmp_path, corpus):
    (tmp_path / "plain.json").write_text(json.dumps(ORDER))
    (tmp_path / "mb.json").write_text(
        json.dumps({"schema": ORDER, "tests": [{"data": {"id": "a", "qty": 1}, "valid": True}]})
    )
    assert load_file(tmp_path / "plain.json")[0].tests == []
    assert load_file(tmp_path / "mb.json")[0].tests == [({"id": "a", "qty": 1}, True)]
    suite = load_file(corpus("json-schema-test-suite") / "draft2020-12" / "maximum.json")
    assert len(suite) >= 2 and all(c.tests for c in suite)
    assert suite[0].id.endswith("maximum#0")


def test_schema_order_moves_listed_keys_first_through_refs_and_arrays():
    schema = {
        "$defs": {"item": {"properties": {"b": {}, "a": {}}}},
        "properties": {"z": {}, "list": {"items": {"$ref": "#/$defs/item"}}},
    }
    value = {"extra": 1, "list": [{"a": 1, "x": 2, "b": 3}], "z": 0}
    ordered = schema_order(schema, value)
    assert ordered == value  # same object, only the key order differs
    assert list(ordered) == ["z", "list", "extra"]
    assert list(ordered["list"][0]) == ["b", "a", "x"]
    assert schema_order({"type": "integer"}, 5) == 5
