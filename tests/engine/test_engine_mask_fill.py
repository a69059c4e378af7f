"""The mask filler's native path: plain llguidance rows filled by the grammar layer's batch call.

Real compiled constraints (Llama-3 tokenizer), real matchers walked along valid instances; the
reference is the same `MaskFill` with every job filled on its own (`fill_checked` per row), so
the native chunks must write exactly the masks the per-matcher path writes, keep drafts and
other jobs on their own path, and keep the `Matcher.error`/`recover` contract per row.
"""

from __future__ import annotations

import json
import threading

import pytest
import torch
from mask_constraints import PERSON

from corral.engine.constrained import masks as grammar_masks
from corral.engine.constrained.masks import MaskFill, MaskJob
from corral.engine.serving.core import SamplingParams, Sequence
from corral.fuzz.tokenizers import llama3_tokenizer
from corral.grammar import ConstraintSpec, MaskBatchFiller, compile_constraint
from corral.grammar.backends.llg import LLGuidanceMatcher

INSTANCE = {"name": "Ada Lovelace", "age": 36, "tags": ["bb", "a", "ccc"]}


@pytest.fixture(scope="module")
def walk():
    tok = llama3_tokenizer()
    compiled = compile_constraint(ConstraintSpec.json_schema(PERSON), tok)
    ids = tok.encode(json.dumps(INSTANCE, separators=(",", ":")))
    return tok, compiled, ids


def _jobs(compiled, ids: list[int], n: int, draft_every: int = 0) -> list[MaskJob]:
    """`n` sequences, sequence `i` walked `i % len(ids)` tokens into the instance; every
    `draft_every`-th one (0: none) carries the next two tokens as a draft."""
    jobs, row = [], 0
    for i in range(n):
        pos = i % (len(ids) - 2)
        matcher = compiled.matcher()
        for t in ids[:pos]:
            assert matcher.accept(t)
        seq = Sequence("t", i, [0], SamplingParams(), 0, matcher=matcher)
        draft = ids[pos : pos + 2] if draft_every and i % draft_every == 0 else []
        jobs.append(MaskJob(seq, draft, row))
        row += len(draft) + 1
    return jobs


def _fill(jobs: list[MaskJob], words: int, native: bool) -> tuple[MaskFill, torch.Tensor]:
    rows = sum(len(j.draft) + 1 for j in jobs)
    batch = MaskBatchFiller(2) if native else None
    fill = MaskFill(
        jobs, torch.zeros(rows, words, dtype=torch.int32), None, threading.Event(), batch
    )
    workers = [threading.Thread(target=fill.work) for _ in range(2)]
    for w in workers:
        w.start()
    assert fill.wait(None) == []
    for w in workers:
        w.join()
    return fill, fill.bitmask


def test_native_chunks_write_the_masks_each_matcher_writes(walk):
    tok, compiled, ids = walk
    assert type(compiled.matcher()) is LLGuidanceMatcher  # the native path applies
    n = 2 * grammar_masks.NATIVE_CHUNK + 5
    fill, got = _fill(_jobs(compiled, ids, n, draft_every=7), tok.mask_words, native=True)
    _, want = _fill(_jobs(compiled, ids, n, draft_every=7), tok.mask_words, native=False)
    assert torch.equal(got, want)
    native = [u for u in fill.units if u.native]
    alone = [u for u in fill.units if not u.native]
    assert len(native) >= 2 and all(len(u.jobs) <= grammar_masks.NATIVE_CHUNK for u in native)
    assert all(job.draft for u in alone for job in u.jobs)  # drafts fill on their own
    assert sum(len(u.jobs) for u in fill.units) == n


def test_a_matcher_in_error_inside_a_chunk_is_recovered_per_row(walk):
    tok, compiled, ids = walk
    jobs = _jobs(compiled, ids, 8)
    broken = jobs[3].seq.matcher
    row = torch.zeros(1, tok.mask_words, dtype=torch.int32)
    broken.fill_mask(row, 0)
    refused = next(t for t in range(tok.vocab_size) if not row[0, t // 32] >> (t % 32) & 1)
    assert not broken._m.consume_token(refused)  # llguidance's error state, as after a limit
    assert broken.error() is not None
    fill, got = _fill(jobs, tok.mask_words, native=True)
    assert all(u.native for u in fill.units)
    _, want = _fill(_jobs(compiled, ids, 8), tok.mask_words, native=False)
    assert torch.equal(got, want)  # rebuilt and replayed: the mask of its real position
    assert broken.error() is None and jobs[3].seq.failure is None


def test_wrapped_matchers_join_the_chunks_and_refine_their_rows():
    """A `DistinctKeysMatcher` (free-form keys under `minProperties`) is filled through its
    llguidance cursor in the batch call, then refined: the same masks as its own `fill_mask`,
    which forbid repeating a key the object holds."""
    tok = llama3_tokenizer()
    schema = {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2}
    compiled = compile_constraint(ConstraintSpec.json_schema(schema), tok)
    assert type(compiled.matcher()) is not LLGuidanceMatcher  # the key check wraps it
    ids = tok.encode(json.dumps({"alpha": 1, "beta": 2, "gamma": 3}, separators=(",", ":")))
    n = grammar_masks.NATIVE_CHUNK + 3
    fill, got = _fill(_jobs(compiled, ids, n), tok.mask_words, native=True)
    _, want = _fill(_jobs(compiled, ids, n), tok.mask_words, native=False)
    assert all(u.native for u in fill.units)
    assert torch.equal(got, want)
    # After `{"alpha":1,"alpha` the refinement clears exactly tokens that would close the key
    # there (the native cursor allowed them: the grammar alone does not see the repeat).
    m = compiled.matcher()
    prefix = tok.encode('{"alpha":1,"alpha')
    assert m.accept_tokens(prefix) == len(prefix)
    raw = torch.zeros(1, tok.mask_words, dtype=torch.int32)
    m.native_cursor().unsafe_compute_mask_ptr(raw.data_ptr(), tok.mask_words * 4)
    refined = raw.clone()
    m.refine_mask(refined, 0)
    cleared = [
        t for t in range(tok.vocab_size) if (raw[0, t // 32] ^ refined[0, t // 32]) >> (t % 32) & 1
    ]
    spell = tok.llguidance.decode_bytes
    assert cleared and all(spell([t]).startswith(b'"') for t in cleared)
