"""`uniqueItems` over listed strings (an `enum` of strings with too many arrangements to list),
checked at value boundaries (`grammar/checks/value_checks.py`): the matcher refuses every byte that
leaves only strings the array already holds, and a further item once it holds them all, so a
repeat is never written and no state is left without a valid continuation.

Real compiles with the Llama-3 tokenizer; every verdict and every finished walk is judged by
`jsonschema`.
"""

from __future__ import annotations

import json

import pytest
import torch
from grammar_walkers import (
    allowed_ids,
    assert_closings_valid,
    assert_walks_valid_without_repeats,
    decode,
)
from jsonschema import Draft202012Validator

from corral.grammar import ConstraintError, ConstraintSpec, compile_constraint
from corral.grammar.checks.value_checks import ValueChecksMatcher
from corral.grammar.closing.shortest import JsonCloser
from corral.grammar.core.compiled import CompiledConstraint
from corral.grammar.core.walk import accepts
from corral.grammar.schema.rewrite_log import UNIQUE_CHECK_LISTED

#: "re" is a prefix of "red": once "re" is held, `"re` may still become "red"
COLOURS = ["red", "green", "blue", "cyan", "magenta", "yellow", "re"]
PICK = {
    "type": "object",
    "properties": {
        "tags": {"type": "array", "items": {"enum": COLOURS}, "uniqueItems": True, "minItems": 2}
    },
    "required": ["tags"],
    "additionalProperties": False,
}
JUDGE = Draft202012Validator(PICK)


def _compile(schema, tok, **kw) -> CompiledConstraint:
    return compile_constraint(ConstraintSpec.json_schema(schema, **kw), tok)


def _accepts(c: CompiledConstraint, text: str, tok) -> bool:
    bitmask = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    return accepts(c.matcher(), tok.encode(text), bitmask)


def _tags(items: list[str]) -> str:
    return json.dumps({"tags": items}, separators=(",", ":"))


@pytest.mark.parametrize(
    "items",
    [
        ["red", "green"],
        ["re", "red"],
        ["red", "re"],
        COLOURS,
        ["red", "red"],
        ["re", "re"],
        ["cyan", "blue", "cyan"],
        [*COLOURS, "red"],
        ["red"],
    ],
)
def test_every_verdict_is_the_judges(items, llama3_tokenizer):
    c = _compile(PICK, llama3_tokenizer)
    assert isinstance(c.matcher(), ValueChecksMatcher)
    assert any(r.rewrite == UNIQUE_CHECK_LISTED for r in c.rewrites)
    want = JUDGE.is_valid({"tags": items})
    assert _accepts(c, _tags(items), llama3_tokenizer) is want
    again = CompiledConstraint.from_bytes(c.to_bytes(), llama3_tokenizer)  # the cache keeps it
    assert _accepts(again, _tags(items), llama3_tokenizer) is want


def test_once_every_listed_string_is_held_the_array_ends(llama3_tokenizer):
    tok = llama3_tokenizer
    m = _compile(PICK, tok).matcher()
    for t in tok.encode(_tags(COLOURS)[:-2]):  # all seven, the array still open
        assert m.accept(t)
    bitmask = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    m.fill_mask(bitmask, 0)
    allowed = {decode(tok, [t]) for t in allowed_ids(bitmask, 0, tok.vocab_size).tolist()}
    assert "]" in allowed and not any("," in a for a in allowed)


def test_an_eager_walk_toward_repeats_never_stalls(llama3_tokenizer):
    """Always the token that would repeat an item if the matcher let it: the walk still ends in
    a valid instance, and no step is left without an allowed token."""
    tok = llama3_tokenizer
    m = _compile(PICK, tok).matcher()
    prefer = [tok.encode(p)[0] for p in ('{"', "tags", '":["', "re", '","', "red", "d")]
    bitmask = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    out: list[int] = []
    for _ in range(80):
        m.fill_mask(bitmask, 0)
        allowed = set(allowed_ids(bitmask, 0, tok.vocab_size).tolist())
        assert allowed, "no token allowed: a dead end after " + decode(tok, out)
        pick = next((t for t in prefer if t in allowed), min(allowed))
        if pick in tok.eos_token_ids:
            break
        assert m.accept(pick)
        out.append(pick)
    assert JUDGE.is_valid(json.loads(decode(tok, out))), decode(tok, out)


def test_random_walks_are_valid(llama3_tokenizer):
    c = _compile(PICK, llama3_tokenizer)
    assert_walks_valid_without_repeats(c.matcher, PICK, llama3_tokenizer, 40, 80)


@pytest.mark.parametrize("items", [["re", "red", "cyan"], COLOURS[:5]])
def test_budget_closings_pick_strings_not_held(items, llama3_tokenizer):
    c = _compile(PICK, llama3_tokenizer)
    closer = JsonCloser.for_spec(ConstraintSpec.json_schema(PICK))
    assert JUDGE.is_valid(json.loads(closer.shortest(closer.root)))
    text = _tags(items)
    assert assert_closings_valid(PICK, c, text, llama3_tokenizer) >= len(text) // 2


def test_refused_where_the_check_would_not_be_exact(llama3_tokenizer):
    tok = llama3_tokenizer
    tags = PICK["properties"]["tags"]
    many = [f"c{i}" for i in range(20)]  # past arrangements: the matcher would check them
    too_many = {**tags, "items": {"enum": many}, "minItems": 21}  # no array has 21 distinct
    other = {**tags, "items": {"enum": ["x", "y", "z", "w", "v", "u"]}}
    for schema in (too_many, {"anyOf": [tags, other]}):
        with pytest.raises(ConstraintError) as e:
            _compile(schema, tok)
        assert e.value.keyword == "uniqueItems"
    after_reasoning = ConstraintSpec.json_schema(PICK).after_reasoning("<think>", "</think>")
    with pytest.raises(ConstraintError):
        compile_constraint(after_reasoning, tok)


def test_closings_are_known_inside_escapes(llama3_tokenizer):
    """Listed strings that need escapes: a closing is known after every character, a half-
    written escape included (before, `"q\\` finished as `q\\n`, held, so no closing was known
    and budget closing ended such an output at once, as `length`)."""
    escaped = ['q"', "q\\", "q\n", "é", "日本", "x y"]
    schema = {"type": "array", "items": {"enum": escaped}, "uniqueItems": True, "minItems": 5}
    c = _compile(schema, llama3_tokenizer)
    text = json.dumps(["x y", "q\\", "q\n", 'q"', "é"], ensure_ascii=False, separators=(",", ":"))
    assert_closings_valid(schema, c, text, llama3_tokenizer, always=True)


def test_the_mask_takes_out_exactly_the_tokens_the_scan_refuses(llama3_tokenizer):
    """The matcher scans only the tokens that could be refused (a superset it computes from
    the strings held); the oracle scans every token the backend allows. Through escapes and
    over random walks, with strings that are prefixes of each other, the masks agree at every
    step (the backend also spells a newline `\\u000a`: a held "q\\n" could be written again
    that way unless the check refuses the `u`)."""
    import random

    from corral.grammar.checks.value_scan import scan

    tok = llama3_tokenizer
    schema = {
        "type": "array",
        "items": {"enum": ["a", "ab", "b", "ba", '"q', "a b", 'q"', "q\\", "q\n", "é"]},
        "uniqueItems": True,
    }
    c = _compile(schema, tok)
    sites = c.matcher()._sites  # noqa: SLF001 - the oracle needs the automaton
    pieces = c.matcher()._bytes  # noqa: SLF001

    def agree(m) -> set[int]:
        mine = torch.zeros((1, tok.mask_words), dtype=torch.int32)
        backend = torch.zeros((1, tok.mask_words), dtype=torch.int32)
        m.fill_mask(mine, 0)
        m._inner.fill_mask(backend, 0)  # noqa: SLF001
        state = m._states[-1]  # noqa: SLF001
        allowed = allowed_ids(backend, 0, tok.vocab_size).tolist()
        want = {
            t
            for t in allowed
            if t in tok.eos_token_ids or scan(sites, state, pieces[t]) is not None
        }
        assert set(allowed_ids(mine, 0, tok.vocab_size).tolist()) == want
        return want

    # written piece by piece, so the states inside an escape are visited (`q\\` then `"`)
    for pieces_ in (
        ['["', "q", "\\", "n", '","', "q", "\\", '"', '","', "q", "\\", "\\", '","a b"]'],
        ['["ab","a","', "é", '"]'],
    ):
        m = c.matcher()
        for t in (t for piece in pieces_ for t in tok.encode(piece)):
            assert t in agree(m) and m.accept(t), pieces_
    rng = random.Random(7)
    for _ in range(12):
        m = c.matcher()
        for _ in range(40):
            pick = rng.choice(sorted(agree(m)))
            if pick in tok.eos_token_ids:
                break
            assert m.accept(pick)


def test_an_item_of_one_of_several_lists_is_one_of_their_union(llama3_tokenizer):
    """`items: {anyOf: [enum, enum]}` lists the union of the branches: checked like one list."""
    schema = {
        "type": "array",
        "items": {"anyOf": [{"enum": ["a", "b", "c"]}, {"enum": ["d", "e", "f", "a"]}]},
        "uniqueItems": True,
        "minItems": 4,
    }
    c = _compile(schema, llama3_tokenizer)
    assert any(r.rewrite == UNIQUE_CHECK_LISTED for r in c.rewrites)
    judge = Draft202012Validator(schema)
    for items in (["a", "d", "b", "f"], ["a", "d", "a", "f"], list("abcdef"), [*"abcdef", "a"]):
        text = json.dumps(items, separators=(",", ":"))
        assert _accepts(c, text, llama3_tokenizer) is judge.is_valid(items), text
    assert_closings_valid(schema, c, '["f","a","', llama3_tokenizer, always=True)
    assert_walks_valid_without_repeats(c.matcher, schema, llama3_tokenizer, 20, 60)
