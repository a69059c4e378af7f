"""Numbers that must not be integers (``not {type: integer}``), checked at value boundaries
(``grammar.value_sites``, ``grammar.value_checks``).

Real tokenizer, real compiles. The text rules are checked against a brute-force search and the
float judge; random walks are judged by ``jsonschema`` with the schema as sent, so a walk that
writes an integer where a fraction is due, or reaches a dead end, fails.
"""

from __future__ import annotations

import itertools
import json
import random
from decimal import Decimal

import pytest
import torch
from grammar_walkers import TokenTable, assert_closings_valid, decode, steered_walk
from jsonschema import Draft202012Validator

from corral.grammar import ConstraintError, ConstraintSpec, compile_constraint
from corral.grammar.checks.value_checks import ValueChecksMatcher
from corral.grammar.checks.value_scan import MAX_DIGITS, alive, is_fraction
from corral.grammar.checks.value_sites import FRACTION, value_sites
from corral.grammar.closing.partial_json import PartialJson
from corral.grammar.closing.shortest import JsonCloser
from corral.grammar.core.compiled import CompiledConstraint
from corral.grammar.core.compiler import checked_marks
from corral.grammar.core.walk import accepts
from corral.grammar.schema.analysis import analyze_schema
from corral.grammar.schema.rewrite_log import FRACTION_CHECK, UNIQUE_CHECK

NOT_INT = {"not": {"type": "integer"}}
OBJECT = {
    "type": "object",
    "properties": {"a": {"type": "number", **NOT_INT}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
#: schemas whose numbers at some position must be fractions, and that position's pointer path
WALKED = [
    ({"type": "number", **NOT_INT}, ()),
    (OBJECT, ("a",)),
    ({"type": "array", "items": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}, (0,)),
    (
        {
            "type": "array",
            "prefixItems": [{"type": "integer"}, {"type": "number", **NOT_INT}],
            "minItems": 2,
        },
        (1,),
    ),
    (
        {
            "type": "object",
            "properties": {"v": {"not": {"type": ["integer", "string", "boolean", "null"]}}},
            "required": ["v"],
            "additionalProperties": False,
        },
        ("v",),
    ),
]


def _compile(schema, tok, **kw):
    return compile_constraint(ConstraintSpec.json_schema(schema, **kw), tok)


def _accepts(c: CompiledConstraint, text: str, tok) -> bool:
    bitmask = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    return accepts(c.matcher(), tok.encode(text), bitmask)


def _completions(depth: int):
    for n in range(depth + 1):
        yield from ("".join(p) for p in itertools.product("05.-e", repeat=n))


def _number(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return text[:1] in "-0123456789" and text[:1] != ""


def test_text_rules_match_a_brute_force_search_and_the_float_judge():
    prefixes = [p for p in _completions(4) if p[:1] in ("-", "0", "5")]
    for text in prefixes:
        if _number(text) and is_fraction(text):
            assert not float(text).is_integer()
            assert Decimal(text) % 1 != 0
        if not _number(text) and not any(_number(text + c) for c in _completions(3)):
            continue  # no number at all begins this way (the grammar never writes it)
        found = any(_number(text + c) and is_fraction(text + c) for c in _completions(3))
        if not _number(text) and text[-1:] in ".-" and not found:
            continue  # a point or sign the grammar continues with a digit (beyond 3 here)
        assert alive(text) == found, text
    whole = "9" * (MAX_DIGITS - 1)
    assert alive(whole) and not alive(whole + "9")  # no room left for a decimal
    assert is_fraction(whole + ".5") and not alive(whole + ".5" + "1")
    assert not alive("1e") and not is_fraction("1e-1")  # exponents are never written
    assert not is_fraction("2.000") and is_fraction("-0.001")


@pytest.mark.parametrize(("schema", "path"), WALKED, ids=[str(i) for i in range(len(WALKED))])
def test_walks_write_fractions_where_integers_are_not_allowed(schema, path, llama3_tokenizer):
    tok = llama3_tokenizer
    c = _compile(schema, tok)
    assert isinstance(c.matcher(), ValueChecksMatcher)
    assert any(r.rewrite == FRACTION_CHECK for r in c.rewrites)
    judge = Draft202012Validator(schema)
    table, rng = TokenTable.cached(tok), random.Random(7)
    seen = 0
    for _ in range(40):
        w = steered_walk(c.matcher(), table, rng, max_tokens=120, end_bias=0.6, steer=0.7)
        if not w.terminated:
            continue
        value = json.loads(decode(tok, w.tokens))
        assert judge.is_valid(value), (decode(tok, w.tokens), schema)
        for step in path:
            has = isinstance(value, dict | list) and (
                step in value if isinstance(value, dict) else step < len(value)
            )
            value = value[step] if has else None
        seen += isinstance(value, float)
    assert seen >= 3  # the site was reached, with a number, in enough walks to mean something


def test_texts_are_judged_at_the_number_boundary(llama3_tokenizer):
    tok = llama3_tokenizer
    c = _compile(OBJECT, tok)
    assert _accepts(c, '{"a":1.5,"b":2}', tok)
    assert _accepts(c, '{"a":-0.25,"b":-3}', tok)
    for integer in ("1", "1.0", "-20.000", "0"):
        assert not _accepts(c, '{"a":' + integer + ',"b":2}', tok), integer
    assert not _accepts(c, '{"a":1e-1,"b":2}', tok)  # a fraction, but written with an exponent
    top = _compile({"type": "number", **NOT_INT}, tok)
    assert _accepts(top, "2.5", tok) and not _accepts(top, "2", tok)  # EOS ends the number
    m = c.matcher()  # rolling back restores where the text stands
    head, number = tok.encode('{"a":'), tok.encode("12")
    assert m.accept_tokens(head + number) == len(head + number)
    assert not m.accept_tokens(tok.encode(","))  # 12 is an integer
    m.rollback(len(number))
    rest = tok.encode('3.5,"b":1}')
    assert m.accept_tokens(rest) == len(rest) and m.can_terminate()
    again = CompiledConstraint.from_bytes(c.to_bytes(), tok)  # the cache keeps the check
    assert isinstance(again.matcher(), ValueChecksMatcher)
    assert not _accepts(again, '{"a":3,"b":2}', tok) and _accepts(again, '{"a":3.5,"b":2}', tok)


def _assert_refused_then_reported(schema, pointer: str, keyword: str, tok) -> None:
    """Strict refuses the keyword with its pointer; lenient compiles without the check, says so
    in ``unenforced`` and claims no check in its rewrites."""
    with pytest.raises(ConstraintError) as info:
        _compile(schema, tok)
    assert (info.value.pointer, info.value.keyword) == (pointer, keyword)
    lenient = _compile(schema, tok, strict=False)
    assert [u.pointer for u in lenient.unenforced] == [pointer]
    assert not isinstance(lenient.matcher(), ValueChecksMatcher)
    assert not any(r.rewrite in (FRACTION_CHECK, UNIQUE_CHECK) for r in lenient.rewrites)


def test_a_fraction_the_matcher_cannot_tell_apart_is_refused_or_reported(llama3_tokenizer):
    tok = llama3_tokenizer
    # which branch the number belongs to is decided by a sibling key the matcher does not follow
    coupled = {
        "anyOf": [
            {"properties": {"x": NOT_INT, "t": {"const": "a"}}, "required": ["x", "t"]},
            {"properties": {"x": {"type": "integer"}, "t": {"const": "b"}}, "required": ["x", "t"]},
        ]
    }
    _assert_refused_then_reported(coupled, "/anyOf/0/properties/x/not", "not", tok)
    bounded = {"type": "number", "maximum": 5, **NOT_INT}  # "5" could not become a fraction
    with pytest.raises(ConstraintError):
        _compile(bounded, tok)


def test_marks_need_the_output_to_be_json_alone():
    schema = analyze_schema(OBJECT).schema
    value_sites(schema)  # JSON alone: fine
    with pytest.raises(ConstraintError):
        checked_marks(schema, strict=True, json_alone=False)
    lost = checked_marks(schema, strict=False, json_alone=False)
    assert [u.pointer for u in lost] == ["/properties/a/not"]
    assert FRACTION not in json.dumps(schema)


def test_budget_closing_finishes_a_fraction():
    closer = JsonCloser.for_spec(ConstraintSpec.json_schema(OBJECT))
    shortest = closer.shortest(closer.root)
    assert Draft202012Validator(OBJECT).is_valid(json.loads(shortest)), shortest
    for prefix in ('{"a":', '{"a":5', '{"a":5.', '{"a":-', '{"a":5.0'):
        partial = PartialJson.empty(closer)
        partial.feed(prefix)
        found = partial.closing()
        assert found is not None, prefix
        assert Draft202012Validator(OBJECT).is_valid(json.loads(prefix + found[0])), prefix


UNIQUE_TAGS = {
    "type": "object",
    "properties": {
        "tags": {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "uniqueItems": True,
            "minItems": 3,
        }
    },
    "required": ["tags"],
    "additionalProperties": False,
}


def test_string_items_never_repeat_however_they_are_spelt(llama3_tokenizer):
    tok = llama3_tokenizer
    c = _compile(UNIQUE_TAGS, tok)
    assert isinstance(c.matcher(), ValueChecksMatcher)
    assert any(r.rewrite == UNIQUE_CHECK for r in c.rewrites)
    assert _accepts(c, '{"tags":["a","b","ab"]}', tok)
    for repeat in (
        '["a","b","a"]',
        '["a","b","\\u0061"]',
        '["x y","x","x y"]',
        '["é","e","\\u00e9"]',
    ):
        assert not _accepts(c, '{"tags":' + repeat + "}", tok), repeat
    again = CompiledConstraint.from_bytes(c.to_bytes(), tok)  # the cache keeps the check
    assert not _accepts(again, '{"tags":["a","b","a"]}', tok)


def _eager_walk(m, tok, prefer: list[str], limit: int = 60) -> str:
    """Always the first of ``prefer`` the mask allows, else its lowest allowed token: for
    string items, the shortest items there are, which repeat unless the matcher refuses it."""
    from grammar_walkers import allowed_ids

    bitmask = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    ids = [tok.encode(p)[0] for p in prefer]
    out: list[int] = []
    for _ in range(limit):
        m.fill_mask(bitmask, 0)
        allowed = set(allowed_ids(bitmask, 0, tok.vocab_size).tolist())
        assert allowed, "no token allowed: a dead end"
        pick = next((t for t in ids if t in allowed), min(allowed))
        if pick in tok.eos_token_ids:
            break
        assert m.accept(pick)
        out.append(pick)
    return decode(tok, out)


def test_the_shortest_items_stay_distinct_and_never_stall(llama3_tokenizer):
    tok = llama3_tokenizer
    schema = {"type": "array", "items": {"type": "string"}, "uniqueItems": True, "minItems": 4}
    c = _compile(schema, tok)
    text = _eager_walk(c.matcher(), tok, ['"', "]", ",", "[", *map(chr, range(97, 123))])
    value = json.loads(text)
    assert Draft202012Validator(schema).is_valid(value) and len(value) == 4, text
    assert "" in value  # the first item is the shortest; the later ones had to differ


def test_a_unique_array_the_matcher_cannot_tell_apart_is_refused(llama3_tokenizer):
    tok = llama3_tokenizer
    either = {
        "anyOf": [
            {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
            {"type": "array", "items": {"type": "string"}, "minItems": 5},
        ]
    }
    _assert_refused_then_reported(either, "/anyOf/0/uniqueItems", "uniqueItems", tok)
    bounded = {"type": "array", "items": {"type": "string", "maxLength": 2}, "uniqueItems": True}
    with pytest.raises(ConstraintError):  # "ab" may be the only item left: refused up front
        _compile(bounded, tok)


def test_budget_closing_writes_distinct_items():
    closer = JsonCloser.for_spec(ConstraintSpec.json_schema(UNIQUE_TAGS))
    shortest = closer.shortest(closer.root)
    assert Draft202012Validator(UNIQUE_TAGS).is_valid(json.loads(shortest)), shortest


@pytest.mark.parametrize(
    "text", ['{"tags":["a","b","a b","ab"]}', '{"tags":["","0","\\n","\\"a"]}', '{"tags":["x"]}']
)
def test_closings_of_unique_arrays_are_distinct_and_accepted(text, llama3_tokenizer):
    """Closed at every prefix, the output's items stay distinct: the item being written, and
    the items filled in, differ from those the array holds (before, filling wrote `""` twice
    and the matcher refused it, so a real server cut such an output at `max_tokens`)."""
    schema = {"type": "object", "properties": {"tags": UNIQUE_TAGS["properties"]["tags"]}}
    schema["properties"]["tags"] = {**schema["properties"]["tags"], "items": {"type": "string"}}
    c = _compile(schema, llama3_tokenizer)
    assert assert_closings_valid(schema, c, text, llama3_tokenizer) >= len(text) // 2


def test_patterned_string_items_never_repeat_where_the_pattern_never_runs_out(llama3_tokenizer):
    """A ``pattern`` whose every allowed prefix extends to infinitely many strings keeps the
    check exact (a new item can always be written: walks finish and stay distinct); one that
    can run out (``^#[0-9a-f]{2}$``: "#ff" may be the only item left) is refused up front."""
    tok = llama3_tokenizer
    table, rng = TokenTable.cached(tok), random.Random(7)
    for pattern in ("^[a-z]+$", "^id-[0-9]+$", "^x", "^(?:https?://[a-z]+|<all>)"):
        schema = {
            "type": "array",
            "items": {"type": "string", "pattern": pattern},
            "uniqueItems": True,
            "minItems": 3,
        }
        c = _compile(schema, tok)
        assert any(r.rewrite == UNIQUE_CHECK for r in c.rewrites), pattern
        done = 0
        for _ in range(8):
            w = steered_walk(c.matcher(), table, rng, max_tokens=120, end_bias=0.7, steer=0.7)
            if w.terminated:
                done += 1
                value = json.loads(decode(tok, w.tokens))
                assert Draft202012Validator(schema).is_valid(value), (pattern, value)
        assert done >= 2, pattern
    c = _compile(
        {"type": "array", "items": {"type": "string", "pattern": "^[ab]+$"}, "uniqueItems": True},
        tok,
    )
    assert not _accepts(c, '["ab","b","ab"]', tok) and _accepts(c, '["ab","b","abb"]', tok)
    m = c.matcher()
    for t in tok.encode('["a","b","ab","a'):
        assert m.accept(t)
    bitmask = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    m.fill_mask(bitmask, 0)  # "a" is held: the item cannot close, but can go on
    assert not _allowed(bitmask, tok.encode('"]')[0]) and _allowed(bitmask, tok.encode("b")[0])
    for finite in ("^#[0-9a-f]{2}$", "^(?:on|off)$", "^a+b$"):
        bounded = {
            "type": "array",
            "items": {"type": "string", "pattern": finite},
            "uniqueItems": True,
        }
        with pytest.raises(ConstraintError):
            _compile(bounded, tok)


def _allowed(bitmask: torch.Tensor, token: int) -> bool:
    return bool((int(bitmask[0, token >> 5]) >> (token & 31)) & 1)
