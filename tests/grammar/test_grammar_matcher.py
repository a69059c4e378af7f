"""Matcher semantics on both backends, checked at every step of random walks.

At each step: EOS is allowed exactly when ``can_terminate()``; a forbidden token is refused
and leaves the state (the next mask) unchanged; nothing is forced where the text may end.
After a walk: ``rollback(n)`` restores the mask seen n tokens earlier, and each step's
``forced_continuation()`` is a prefix of the bytes the walk went on to produce.
"""

from __future__ import annotations

import random

import pytest
import torch
from grammar_walkers import (
    TokenTable,
    Walk,
    allowed_ids,
    byte_tokenizer,
    check_forced,
    has_id,
    pick_token,
)
from mask_constraints import LOOKAHEAD_EBNF

from corral.fuzz.targets import compile_xgrammar_schema
from corral.grammar import ConstraintSpec, JsonFormat, TokenizerInfo, compile_constraint
from corral.grammar.backends import xgr as xgr

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "n": {"type": "integer", "minimum": -5, "maximum": 500},
        "tags": {"type": "array", "items": {"enum": ["a", "bc"]}, "maxItems": 3},
    },
    "required": ["name", "n"],
    "additionalProperties": False,
}

# name -> (how to build the matcher factory for a tokenizer, a valid complete text). No proper
# prefix of these texts is itself complete, so EOS must be refused until the last token.
CASES = {
    "llguidance-json": ("json", '{"name":"ab","n":7}'),
    "llguidance-regex": ("regex", "ab-12"),
    "llguidance-lark": ("lark", "(1,22)"),
    "llguidance-choice": ("choice", "green"),
    "xgrammar-ebnf": ("ebnf", '{"k":[1,true]}'),
    "xgrammar-json": ("xgr-json", '{"name":"ab","n":7}'),
}


def _factory(kind: str, tok: TokenizerInfo):
    """A zero-argument function returning fresh matchers, plus the backend name."""
    if kind == "xgr-json":
        compiled = compile_xgrammar_schema(SCHEMA, JsonFormat(), tok, strict=True)
        return (lambda: xgr.XGrammarMatcher(compiled)), xgr.NAME
    spec = {
        "json": lambda: ConstraintSpec.json_schema(SCHEMA),
        "regex": lambda: ConstraintSpec.regex(r"[a-z]{1,3}-\d{1,4}"),
        "lark": lambda: ConstraintSpec.lark('start: "(" NUM ("," NUM)* ")"\nNUM: /[0-9]{1,3}/'),
        "choice": lambda: ConstraintSpec.choice(["red", "green", "greenish"]),
        "ebnf": lambda: ConstraintSpec.ebnf(LOOKAHEAD_EBNF),
    }[kind]()
    c = compile_constraint(spec, tok)
    return c.matcher, c.backend


@pytest.fixture(scope="module")
def factories(llama3_tokenizer):
    out = {name: _factory(kind, llama3_tokenizer) for name, (kind, _) in CASES.items()}
    assert {name: backend for name, (_, backend) in out.items()} == {
        name: name.split("-")[0] for name in CASES
    }
    return {name: f for name, (f, _) in out.items()}


def _mask(m, tok: TokenizerInfo) -> torch.Tensor:
    bm = torch.zeros((1, tok.mask_words), dtype=torch.int32)
    m.fill_mask(bm, 0)
    return bm


def _forbidden(ids, tok: TokenizerInfo, rng: random.Random) -> list[int]:
    """A random disallowed token, and every EOS token when EOS is not allowed."""
    out = [e for e in tok.eos_token_ids if not has_id(ids, e)]
    for _ in range(64):
        t = rng.randrange(tok.tokenizer_vocab_size)
        if not has_id(ids, t):
            return out + [t]
    return out


def _checked_walk(m, tok, table, rng, max_tokens=60) -> tuple[Walk, list[torch.Tensor]]:
    """A steered walk that checks the per-step invariants; masks[i] is the mask before
    tokens[i]. A final EOS, when taken, is in ``walk.tokens`` too."""
    walk, masks = Walk(), []
    while len(walk.tokens) < max_tokens and not m.is_terminated():
        mask = _mask(m, tok)
        ids = allowed_ids(mask, 0, tok.vocab_size)
        eos_ok = any(has_id(ids, e) for e in tok.eos_token_ids)
        assert eos_ok == m.can_terminate(), f"step {len(walk.tokens)}: EOS in mask {eos_ok}"
        for bad in _forbidden(ids, tok, rng):
            assert not m.accept(bad), f"accepted forbidden token {bad}"
            assert torch.equal(_mask(m, tok), mask), "a refused token changed the state"
            assert m.can_terminate() == eos_ok
        forced = m.forced_continuation()
        assert not (eos_ok and forced), "bytes are forced although the text may end here"
        walk.forced.append(forced)
        masks.append(mask)
        if eos_ok and (rng.random() < 0.3 or ids.size == len(tok.eos_token_ids)):
            assert m.accept(tok.eos_token_ids[0]) and m.is_terminated()
            walk.tokens.append(tok.eos_token_ids[0])
            walk.terminated = True
            return walk, masks
        token = pick_token(ids, table, rng, steer=0.6)
        assert m.accept(token)
        walk.tokens.append(token)
    walk.terminated = m.is_terminated()
    return walk, masks


@pytest.mark.parametrize("name", CASES)
def test_invariants_along_walks(name, factories, llama3_tokenizer):
    tok = llama3_tokenizer
    table = TokenTable.cached(tok, closers=b'"}]);')
    rng = random.Random(name)
    for _ in range(6):
        m = factories[name]()
        walk, masks = _checked_walk(m, tok, table, rng)
        eos_taken = walk.terminated and walk.tokens and walk.tokens[-1] in tok.eos_token_ids
        text_walk = Walk(walk.tokens[:-1] if eos_taken else walk.tokens, walk.terminated)
        text_walk.forced = walk.forced[: len(text_walk.tokens)]
        check_forced(text_walk, tok)
        _check_rollbacks(m, walk.tokens, masks, tok, rng)


def _check_rollbacks(m, tokens, masks, tok, rng) -> None:
    """rollback(j) restores masks[k - j]; accepting the same tokens again brings it back."""
    k = len(tokens)
    assert len(masks) == k
    for j in sorted({1, k, rng.randint(1, k)} if k else ()):
        m.rollback(j)
        assert torch.equal(_mask(m, tok), masks[k - j]), f"rollback({j}) of {k} differs"
        assert m.accept_tokens(tokens[k - j :]) == j


@pytest.mark.parametrize("name", CASES)
def test_eos_and_the_finished_state(name, factories, llama3_tokenizer):
    """Feeding a valid text: EOS allowed only at the end; after EOS the matcher is finished,
    forces nothing, refuses more text; rollback(1) undoes exactly the EOS."""
    tok = llama3_tokenizer
    _, text = CASES[name]
    ids = tok.encode(text)
    m = factories[name]()
    for i, t in enumerate(ids):
        assert not m.can_terminate(), f"{text[:i]!r} is not complete"
        assert not m.accept(tok.eos_token_ids[0])
        assert m.accept(t)
    assert m.can_terminate()
    before = _mask(m, tok)
    assert m.accept(tok.eos_token_ids[-1])
    assert m.is_terminated()
    assert m.forced_continuation() == b""
    assert not m.accept(ids[0])
    m.rollback(1)
    assert m.can_terminate()
    assert torch.equal(_mask(m, tok), before), "rollback(1) after EOS did not undo the EOS"


@pytest.mark.parametrize("kind", ["json", "regex", "ebnf"])
def test_fill_mask_writes_only_its_row_and_never_padding(kind):
    """With a model vocabulary wider than the tokenizer's, ids past the tokenizer are never
    allowed; other rows are untouched; False is returned only when every token is allowed."""
    base = byte_tokenizer()
    tok = TokenizerInfo.from_hf(base.hf_tokenizer, vocab_size=300)  # 257 real + 43 padding
    new_matcher, _ = _factory(kind, tok)
    m = new_matcher()
    bm = torch.full((3, tok.mask_words), -1, dtype=torch.int32)
    restricted = m.fill_mask(bm, 1)
    assert bool((bm[0] == -1).all()) and bool((bm[2] == -1).all())
    ids = allowed_ids(bm, 1, 32 * tok.mask_words)
    assert ids.size and int(ids.max()) < tok.tokenizer_vocab_size
    assert restricted or ids.size == tok.tokenizer_vocab_size
    for padding_id in (257, 299):
        assert not m.accept(padding_id)
