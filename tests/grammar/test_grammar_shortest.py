"""`grammar.shortest` on real schemas: every prefix of every valid MaskBench instance, completed
with the closing text it proposes, is an instance of the schema (jsonschema judges), and the
shortest instance of each schema is one too. A prefix it cannot complete answers None (the
engine then does not take the token that led there); that share is bounded here."""

from __future__ import annotations

import json

import pytest
from jsonschema import Draft202012Validator

from corral.grammar import ConstraintError, ConstraintSpec
from corral.grammar.shortest import JsonCloser

NUM_SCHEMAS = 60


def cases(corpus):
    files = sorted(corpus("maskbench").glob("*.json"))
    for path in files[:: max(1, len(files) // NUM_SCHEMAS)]:
        data = json.loads(path.read_text())
        valid = [t["data"] for t in data.get("tests", []) if t.get("valid")]
        if valid:
            yield path.name, data["schema"], valid[0]


def test_closings_of_real_prefixes_are_valid(corpus):
    checked = unknown = 0
    for name, schema, instance in cases(corpus):
        try:
            closer = JsonCloser.for_spec(ConstraintSpec.json_schema(schema))
        except ConstraintError:
            continue
        judge = Draft202012Validator(schema)
        shortest = closer.shortest(closer.root)
        if shortest is not None:
            assert judge.is_valid(json.loads(shortest)), (name, shortest)
        text = json.dumps(instance, ensure_ascii=False)
        partial = closer.start()
        for i, ch in enumerate(text):
            partial.feed(ch)
            found = partial.closing()
            checked += 1
            if found is None:
                unknown += 1
                continue
            done = text[: i + 1] + found[0]
            assert judge.is_valid(json.loads(done)), (name, done)
    assert checked > 5000
    assert unknown / checked < 0.1, (unknown, checked)


@pytest.mark.parametrize(
    ("schema", "prefix", "closing"),
    [
        ({"type": "array", "items": {"type": "integer"}, "minItems": 2}, "[1", ",0]"),
        ({"enum": ["alpha", "beta"]}, '"al', 'pha"'),
        ({"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}, '"AB', '-000"'),
        ({"type": "integer", "minimum": 10}, "1", "0"),
        (
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
            '{"',
            'a":""}',
        ),
        ({"type": "object"}, '{"x":[tr', "ue]}"),
    ],
)
def test_closing_text(schema, prefix, closing):
    partial = JsonCloser(schema).start()
    partial.feed(prefix)
    assert partial.closing()[0] == closing
