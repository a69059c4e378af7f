"""ConstraintSpec: a digest that is stable across processes and changes exactly when the
constraint does, and constructors that turn every client mistake into a ConstraintError."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.grammar import ConstraintError, ConstraintKind, ConstraintSpec, JsonFormat

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
    "required": ["name"],
    "additionalProperties": False,
}

# Each entry is evaluated both here and in a fresh interpreter (with another hash seed).
SPEC_EXPRESSIONS = [
    f"ConstraintSpec.json_schema({SCHEMA!r})",
    f"ConstraintSpec.json_schema({SCHEMA!r}, strict=False)",
    f"ConstraintSpec.json_schema({SCHEMA!r}, json_format=JsonFormat.python_default())",
    "ConstraintSpec.json_schema({'enum': ['é', 'ü', 1.5, None]})",
    "ConstraintSpec.json_object()",
    "ConstraintSpec.regex(r'[a-z]+\\d{2}')",
    'ConstraintSpec.ebnf(\'root ::= "a" | "b"\')',
    'ConstraintSpec.lark(\'start: "a" | "b"\')',
    "ConstraintSpec.choice(['yes', 'no', 'ß'])",
]


def _digests_here() -> list[str]:
    scope = {"ConstraintSpec": ConstraintSpec, "JsonFormat": JsonFormat}
    return [eval(expr, scope).digest for expr in SPEC_EXPRESSIONS]


def test_digest_is_stable_across_processes():
    code = (
        "import json, sys\n"
        "from corral.grammar import ConstraintSpec, JsonFormat\n"
        "exprs = json.loads(sys.argv[1])\n"
        "print(json.dumps([eval(e).digest for e in exprs]))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(SPEC_EXPRESSIONS)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    assert json.loads(out.stdout) == _digests_here()


def test_digest_is_hex_sha256_and_distinct_per_spec():
    digests = _digests_here()
    assert all(len(d) == 64 and int(d, 16) >= 0 for d in digests)
    assert len(set(digests)) == len(digests), "two different constraints share a digest"


def test_digest_changes_with_every_option():
    base = ConstraintSpec.json_schema(SCHEMA)
    variants = [
        ConstraintSpec.json_schema(SCHEMA, strict=False),
        ConstraintSpec.json_schema(SCHEMA, json_format=JsonFormat(item_separator=", ")),
        ConstraintSpec.json_schema(SCHEMA, json_format=JsonFormat(key_separator=": ")),
        ConstraintSpec.json_schema(SCHEMA, json_format=JsonFormat(flexible=True)),
        ConstraintSpec.json_schema(SCHEMA, json_format=JsonFormat(flexible=True, max_whitespace=5)),
        ConstraintSpec.json_schema({**SCHEMA, "required": ["name", "n"]}),
        ConstraintSpec.json_schema({**SCHEMA, "additionalProperties": True}),
    ]
    digests = {base.digest, *(v.digest for v in variants)}
    assert len(digests) == 1 + len(variants)


def test_same_text_of_another_kind_has_another_digest():
    text = 'start: "a"'
    assert ConstraintSpec.lark(text).digest != ConstraintSpec.regex(text).digest
    assert ConstraintSpec.json_object().digest != ConstraintSpec.json_schema({}).digest


def test_equal_specs_are_equal_and_hash_alike():
    a = ConstraintSpec.json_schema(SCHEMA)
    b = ConstraintSpec.json_schema(json.dumps(SCHEMA))  # the same schema given as JSON text
    assert a == b and hash(a) == hash(b) and a.digest == b.digest
    assert a.kind is ConstraintKind.JSON_SCHEMA and a.schema() == SCHEMA


# Where a schema nests subschemas: (keyword, how its value holds them).
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "dependentSchemas")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_ONE = ("items", "additionalProperties", "not", "contains", "propertyNames")
_MERGING = ("properties", "allOf", "anyOf", "$ref")


def _shuffle_keywords(schema, rnd):
    """The same schema with the keywords of every (sub)schema object in another order.

    Only keyword order moves: the order of ``properties`` (which the backends generate in
    declared order), the relative order of the keywords properties are merged from
    (``properties``, ``allOf``, ``anyOf``, ``$ref``) and the values of ``const``/``enum`` are left
    as they are.
    """
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k in _SUBSCHEMA_MAPS and isinstance(v, dict):
            v = {name: _shuffle_keywords(sub, rnd) for name, sub in v.items()}
        elif k in _SUBSCHEMA_LISTS and isinstance(v, list):
            v = [_shuffle_keywords(sub, rnd) for sub in v]
        elif k in _SUBSCHEMA_ONE:
            v = _shuffle_keywords(v, rnd)
        out[k] = v
    keys = list(out)
    rnd.shuffle(keys)
    layout = iter([k for k in out if k in _MERGING])
    return {k: out[k] for k in (next(layout) if k in _MERGING else k for k in keys)}


KEYWORD_ORDER_SCHEMAS = [
    {"type": "integer", "minimum": 1, "maximum": 9},
    SCHEMA,
    {
        "$defs": {"pos": {"type": "number", "exclusiveMinimum": 0, "description": "positive"}},
        "type": "array",
        "items": {"anyOf": [{"$ref": "#/$defs/pos"}, {"type": "null", "title": "none"}]},
        "minItems": 1,
        "maxItems": 3,
    },
    {"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "not": {"const": "ab"}},
    {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "anyOf": [{"properties": {"b": {}}}, {"required": ["a"]}],
        "required": ["a"],
        "minProperties": 1,
    },
]


@settings(max_examples=40, deadline=None, database=None)
@given(which=st.sampled_from(range(len(KEYWORD_ORDER_SCHEMAS))), rnd=st.randoms())
def test_keyword_order_does_not_change_the_digest(which, rnd):
    """The digest is canonical: two schemas that differ only in keyword order are one cache
    entry (`{"type": "integer", "minimum": 1}` and `{"minimum": 1, "type": "integer"}`)."""
    schema = KEYWORD_ORDER_SCHEMAS[which]
    shuffled = _shuffle_keywords(schema, rnd)
    assert ConstraintSpec.json_schema(shuffled).digest == ConstraintSpec.json_schema(schema).digest


def test_property_order_changes_the_digest():
    """Properties are generated in declared order, so their order is part of the constraint."""
    a = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}}
    b = {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "integer"}}}
    assert ConstraintSpec.json_schema(a).digest != ConstraintSpec.json_schema(b).digest


def test_order_of_the_keywords_properties_merge_from_changes_the_digest():
    """`properties` beside `anyOf`/`allOf`/`$ref`: the backend lays out the merged properties in
    the order the keywords come, so that order is kept; other keywords still sort."""
    own = {"properties": {"a": {"type": "integer"}}}
    for merged in (
        {"anyOf": [{"properties": {"b": {}}}]},
        {"allOf": [{"properties": {"b": {}}}]},
        {"$ref": "#/$defs/b", "$defs": {"b": {"properties": {"b": {}}}}},
    ):
        own_first = ConstraintSpec.json_schema({"type": "object", **own, **merged})
        merged_first = ConstraintSpec.json_schema({**merged, **own, "type": "object"})
        moved = ConstraintSpec.json_schema({**own, "type": "object", **merged})
        assert own_first.digest != merged_first.digest, merged
        assert own_first.digest == moved.digest, merged


def test_list_order_does_change_the_digest():
    a = ConstraintSpec.json_schema({"enum": [1, 2]})
    assert a.digest != ConstraintSpec.json_schema({"enum": [2, 1]}).digest
    assert ConstraintSpec.choice(["a", "b"]).digest != ConstraintSpec.choice(["b", "a"]).digest


MISTAKES = {
    "schema-text-not-json": lambda: ConstraintSpec.json_schema("{not json"),
    "schema-text-array": lambda: ConstraintSpec.json_schema("[1, 2]"),
    "schema-int": lambda: ConstraintSpec.json_schema(5),
    "schema-list": lambda: ConstraintSpec.json_schema(["type", "object"]),
    "schema-with-set": lambda: ConstraintSpec.json_schema({"enum": [{1, 2}]}),
    "schema-with-nan": lambda: ConstraintSpec.json_schema({"maximum": float("nan")}),
    "schema-text-with-nan": lambda: ConstraintSpec.json_schema('{"minimum": NaN}'),
    "regex-empty": lambda: ConstraintSpec.regex(""),
    "regex-int": lambda: ConstraintSpec.regex(5),
    "ebnf-empty": lambda: ConstraintSpec.ebnf(""),
    "lark-none": lambda: ConstraintSpec.lark(None),
    "choice-empty": lambda: ConstraintSpec.choice([]),
    "choice-int": lambda: ConstraintSpec.choice(["a", 1]),
    "choice-str": lambda: ConstraintSpec.choice("abc"),  # a string is not a list of choices
    "item-separator": lambda: JsonFormat(item_separator=";"),
    "key-separator": lambda: JsonFormat(key_separator="="),
    "whitespace-negative": lambda: JsonFormat(max_whitespace=-1),
    "whitespace-too-many": lambda: JsonFormat(max_whitespace=65),
}


@pytest.mark.parametrize("build", MISTAKES.values(), ids=MISTAKES.keys())
def test_constructor_mistakes_are_constraint_errors(build):
    with pytest.raises(ConstraintError) as info:
        build()
    assert info.value.reason, "a ConstraintError must say what is wrong"


def test_flexible_separators_with_spaces_are_accepted():
    fmt = JsonFormat(item_separator=" , ", key_separator=" : ", flexible=True, max_whitespace=0)
    assert ConstraintSpec.json_object(json_format=fmt).json_format == fmt
