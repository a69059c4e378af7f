"""Prefill-only requests (max_tokens 0) and prompt logprobs, against the model's own forward."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import make_engine

from corral.engine.execution.batch import ForwardBatch
from corral.engine.serving.core import RequestError, SamplingParams

TEXT = (
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with "
    "a single step. All that glitters is not gold."
)


def direct_logprobs(model, ids: list[int]) -> torch.Tensor:
    """log P(ids[i] | ids[:i]) for i >= 1, from one forward pass over the whole prompt."""
    pool = model.runner.make_kv_pool(len(ids))
    slots = torch.arange(len(ids), dtype=torch.int64)
    batch = ForwardBatch.from_sequences([ids], [slots], torch.arange(len(ids) - 1))
    logits = model.runner.forward(batch, pool)
    lp = torch.log_softmax(logits.float(), dim=-1)
    return lp.gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1)


def run_one(engine, ids, params):
    rid = engine.add_request(ids, params)
    return engine.run_until_done()[rid][0]


def test_prefill_only_caches_the_prompt_and_generates_nothing(smollm2):
    engine = make_engine(smollm2)
    ids = smollm2.tokenizer.encode(TEXT)
    got = run_one(engine, ids, SamplingParams(max_tokens=0))
    assert got.finish_reason == "length" and got.token_ids == [] and got.text == ""
    assert engine.stats()["radix_cached_tokens"] >= len(ids)
    again = run_one(engine, ids + ids[:3], SamplingParams(max_tokens=1, temperature=0))
    assert again.num_cached_tokens == len(ids)
    engine.check_integrity()


@pytest.mark.parametrize("chunk", [None, 16])
def test_prompt_logprobs_equal_the_models_forward(smollm2, chunk):
    engine = make_engine(
        smollm2, **({"max_batched_tokens": chunk, "max_num_seqs": 4} if chunk else {})
    )
    ids = smollm2.tokenizer.encode(TEXT)
    got = run_one(engine, ids, SamplingParams(max_tokens=0, prompt_logprobs_from=0, top_logprobs=3))
    expected = direct_logprobs(smollm2, ids)
    assert [lp.token_id for lp in got.prompt_logprobs] == ids[1:]
    values = torch.tensor([lp.logprob for lp in got.prompt_logprobs])
    torch.testing.assert_close(values, expected, atol=1e-4, rtol=1e-4)
    for lp in got.prompt_logprobs:  # the top alternatives are sorted and bound the chosen one
        tops = [v for _, v in lp.top]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert lp.logprob <= tops[0] + 1e-5


def test_prompt_logprobs_over_a_cached_prefix_reuse_only_what_they_may(smollm2):
    engine = make_engine(smollm2)
    ids = smollm2.tokenizer.encode(TEXT)
    prefix = ids[:20]
    run_one(engine, prefix, SamplingParams(max_tokens=0))
    start = 18  # the logprob of token 18 needs the logits at position 17
    got = run_one(
        engine, ids, SamplingParams(max_tokens=2, temperature=0, prompt_logprobs_from=start)
    )
    assert got.num_cached_tokens == start - 1
    assert [lp.token_id for lp in got.prompt_logprobs] == ids[start:]
    values = torch.tensor([lp.logprob for lp in got.prompt_logprobs])
    torch.testing.assert_close(
        values, direct_logprobs(smollm2, ids)[start - 1 :], atol=1e-4, rtol=1e-4
    )
    assert len(got.token_ids) == 2
    engine.check_integrity()


def test_prompt_logprobs_past_the_prompt_are_refused(smollm2):
    engine = make_engine(smollm2)
    with pytest.raises(RequestError, match="prompt logprobs start"):
        engine.add_request([1, 2, 3], SamplingParams(max_tokens=1, prompt_logprobs_from=3))


def test_flush_cache_keeps_entries_in_use(smollm2):
    engine = make_engine(smollm2)
    ids = smollm2.tokenizer.encode(TEXT)
    run_one(engine, ids[:30], SamplingParams(max_tokens=0))
    engine.add_request(ids[:10] + ids[40:50], SamplingParams(max_tokens=4, temperature=0))
    engine.step()  # the running request holds the first 10 tokens of the cached prompt
    locked = engine.stats()["radix_locked_tokens"]
    assert locked >= 10
    freed = engine.flush_cache()
    assert freed > 0 and engine.stats()["radix_cached_tokens"] == locked
    engine.run_until_done()
    engine.check_integrity()
    engine.flush_cache()
    assert engine.stats()["radix_cached_tokens"] == 0


def test_requests_sent_together_prefill_their_shared_prefix_once(smollm2):
    """A fork's branches arrive at once with the same document: one prefills it, the others
    wait for it in the radix cache instead of computing it again."""
    engine = make_engine(smollm2)
    doc = smollm2.tokenizer.encode(TEXT * 4)
    branches = [doc + smollm2.tokenizer.encode(f" Question {i}: why?") for i in range(4)]
    for ids in branches:
        engine.add_request(ids, SamplingParams(max_tokens=2, temperature=0))
    engine.run_until_done()
    stats = engine.stats()
    prefilled = stats["prompt_tokens"] - stats["radix_hit_tokens"]
    own = sum(len(ids) - len(doc) for ids in branches)
    assert prefilled <= len(doc) + own, (prefilled, len(doc), own)
    engine.check_integrity()
