"""`uniqueItems` over open items (objects, arrays, numbers, literals, mixed), checked at value
boundaries (`grammar/checks/open_items.py`, `grammar/checks/value_scan.py`): the matcher refuses a token
that would finish an item equal, as the judge compares them, to one the array holds, and every
token that would leave an item only such values; a closed object is settled at its last open
member, and what may follow it is listed.

Real compiles with the Llama-3 tokenizer, and a byte-level tokenizer for walks that try to
repeat items byte by byte; every verdict and every finished walk is judged by `jsonschema`.
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from grammar_walkers import (
    allowed_ids,
    assert_closings_valid,
    byte_tokenizer,
    decode,
    no_repeats,
)
from jsonschema import Draft202012Validator

from corral.grammar import ConstraintError, ConstraintSpec, compile_constraint
from corral.grammar.checks.value_checks import ValueChecksMatcher
from corral.grammar.checks.value_scan import scan
from corral.grammar.closing.shortest import JsonCloser
from corral.grammar.core.compiled import CompiledConstraint
from corral.grammar.core.spec import JsonFormat
from corral.grammar.core.walk import accepts
from corral.grammar.schema.rewrite_log import UNIQUE_CHECK_OPEN


def _unique(items: object, **kw: object) -> dict:
    return {"type": "array", "items": items, "uniqueItems": True, **kw}


ANY = _unique(True)
OPEN = _unique({"type": "object", "properties": {"a": {"type": "integer"}}})
#: closed: settled once "email" is written, or at its `}` without it
OWNER = _unique(
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "email": {"type": "string"}},
        "additionalProperties": False,
    }
)
#: closed, with listed members after the last open one ("path"): `optional` and `kind`
EXTEND = _unique(
    {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "optional": {"type": "boolean"},
            "kind": {"enum": ["a", "b c"]},
        },
        "required": ["path"],
        "additionalProperties": False,
    }
)
COUNTS = _unique(
    {
        "type": "object",
        "properties": {"type": {"type": "string"}, "max": {"type": "integer", "minimum": 0}},
        "additionalProperties": False,
    }
)
NUMBERS = _unique({"type": "number"})
NATURALS = _unique({"type": "integer", "minimum": 0})
MIXED = _unique({"anyOf": [{"type": "array"}, {"type": "string"}, {"type": "boolean"}]})


def _compile(schema: dict, tok, **kw) -> CompiledConstraint:
    return compile_constraint(ConstraintSpec.json_schema(schema, **kw), tok)


def _accepts(c: CompiledConstraint, text: str, tok) -> bool:
    bitmask = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    return accepts(c.matcher(), tok.encode(text), bitmask)


CASES = [
    (ANY, [1, "1", True, None, [1], {"1": 1}, 1.5]),
    (ANY, [1, 1]),
    (ANY, [{"a": 1, "b": [2]}, {"b": [2], "a": 1}]),
    (ANY, [[], {}, "", 0, False, None]),
    (ANY, [True, 1, False, 0]),
    (ANY, [None, None]),
    (OPEN, [{"a": 1}, {"a": 1, "b": 2}, {}]),
    (OPEN, [{"a": 1, "b": 2}, {"a": 1, "b": 2}]),
    (OPEN, [{}, {}]),
    (OWNER, [{"name": "x"}, {"name": "x", "email": "e"}, {"email": "e"}]),
    (OWNER, [{"name": "x", "email": "e"}, {"name": "x", "email": "e"}]),
    (OWNER, [{"name": "x"}, {"name": "x"}]),
    (EXTEND, [{"path": "p"}, {"path": "p", "optional": True}, {"path": "p", "kind": "b c"}]),
    (EXTEND, [{"path": "p", "optional": False}, {"path": "p", "optional": False}]),
    (EXTEND, [{"path": "p", "kind": "a"}, {"path": "p", "kind": "a"}]),
    (COUNTS, [{"type": "t", "max": 0}, {"type": "t"}, {"type": "t", "max": 10}]),
    (COUNTS, [{"type": "t", "max": 0}, {"type": "t", "max": 0}]),
    (NUMBERS, [1, 2.5, -3, 0.25]),
    (NUMBERS, [1, 1.0]),
    (NUMBERS, [2.5, 2.50]),
    (NUMBERS, [0, -0.0]),
    (NATURALS, [0, 1, 10]),
    (NATURALS, [7, 7]),
    (MIXED, [[1], [1, 2], "x", True]),
    (MIXED, [[1, [2]], [1, [2]]]),
    (MIXED, ["x", "\u0078"]),
    (MIXED, [False, False]),
]


FORMATS = [
    (JsonFormat(), {"separators": (",", ":")}),
    (JsonFormat.python_default(), {}),
    (JsonFormat(flexible=True), {"indent": 1}),
]


@pytest.mark.parametrize(("schema", "items"), CASES)
def test_every_verdict_is_the_judges(schema, items, llama3_tokenizer):
    """Through the compiled matcher, in compact, spaced and free layouts, and through the
    cache's bytes: the judge's verdict. The spellings the judge reads as one value (`1` and
    `1.0`, key order, `\\u0078` and `x`) are one value to the matcher."""
    tok = llama3_tokenizer
    want = Draft202012Validator(schema).is_valid(items)
    for fmt, layout in FORMATS:
        c = _compile(schema, tok, json_format=fmt)
        assert isinstance(c.matcher(), ValueChecksMatcher)
        assert any(r.rewrite == UNIQUE_CHECK_OPEN for r in c.rewrites)
        again = CompiledConstraint.from_bytes(c.to_bytes(), tok)
        text = json.dumps(items, **layout)
        assert _accepts(c, text, tok) is want, text
        assert _accepts(again, text, tok) is want, text
    if "x" in items:  # the second "x" spelt as an escape
        assert not _accepts(_compile(schema, tok), '["x","\\u0078"]', tok)


def test_number_items_are_written_in_plain_decimal(llama3_tokenizer):
    """A narrowing of spellings, not of values: no exponent, at most 15 significant digits
    after a point, no `-` where no item may be negative."""
    tok = llama3_tokenizer
    numbers, naturals = _compile(NUMBERS, tok), _compile(NATURALS, tok)
    assert _accepts(numbers, "[100000,0.123456789012345]", tok)
    assert not _accepts(numbers, "[1e5]", tok)
    assert not _accepts(numbers, "[0.1234567890123456]", tok)
    assert not _accepts(naturals, "[-0]", tok)
    assert _accepts(numbers, "[123456789012345678901234567890]", tok)  # an int is exact


_STRINGS = (1, 2)  # the scan's modes inside a key and inside a string


def _allowed(m, tok) -> set[str]:
    bitmask = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    m.fill_mask(bitmask, 0)
    return {decode(tok, [t]) for t in allowed_ids(bitmask, 0, tok.vocab_size).tolist()}


def _fed(c: CompiledConstraint, text: str, tok):
    m = c.matcher()
    for t in tok.encode(text):
        assert m.accept(t), text
    return m


def test_a_value_is_refused_as_soon_as_every_way_to_finish_it_is_held(llama3_tokenizer):
    tok = llama3_tokenizer
    # an integer item 0 is finished by its first digit
    assert "0" not in _allowed(_fed(_compile(NATURALS, tok), "[0,", tok), tok)
    # "p" followed by each of the 9 listed tails, held but one: the string may still close
    c = _compile(EXTEND, tok)
    tails = [
        {
            "path": "p",
            **({} if o is None else {"optional": o}),
            **({} if k is None else {"kind": k}),
        }
        for o in (None, True, False)
        for k in (None, "a", "b c")
    ]
    text = json.dumps(tails[:-1], separators=(",", ":"))[:-1] + ',{"path":"p'
    assert '"' in _allowed(_fed(c, text, tok), tok)
    assert _accepts(c, text + '","optional":false,"kind":"b c"}]', tok)
    assert not _accepts(c, text + '","optional":false,"kind":"a"}]', tok)
    # all 9 held: "p" cannot be closed, the string goes on
    text = json.dumps(tails, separators=(",", ":"))[:-1] + ',{"path":"p'
    allowed = _allowed(_fed(c, text, tok), tok)
    assert not any(a.startswith('"') for a in allowed) and "q" in allowed


def _byte_walks(schema: dict, walks: int, seed: int) -> tuple[int, int]:
    """Walks over single bytes that, nine times in ten, take the byte that would continue the
    longest earlier stretch of the text again (so they keep trying to write an item twice):
    never a step without an allowed byte, every finished walk valid. Returns (finished walks,
    bytes the matcher took out of the backend's mask on the way)."""
    tok = byte_tokenizer()
    c = _compile(schema, tok)
    judge = Draft202012Validator(schema)
    rng = random.Random(seed)
    mine = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    backend = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    finished = refused = 0
    for _ in range(walks):
        m, out = c.matcher(), b""
        for _ in range(300):
            if m.is_terminated():
                break
            m.fill_mask(mine, 0)
            m._inner.fill_mask(backend, 0)  # noqa: SLF001 - counts what the check took out
            ids = allowed_ids(mine, 0, tok.vocab_size).tolist()
            assert ids, ("no byte allowed", out)
            refused += len(allowed_ids(backend, 0, tok.vocab_size)) - len(ids)
            ends = [i for i in ids if i >= 256]
            if ends and (rng.random() < 0.3 or len(ends) == len(ids)):
                assert m.accept(ends[0])
                break
            pick = _repeat(out, ids) if rng.random() < 0.9 else None
            pick = rng.choice([i for i in ids if i < 256]) if pick is None else pick
            assert m.accept(pick), (out, pick)
            out += bytes((pick,))
        if m.is_terminated():
            finished += 1
            instance = json.loads(out.decode(), object_pairs_hook=no_repeats)
            assert judge.is_valid(instance), out
    return finished, refused


def _repeat(out: bytes, ids: list[int]) -> int | None:
    for n in range(min(len(out), 40), 0, -1):
        at = out.find(out[-n:])
        if at + n < len(out):
            return out[at + n] if out[at + n] in ids else None
    return None


@pytest.mark.parametrize(
    "schema", [ANY, OPEN, OWNER, EXTEND, COUNTS, NUMBERS, NATURALS, MIXED], ids=str
)
def test_walks_that_keep_repeating_items_never_stall(schema):
    finished, refused = _byte_walks({**schema, "maxItems": 6}, walks=30, seed=5)
    assert finished >= 10
    assert refused > 0  # the walks did try to repeat items, and were steered away


@pytest.mark.parametrize(
    "schema", [ANY, OPEN, OWNER, EXTEND, COUNTS, NUMBERS, NATURALS, MIXED], ids=str
)
def test_the_mask_takes_out_exactly_the_tokens_the_scan_refuses(schema, llama3_tokenizer):
    """The matcher scans only the tokens that could be refused (a superset); the oracle scans
    every token the backend allows. Over walks that repeat items, the masks agree."""
    tok = llama3_tokenizer
    c = _compile(schema, tok)
    sites = c.matcher()._sites  # noqa: SLF001 - the oracle needs the automaton
    pieces = c.matcher()._bytes  # noqa: SLF001
    rng = random.Random(11)
    mine = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    backend = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    for _ in range(6):
        m, out = c.matcher(), []
        for _ in range(40):
            m.fill_mask(mine, 0)
            m._inner.fill_mask(backend, 0)  # noqa: SLF001
            state = m._states[-1]  # noqa: SLF001
            allowed = allowed_ids(backend, 0, tok.vocab_size).tolist()
            # inside a string, a token without a quote stays in it, where no item is settled
            kept = [t for t in allowed if b'"' in pieces[t]] if state.mode in _STRINGS else []
            want = {
                t
                for t in kept or allowed
                if t in tok.eos_token_ids or scan(sites, state, pieces[t]) is not None
            }
            want |= set(allowed) - set(kept) if kept else set()
            assert set(allowed_ids(mine, 0, tok.vocab_size).tolist()) == want, decode(tok, out)
            again = [t for t in out[-6:] if t in want and rng.random() < 0.7]
            pick = again[0] if again else rng.choice(sorted(want))
            if pick in tok.eos_token_ids:
                break
            assert m.accept(pick)
            out.append(pick)


@pytest.mark.parametrize(
    "items",
    [
        {"type": "string", "maxLength": 3},  # finitely many strings
        {"type": "integer", "maximum": 100},  # a bounded number
        {"type": "object", "additionalProperties": False},  # only {}
        {  # the member after the last open one is no listed value
            "type": "object",
            "properties": {"a": {"type": "string"}, "n": {"type": "integer"}, "b": {}},
            "required": ["a"],
            "additionalProperties": False,
        },
        {  # the last open member is optional and listed ones follow it
            "type": "object",
            "properties": {"a": {"type": "string"}, "b": {"type": "boolean"}},
            "additionalProperties": False,
        },
        {"type": "object", "properties": {"a": {"type": "boolean"}}, "additionalProperties": False},
        {  # a float after the last open member: the backend spells 1.0 as 1
            "type": "object",
            "properties": {"a": {"type": "string"}, "b": {"enum": [1.0, "x"]}},
            "required": ["a"],
            "additionalProperties": False,
        },
    ],
)
def test_refused_where_an_item_could_run_out_of_new_values(items, llama3_tokenizer):
    with pytest.raises(ConstraintError) as e:
        _compile(_unique(items), llama3_tokenizer)
    assert e.value.keyword == "uniqueItems"


@pytest.mark.parametrize("schema", [ANY, OPEN, EXTEND, COUNTS, NATURALS, MIXED], ids=str)
def test_budget_closing_fills_distinct_items(schema, llama3_tokenizer):
    """The shortest instance the budget closer proposes for `minItems` open items holds
    distinct values, and the matcher takes it."""
    at_least = {**schema, "minItems": 3}
    closer = JsonCloser.for_spec(ConstraintSpec.json_schema(at_least))
    shortest = closer.shortest(closer.root)
    assert shortest is not None
    assert Draft202012Validator(at_least).is_valid(json.loads(shortest)), shortest
    assert _accepts(_compile(at_least, llama3_tokenizer), shortest, llama3_tokenizer)


@pytest.mark.parametrize(
    ("schema", "items"),
    [
        (EXTEND, [{"path": "", "optional": True}, {"path": ""}, {"path": "", "kind": "a"}]),
        (COUNTS, [{"type": "", "max": 0}, {}, {"max": 1}, {"type": ""}]),
        (OPEN, [{"a": 1}, {}, {"a": 12, "b": [1]}]),
        (NATURALS, [0, 1, 10, 2]),
        (ANY, [0, [], {}, "", 1, [0]]),
    ],
    ids=str,
)
def test_budget_closings_of_every_prefix_repeat_no_item(schema, items, llama3_tokenizer):
    """Fed one character at a time, the closer finishes the open item and fills `minItems`
    with values the array does not hold, or proposes nothing where the open item's closing
    would repeat one (before, an open item was not followed: its closing or the fill after it
    could repeat one, which the matcher refused, and budget closing stopped steering)."""
    at_least = {**schema, "minItems": 3}
    c = _compile(at_least, llama3_tokenizer)
    text = json.dumps(items, separators=(",", ":"))
    assert assert_closings_valid(at_least, c, text, llama3_tokenizer) >= len(text) * 2 // 3
