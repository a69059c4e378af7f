"""Matcher.error()/recover() through real llguidance and xgrammar, and the CORRAL_LLG_LIMITS knob.

The knob lowers llguidance's limits wherever a prototype is built, which drives a real matcher
into llguidance's error state: a row past a lowered ``max_items_in_row`` in the middle of a
generation (after the compile-time probe passed), or a lexer shared by every copy of one
prototype filling up under a lowered ``max_lexer_states`` (which ``recover`` gets past by
rebuilding the prototype).
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from limit_schemas import MID_GENERATION, MID_GENERATION_LIMITS

from corral.fuzz.targets import compile_xgrammar_schema
from corral.grammar import ConstraintError, ConstraintSpec, compile_constraint
from corral.grammar.backends import xgr as xgr
from corral.grammar.backends.llg_limits import LIMITS_ENV, effective_limits

VALID = '{"name":"Ada Lovelace","inner":{"p3":1,"p7":2}}'


def first_refused(tok, m, ids: list[int]) -> int | None:
    """Fill each mask and accept each token; the index of the first one refused, if any."""
    for i, t in enumerate(ids):
        masks(tok, m)
        assert m.error() is None
        if not m.accept(t):
            return i
    return None


def masks(tok, m) -> torch.Tensor:
    bitmask = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    m.fill_mask(bitmask, 0)
    return bitmask


def test_a_matcher_that_fails_mid_generation_says_why_and_recover_replays_it(
    llama3_tokenizer, monkeypatch
):
    tok = llama3_tokenizer
    monkeypatch.setenv(LIMITS_ENV, MID_GENERATION_LIMITS)
    compiled = compile_constraint(ConstraintSpec.json_schema(MID_GENERATION), tok)
    m = compiled.matcher()
    ids = tok.encode(VALID)
    i = first_refused(tok, m, ids)
    assert i is not None, "the lowered row limit was never reached"
    # Well past the first masks: at the key of the large object.
    assert tok.llguidance.decode_str(ids[: i + 1]).startswith('{"name":"Ada Lovelace","')
    assert "max is 40" in m.error() and "<state>" not in m.error()
    assert m.is_terminated() is False and m.can_terminate() is False
    # The limit is per position, so the rebuilt cursor is healthy where it was, and fails again.
    assert m.recover() is True and m.error() is None
    fresh = compiled.matcher()
    assert fresh.accept_tokens(ids[:i]) == i
    assert torch.equal(masks(tok, m), masks(tok, fresh))
    assert m.accept(ids[i]) is False and "max is 40" in m.error()
    # A speculative draft that ran into the limit is rolled back to a healthy cursor.
    m.rollback(2)
    assert m.error() is None
    fresh = compiled.matcher()
    assert fresh.accept_tokens(ids[: i - 2]) == i - 2
    assert torch.equal(masks(tok, m), masks(tok, fresh))
    assert first_refused(tok, m, ids[i - 2 :]) == 2 and "max is 40" in m.error()


def test_the_same_constraint_walks_through_with_the_default_limits(llama3_tokenizer):
    tok = llama3_tokenizer
    compiled = compile_constraint(ConstraintSpec.json_schema(MID_GENERATION), tok)
    m = compiled.matcher()
    assert m.accept_tokens(tok.encode(VALID)) == len(tok.encode(VALID))
    assert m.error() is None and m.can_terminate()


def test_recover_rebuilds_a_prototype_whose_shared_lexer_is_full(llama3_tokenizer, monkeypatch):
    tok = llama3_tokenizer
    rng = random.Random(0)
    words = sorted({"".join(rng.choice("abcdefghij") for _ in range(12)) for _ in range(400)})
    monkeypatch.setenv(LIMITS_ENV, '{"max_lexer_states": 400}')
    compiled = compile_constraint(ConstraintSpec.choice(words), tok)
    failed = None
    for word in words[::7]:  # each generation adds its own lexer states to the shared automaton
        m, ids = compiled.matcher(), tok.encode(word)
        for i, t in enumerate(ids):
            masks(tok, m)
            if m.error() is not None or not m.accept(t):
                failed = (m, ids, i)
                break
        if failed:
            break
    assert failed is not None, "the shared lexer never filled up"
    m, ids, i = failed
    assert "too many states" in m.error()
    assert m.recover() is True and m.error() is None  # on a rebuilt prototype
    assert m.accept_tokens(ids[i:]) == len(ids) - i
    assert m.can_terminate() and m.accept(tok.eos_token_ids[0]) and m.is_terminated()
    later = compiled.matcher()  # later requests get the renewed prototype
    assert later.accept_tokens(tok.encode(words[-1])) == len(tok.encode(words[-1]))


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
def test_recover_replays_exactly_what_rollback_left(llama3_tokenizer, backend):
    tok = llama3_tokenizer
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 5}},
        "required": ["a", "b"],
        "additionalProperties": False,
    }
    if backend == "llguidance":
        m = compile_constraint(ConstraintSpec.json_schema(schema), tok).matcher()
    else:
        m = xgr.XGrammarMatcher(
            compile_xgrammar_schema(
                schema, ConstraintSpec.json_object().json_format, tok, strict=True
            )
        )
    text = json.dumps({"a": 12, "b": "xy"}, separators=(",", ":"))
    ids = tok.encode(text)
    eos = tok.eos_token_ids[0]
    assert m.accept_tokens(ids) == len(ids) and m.accept(eos) and m.is_terminated()
    assert m.error() is None
    assert m.recover() is True and m.is_terminated()  # the EOS is replayed too
    m.rollback(3)  # the EOS and two tokens
    before = masks(tok, m)
    assert m.recover() is True and m.error() is None
    assert torch.equal(masks(tok, m), before)
    assert m.accept_tokens(ids[-2:]) == 2 and m.accept(eos) and m.is_terminated()
    with pytest.raises(ValueError):
        m.rollback(len(ids) + 2)


def test_the_limits_knob_is_read_at_every_compile(llama3_tokenizer, monkeypatch):
    tok = llama3_tokenizer
    spec = ConstraintSpec.json_schema({"type": "object", "properties": {"a": {}, "b": {}}})
    compile_constraint(spec, tok)
    monkeypatch.setenv(LIMITS_ENV, '{"max_items_in_row": 3}')
    with pytest.raises(ConstraintError) as err:
        compile_constraint(spec, tok)
    assert err.value.limit == "max_items_in_row" and "max is 3" in err.value.reason
    assert effective_limits({"max_items_in_row": 4100})["max_items_in_row"] == 3  # it wins
    for bad in ('{"max_items_in_row": 0}', '{"no_such_limit": 5}', "[1]", "{"):
        monkeypatch.setenv(LIMITS_ENV, bad)
        with pytest.raises(ValueError, match=LIMITS_ENV):
            effective_limits()
