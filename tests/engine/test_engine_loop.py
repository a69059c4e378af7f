"""The engine loop on the real default model: batching, prefix cache, abort, preemption, sampling.

Every test ends with the KV integrity check (pool + tree + what live requests hold). Expected
outputs are never hard-coded: they come from another run of the same model (alone, cold, with a
big pool, without stop strings) or from a direct forward pass.
"""

from __future__ import annotations

import pytest
import torch
from engine_helpers import chat, make_engine

from corral.engine import Engine, EngineConfig, RequestError, SamplingParams
from corral.engine.execution.batch import ForwardBatch
from corral.engine.kvcache.kv_pool import KVPool

GREEDY = SamplingParams(max_tokens=10, temperature=0)
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Explain in one sentence why the sky is blue, please, and keep it short.",
]


@pytest.fixture(scope="module")
def prompts(smollm2):
    return [chat(smollm2, q) for q in QUESTIONS]


@pytest.fixture(scope="module")
def alone(smollm2, prompts):
    """Each prompt run alone on a cold engine without prefix cache: the reference outputs."""
    out = []
    for p in prompts:
        eng = make_engine(smollm2, prefix_cache=False)
        out.append(eng.generate([p], GREEDY)[0][0])
        eng.check_integrity()
    return out


def settled(eng: Engine) -> None:
    """Nothing running: every slot is free or in the tree, exactly once."""
    eng.check_integrity()
    assert not eng.live_sequences()
    assert eng.pool.num_free + eng.cache.radix.total_size == eng.pool.capacity


def test_concurrent_greedy_equals_alone_with_chunked_prefill(smollm2, prompts, alone):
    eng = make_engine(smollm2, max_batched_tokens=24, max_num_seqs=4)
    got = eng.generate(prompts, GREEDY)
    for ref, choices in zip(alone, got, strict=True):
        assert choices[0].token_ids == ref.token_ids
        assert choices[0].text == ref.text
        assert choices[0].finish_reason in ("stop", "length")
    assert eng.counters["steps"] > len(prompts)  # prompts of ~40 tokens took several chunks
    settled(eng)


def test_prefix_hit_equals_cold(smollm2, prompts, alone):
    eng = make_engine(smollm2)
    first = eng.generate([prompts[0]], GREEDY)[0][0]
    again = eng.generate([prompts[0]], GREEDY)[0][0]
    assert first.num_cached_tokens == 0
    assert again.num_cached_tokens == len(prompts[0]) - 1
    assert again.token_ids == first.token_ids == alone[0].token_ids
    # A different question after the same system prompt shares a long prefix.
    other = eng.generate([prompts[1]], GREEDY)[0][0]
    assert other.num_cached_tokens > 10
    assert other.token_ids == alone[1].token_ids
    settled(eng)


def test_abort_frees_everything(smollm2, prompts):
    eng = make_engine(smollm2, max_batched_tokens=16, max_num_seqs=2)
    rids = [eng.add_request(p, SamplingParams(max_tokens=30, temperature=0)) for p in prompts]
    for _ in range(4):
        eng.step()
        eng.check_integrity()
    # One decoding or prefilling, one still waiting (only two seats).
    outs = eng.abort(rids[0]) + eng.abort(rids[3])
    assert [o.finish_reason for o in outs] == ["abort", "abort"]
    eng.check_integrity()
    eng.step()
    eng.abort(rids[1])
    eng.abort("no-such-request")
    results = eng.run_until_done()
    assert set(results) == {rids[2]}
    settled(eng)


def test_preemption_with_tiny_pool_matches_big_pool(smollm2, prompts):
    params = SamplingParams(max_tokens=12, temperature=0)
    big = make_engine(smollm2).generate(prompts, params)
    per_slot = KVPool.slot_bytes(30, 3, 64, torch.float32)
    need = max(len(p) for p in prompts) + params.max_tokens
    eng = make_engine(smollm2, kv_cache_bytes=per_slot * (need + 20), max_num_seqs=4)
    small = eng.generate(prompts, params)
    assert eng.scheduler.num_preemptions > 0
    for a, b in zip(big, small, strict=True):
        assert a[0].token_ids == b[0].token_ids
        assert a[0].text == b[0].text
    settled(eng)


def test_seeded_sampling_reproducible_and_batch_invariant(smollm2, prompts):
    params = SamplingParams(max_tokens=10, temperature=0.9, top_p=0.95, top_k=50, seed=1234)
    alone = make_engine(smollm2).generate([prompts[1]], params)[0][0]
    eng = make_engine(smollm2)
    batch = eng.generate([prompts[0], prompts[1], prompts[2]], params)
    assert batch[1][0].token_ids == alone.token_ids
    other = make_engine(smollm2).generate(
        [prompts[1]], SamplingParams(max_tokens=10, temperature=0.9, top_p=0.95, top_k=50, seed=99)
    )[0][0]
    assert other.token_ids != alone.token_ids  # the seed matters
    settled(eng)


def test_stop_strings_and_stop_tokens(smollm2, prompts, alone):
    ref = alone[3]
    assert len(ref.text) > 12
    stop = ref.text[6:9]
    cut = ref.text.index(stop)
    eng = make_engine(smollm2)
    got = eng.generate([prompts[3]], SamplingParams(max_tokens=10, temperature=0, stop=(stop,)))
    assert got[0][0].text == ref.text[:cut]
    assert got[0][0].finish_reason == "stop"
    tok = ref.token_ids[4]
    got = eng.generate(
        [prompts[3]], SamplingParams(max_tokens=10, temperature=0, stop_token_ids=(tok,))
    )
    first = ref.token_ids.index(tok)
    assert got[0][0].token_ids == ref.token_ids[: first + 1]
    assert got[0][0].finish_reason == "stop"
    assert got[0][0].text == smollm2.tokenizer.decode(
        ref.token_ids[:first], skip_special_tokens=True
    )
    settled(eng)


def test_max_tokens_gives_length(smollm2, prompts):
    eng = make_engine(smollm2)
    got = eng.generate([prompts[3]], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    assert got[0][0].finish_reason == "length"
    assert len(got[0][0].token_ids) == 3
    settled(eng)


def test_n_choices_share_the_prompt(smollm2, prompts):
    eng = make_engine(smollm2)
    params = SamplingParams(max_tokens=6, temperature=1.0, seed=7, n=3)
    got = eng.generate([prompts[2]], params)[0]
    assert [c.index for c in got] == [0, 1, 2]
    assert all(c.finish_reason in ("stop", "length") for c in got)
    assert len({tuple(c.token_ids) for c in got}) > 1  # different draws per choice
    # The prompt was prefilled once; the two siblings reused all but its last token.
    assert eng.stats()["radix_hit_tokens"] >= 2 * (len(prompts[2]) - 1)
    assert eng.counters["batched_tokens"] < 2 * len(prompts[2])
    again = make_engine(smollm2).generate([prompts[2]], params)[0]
    assert [c.token_ids for c in again] == [c.token_ids for c in got]  # seeded
    settled(eng)


def test_logprobs_match_a_direct_forward(smollm2, prompts):
    eng = make_engine(smollm2)
    params = SamplingParams(max_tokens=2, temperature=0, logprobs=True, top_logprobs=3)
    got = eng.generate([prompts[0]], params)[0][0]
    assert len(got.logprobs) == len(got.token_ids) == 2
    first = got.logprobs[0]
    runner, p = smollm2.runner, prompts[0]
    pool = runner.make_kv_pool(len(p) + 1)
    logits = runner.forward(ForwardBatch.from_sequences([p], [torch.arange(1, len(p) + 1)]), pool)
    ref = torch.log_softmax(logits[0].double(), dim=-1)
    assert first.token_id == int(ref.argmax()) == got.token_ids[0]
    assert first.logprob == pytest.approx(float(ref.max()), abs=1e-3)
    ids = [t for t, _ in first.top]
    assert ids == ref.topk(3).indices.tolist()
    assert [v for _, v in first.top] == pytest.approx(ref.topk(3).values.tolist(), abs=1e-3)
    settled(eng)


def test_penalties_change_greedy_choice_like_the_formula(smollm2, prompts, alone):
    # With a huge frequency penalty every already-emitted token is pushed down; compute the
    # expected second token from a direct forward with the formula applied by hand.
    ref = alone[1]
    eng = make_engine(smollm2)
    params = SamplingParams(
        max_tokens=2, temperature=0, frequency_penalty=2.0, presence_penalty=2.0
    )
    got = eng.generate([prompts[1]], params)[0][0]
    assert got.token_ids[0] == ref.token_ids[0]
    runner, p = smollm2.runner, prompts[1] + [ref.token_ids[0]]
    pool = runner.make_kv_pool(len(p) + 1)
    logits = runner.forward(ForwardBatch.from_sequences([p], [torch.arange(1, len(p) + 1)]), pool)
    logits = logits.clone()
    logits[0, ref.token_ids[0]] -= 2.0 + 2.0
    assert got.token_ids[1] == int(logits[0].argmax())
    settled(eng)


def test_request_errors(smollm2, prompts):
    eng = make_engine(smollm2, max_model_len=64)
    with pytest.raises(RequestError, match="context length"):
        eng.add_request(prompts[0], SamplingParams(max_tokens=60))
    with pytest.raises(RequestError, match="empty"):
        eng.add_request([], SamplingParams())
    small = make_engine(smollm2, kv_cache_bytes=KVPool.slot_bytes(30, 3, 64, torch.float32) * 40)
    with pytest.raises(RequestError, match="KV cache"):
        small.add_request(prompts[0], SamplingParams(max_tokens=16))
    with pytest.raises(RequestError, match="top_p"):
        SamplingParams(top_p=0)
    settled(eng)


def test_stats_for_metrics(smollm2, prompts):
    eng = make_engine(smollm2)
    before = eng.stats()
    assert before["waiting"] == before["running"] == before["forward_passes"] == 0
    rid = eng.add_request(prompts[0], GREEDY)
    assert eng.stats()["waiting"] == 1
    emitted = sum(len(o.token_ids) for o in eng.step())
    mid = eng.stats()
    assert mid["waiting"] == 0 and mid["running"] == 1 and 0 < mid["kv_usage"] <= 1
    first = eng.run_until_done()[rid][0]
    again = eng.generate([prompts[0]], GREEDY)[0][0]  # the same prompt: served from the tree
    s = eng.stats()
    assert set(before) == set(s)  # every key is always there, for the scraper
    assert s["waiting"] == s["running"] == 0
    assert s["forward_passes"] == s["steps"] == eng.counters["steps"]
    assert s["radix_hit_tokens"] == len(prompts[0]) - 1  # cumulative
    assert s["output_tokens"] == emitted + len(first.token_ids) + len(again.token_ids)
    assert s["radix_cached_tokens"] + s["kv_free_tokens"] == s["kv_capacity_tokens"]
    assert s["forward_passes_per_output_token"] == s["seq_forward_passes"] / s["output_tokens"]
    assert rid not in eng._requests
    settled(eng)


def test_num_threads_defaults_to_the_cores_we_may_use():
    import os

    from corral.engine.serving.config import available_cores

    cores = available_cores()
    assert 1 <= cores <= (os.cpu_count() or 1)
    assert EngineConfig().num_threads == EngineConfig().threads == cores
    assert EngineConfig(num_threads=1).threads == 1
    with pytest.raises(ValueError, match="num_threads"):
        EngineConfig(num_threads=0)
