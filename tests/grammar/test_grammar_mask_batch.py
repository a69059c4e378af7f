"""The grammar layer's batch mask fill (``corral.grammar.MaskBatchFiller``).

Real compiles over Llama-3's real tokenizer, real matchers walked along valid instances: plain
llguidance matchers, llguidance matchers wrapped by the repeated-key and value checks (filled
through their llguidance cursor, then refined), and xgrammar matchers (filled one by one). One
``fill`` over all of them, into shuffled rows of a larger buffer, must write exactly the mask
each matcher writes on its own (``fill_row``), touch no other row, and leave to the caller the
rows of a matcher in its error state.
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from mask_constraints import LOOKAHEAD_EBNF, PERSON

from corral.grammar import ConstraintSpec, MaskBatchFiller, Matcher, compile_constraint, fill_row
from corral.grammar.backends.llg import LLGuidanceMatcher
from corral.grammar.backends.xgr import XGrammarMatcher
from corral.grammar.checks.distinct_keys import DistinctKeysMatcher
from corral.grammar.checks.value_checks import ValueChecksMatcher

#: name -> (spec, a valid text, the matcher type compile_constraint gives)
CASES = {
    "plain": (
        ConstraintSpec.json_schema(PERSON),
        json.dumps({"name": "Ada Lovelace", "age": 36, "tags": ["bb", "a"]}, separators=(",", ":")),
        LLGuidanceMatcher,
    ),
    "distinct-keys": (
        ConstraintSpec.json_schema(
            {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2}
        ),
        '{"alpha":1,"beta":2,"gamma":3}',
        DistinctKeysMatcher,
    ),
    "fraction": (
        ConstraintSpec.json_schema(
            {
                "type": "object",
                "properties": {
                    "a": {"type": "number", "not": {"type": "integer"}},
                    "b": {"type": "integer"},
                },
                "required": ["a", "b"],
                "additionalProperties": False,
            }
        ),
        '{"a":12.5,"b":3}',
        ValueChecksMatcher,
    ),
    "unique-items": (
        ConstraintSpec.json_schema(
            {"type": "array", "items": {"type": "string"}, "uniqueItems": True, "minItems": 3}
        ),
        '["ab","abc","b"]',
        ValueChecksMatcher,
    ),
    "xgrammar": (ConstraintSpec.ebnf(LOOKAHEAD_EBNF), '{"k":[1,true],"kk":22}', XGrammarMatcher),
}
SENTINEL = 0x5A5A5A5A


@pytest.fixture(scope="module")
def tok(llama3_tokenizer):
    return llama3_tokenizer


@pytest.fixture(scope="module")
def walks(tok):
    """name -> (compiled constraint, the tokens of its valid text)."""
    out = {}
    for name, (spec, text, kind) in CASES.items():
        compiled = compile_constraint(spec, tok)
        assert type(compiled.matcher()) is kind, name
        out[name] = (compiled, tok.encode(text))
    return out


def _walked(compiled, ids: list[int], pos: int) -> Matcher:
    m = compiled.matcher()
    assert m.accept_tokens(ids[:pos]) == pos
    return m


def _every_position(walks) -> list[tuple[str, Matcher]]:
    """A matcher of every case at every position of its walk (the whole walk included)."""
    return [
        (name, _walked(compiled, ids, pos))
        for name, (compiled, ids) in walks.items()
        for pos in range(len(ids) + 1)
    ]


def _alone(matchers: list[Matcher], words: int) -> torch.Tensor:
    want = torch.zeros(len(matchers), words, dtype=torch.int32)
    for i, m in enumerate(matchers):
        fill_row(m, want, i)
        assert m.error() is None
    return want


def _buffer(rows: int, words: int) -> torch.Tensor:
    return torch.full((rows, words), SENTINEL, dtype=torch.int32)


def _refused(m: Matcher, words: int, vocab: int) -> int:
    row = torch.zeros(1, words, dtype=torch.int32)
    fill_row(m, row, 0)
    return next(t for t in range(vocab) if not row[0, t // 32] >> (t % 32) & 1)


def test_batched_names_the_matchers_filled_in_the_native_call(walks):
    batch = MaskBatchFiller(2)
    joined = {name: batch.batched(compiled.matcher()) for name, (compiled, _) in walks.items()}
    assert joined == {name: name != "xgrammar" for name in CASES}


@pytest.mark.parametrize("threads", [1, 3])
def test_one_fill_writes_the_mask_each_matcher_writes_on_its_own(walks, tok, threads):
    found = _every_position(walks)
    random.Random(threads).shuffle(found)
    matchers = [m for _, m in found]
    # Shuffled rows of a larger buffer: rows that no matcher names keep what they held.
    rows = random.Random(7).sample(range(len(matchers) + 9), len(matchers))
    got = _buffer(len(matchers) + 9, tok.mask_words)
    assert MaskBatchFiller(threads).fill(matchers, rows, got) == []
    want = _alone(matchers, tok.mask_words)
    for i, (name, _) in enumerate(found):
        assert torch.equal(got[rows[i]], want[i]), name
    untouched = sorted(set(range(len(got))) - set(rows))
    assert bool((got[untouched] == SENTINEL).all())
    # Not vacuous: the masks differ from row to row, and the checks refined some rows (their
    # llguidance cursor's own mask allows more than the wrapped matcher does).
    assert len({tuple(r.tolist()) for r in want}) > len(CASES)
    refined = 0
    for _, m in found:
        if isinstance(m, DistinctKeysMatcher | ValueChecksMatcher):
            raw = _buffer(1, tok.mask_words)
            cursor = m.native_cursor()
            cursor.unsafe_compute_mask_ptr(raw.data_ptr(), tok.mask_words * 4)
            mine = _alone([m], tok.mask_words)
            refined += not torch.equal(raw, mine)
    assert refined >= 3


def test_a_matcher_in_error_is_left_to_the_caller(walks, tok):
    at = [("plain", 3), ("distinct-keys", 4), ("xgrammar", 2), ("plain", 5), ("distinct-keys", 2)]
    matchers = [_walked(*walks[name], pos) for name, pos in at]
    for broken in matchers[:2]:  # llguidance's error state, as after a runtime limit
        cursor = broken.native_cursor()
        assert not cursor.consume_token(_refused(broken, tok.mask_words, tok.vocab_size))
        assert broken.error() is not None
    got = _buffer(len(matchers), tok.mask_words)
    assert MaskBatchFiller(2).fill(matchers, range(len(matchers)), got) == [0, 1]
    fresh = _alone([_walked(*walks[name], pos) for name, pos in at], tok.mask_words)
    assert torch.equal(got[2:], fresh[2:])
    assert not torch.equal(got[0], fresh[0])  # what the error state wrote: not its mask
    assert all(m.recover() for m in matchers[:2])  # what the caller does, then fills alone
    assert torch.equal(_alone(matchers, tok.mask_words), fresh)  # rebuilt where it was


class _Raising(Matcher):
    """A matcher with no native cursor whose fill raises (nothing else is ever called)."""

    def fill_mask(self, bitmask, row):
        raise RuntimeError("broken fill")

    accept = forced_continuation = is_terminated = can_terminate = _undo = None  # type: ignore


def test_a_fill_that_raises_is_left_to_the_caller(walks, tok):
    at = [("xgrammar", 3), None, ("plain", 4), ("plain", 6)]
    matchers = [_Raising() if a is None else _walked(*walks[a[0]], a[1]) for a in at]
    broken = matchers[2]
    assert not broken.native_cursor().consume_token(
        _refused(broken, tok.mask_words, tok.vocab_size)
    )
    got = _buffer(4, tok.mask_words)
    assert MaskBatchFiller().fill(matchers, [3, 2, 1, 0], got) == [1, 2]  # ascending
    want = _alone([matchers[0], matchers[3]], tok.mask_words)
    assert torch.equal(got[[3, 0]], want)
    assert MaskBatchFiller().fill([], [], got) == []


def test_a_refused_batch_call_leaves_its_rows_to_the_caller(walks, tok):
    """One cursor twice in one call: llguidance refuses the whole call ("Already borrowed");
    every batched row is the caller's to fill, the rows filled on their own are done."""
    plain, ids = walks["plain"]
    xgr, xgr_ids = walks["xgrammar"]
    twice = _walked(plain, ids, 2)
    matchers = [twice, _walked(xgr, xgr_ids, 1), twice, _walked(plain, ids, 6)]
    got = _buffer(4, tok.mask_words)
    assert MaskBatchFiller(2).fill(matchers, [0, 1, 2, 3], got) == [0, 2, 3]
    assert torch.equal(got[1], _alone([matchers[1]], tok.mask_words)[0])


def test_the_bitmask_must_be_one_contiguous_int32_block(walks, tok):
    m = walks["plain"][0].matcher()
    batch = MaskBatchFiller()
    for bad in (
        torch.zeros(2, tok.mask_words, dtype=torch.int64),
        torch.zeros(tok.mask_words, 2, dtype=torch.int32).t(),
        torch.zeros(2, tok.mask_words + 1, dtype=torch.int32)[:, 1:],
        torch.zeros(tok.mask_words, dtype=torch.int32),
    ):
        with pytest.raises(ValueError, match="contiguous int32"):
            batch.fill([m], [0], bad)
