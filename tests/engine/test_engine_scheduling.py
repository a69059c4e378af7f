"""Scheduling policy: a long chunked prefill does not hold up a short request; drafts never take
a younger decode's token; the per-step mask deadline defers a late row, never the whole step.

The model is the tiny random Llama with SmolLM2's real tokenizer (its logits are meaningless
but deterministic, which is all a scheduling test needs); constraints are compiled for real.
Expected outputs come from another run of the same engine without the condition under test.
"""

from __future__ import annotations

import threading

import pytest
import torch
from engine_helpers import chat, make_engine

from corral.engine import SamplingParams
from corral.engine.kvcache.cache_manager import CacheManager
from corral.engine.kvcache.kv_pool import KVPool
from corral.engine.serving.config import EngineConfig
from corral.engine.serving.core import Sequence
from corral.engine.serving.scheduler import Scheduler
from corral.grammar import ConstraintSpec, TokenizerInfo, compile_constraint

GREEDY = SamplingParams(max_tokens=12, temperature=0)
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "pop": {"type": "integer"}},
    "required": ["city", "pop"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def city(tiny_model):
    info = TokenizerInfo.from_hf(
        tiny_model.tokenizer,
        vocab_size=tiny_model.vocab_size,
        eos_token_ids=tiny_model.eos_token_ids,
    )
    return compile_constraint(ConstraintSpec.json_schema(CITY), info)


def _seq(prompt: list[int]) -> Sequence:
    return Sequence("r", 0, prompt, SamplingParams(max_tokens=50), seed=0)


def settled(eng) -> None:
    eng.check_integrity()
    assert not eng.live_sequences()
    assert eng.cache.radix.protected_size == 0


# ---- a long prefill does not hold up a short request ---------------------------------------


def test_short_request_finishes_before_a_long_prefill(tiny_model):
    eng = make_engine(tiny_model, max_batched_tokens=64, max_num_seqs=8)
    words = chat(tiny_model, "tell me a long story " * 300)[:1800]  # ~28 chunks of 64
    long_id = eng.add_request(words, SamplingParams(max_tokens=2, temperature=0))
    eng.step()  # the long prefill is running
    short_id = eng.add_request(chat(tiny_model, "Hi"), SamplingParams(max_tokens=3, temperature=0))
    finished: list[str] = []
    while eng.has_unfinished():
        finished += [o.request_id for o in eng.step() if o.finish_reason is not None]
    # Before the admission reserve the short one waited for all ~28 chunks, then lost the race.
    assert finished == [short_id, long_id]
    settled(eng)


def test_admission_reserve_is_capped_and_only_for_seatable_requests():
    pool = KVPool(1, 1, 2, num_slots=4096)
    config = EngineConfig(max_batched_tokens=64, max_num_seqs=2, num_threads=1)
    sched = Scheduler(config, CacheManager(pool))
    assert sched.admission_reserve(64) == 0  # nothing waits
    sched.add(_seq(list(range(1, 11))))
    assert sched.admission_reserve(64) == 10  # what it asks for
    sched.add(_seq(list(range(1, 500))))
    assert sched.admission_reserve(64) == 32  # at most half the budget
    sched.schedule()
    assert len(sched.running) == 2  # a full house: no seat, so no reserve
    sched.add(_seq([5, 6, 7]))
    assert sched.admission_reserve(64) == 0


# ---- the longest-prefix-first queue starves nobody ----------------------------------------


@pytest.mark.parametrize("limit", [0, 3, 8])
def test_a_prompt_without_a_cached_prefix_is_not_starved(tiny_model, limit):
    """Found by the soak (`bench/soak.py`): a completions prompt sharing nothing with the chat
    traffic waited over 300 s while later chat requests, whose prefix was cached, kept going
    first. Now at most `lpm_max_overtakes` later arrivals go before it."""
    eng = make_engine(tiny_model, max_num_seqs=1, lpm_max_overtakes=limit)
    shared = chat(tiny_model, "Tell me about the weather in Oslo and in Bergen, please.")
    quick = SamplingParams(max_tokens=2, temperature=0)
    eng.add_request(shared, quick)
    while eng.has_unfinished():
        eng.step()  # the shared prefix is in the radix tree now
    lonely = eng.add_request([7, 8, 9, 10, 11], quick)
    rivals = [eng.add_request(shared + [100 + k], quick) for k in range(2)]
    done: list[str] = []
    while lonely not in done and len(done) < 30:
        for out in eng.step():
            if out.finish_reason is not None:
                done.append(out.request_id)
                if out.request_id != lonely:  # one more rival with the longer match waits
                    rivals.append(eng.add_request(shared + [200 + len(rivals)], quick))
    assert lonely in done, "starved: every later rival went first"
    assert done.index(lonely) <= limit + 1  # the one running when it arrived, then `limit`
    while eng.has_unfinished():
        eng.step()
    settled(eng)


# ---- drafts never starve a decode ------------------------------------------------------------


def _decoding(sched: Scheduler, seqs: list[Sequence]) -> None:
    """Admit and prefill `seqs`, then give each one sampled token (as `Engine` would)."""
    for s in seqs:
        sched.add(s)
    while any(s.num_computed < s.num_tokens for s in seqs):
        for item in sched.schedule().items:
            item.seq.num_computed += item.num_new
    for s in seqs:
        s.output_ids.append(7)


def test_every_decode_gets_its_token_before_any_draft():
    pool = KVPool(1, 1, 2, num_slots=256)
    config = EngineConfig(max_batched_tokens=8, max_num_seqs=4, num_threads=1)
    sched = Scheduler(config, CacheManager(pool))
    old, young, younger = _seq([1, 2, 3]), _seq([4, 5]), _seq([6])
    _decoding(sched, [old, young, younger])
    old.draft = [9] * 20  # a long jump-forward draft on the oldest decode
    plan = sched.schedule()
    fed = {id(i.seq): (i.num_new, i.draft_len) for i in plan.items}
    assert fed[id(young)] == (1, 0) and fed[id(younger)] == (1, 0)
    assert fed[id(old)] == (1 + 5, 5)  # the draft took only what the decodes left
    assert plan.num_tokens == 8


def test_step_draft_allowance_caps_draft_tokens():
    pool = KVPool(1, 1, 2, num_slots=256)
    config = EngineConfig(
        max_batched_tokens=64, max_num_seqs=4, max_step_draft_tokens=6, num_threads=1
    )
    sched = Scheduler(config, CacheManager(pool))
    a, b = _seq([1, 2]), _seq([3, 4])
    _decoding(sched, [a, b])
    a.draft, b.draft = [9] * 4, [9] * 4
    drafts = [i.draft_len for i in sched.schedule().items]
    assert drafts == [4, 2]


# ---- the per-step mask deadline --------------------------------------------------------------


class SlowOnce:
    """A real matcher whose `nth` fill on a mask worker thread blocks until the test releases
    it: fault injection through the engine's real fill path (everything else is the wrapped
    matcher's). A step that waited for it would only return once the fill gave up after
    `timeout` seconds, so no timing of the machine enters the test."""

    def __init__(self, inner, nth: int, timeout: float = 60.0) -> None:
        self._inner, self._nth, self._timeout = inner, nth, timeout
        self.fills = 0
        self.blocked = threading.Event()  # the slow fill has begun
        self.release = threading.Event()  # set by the test
        self.released = None  # whether the test released it (False: it gave up waiting)

    def fill_mask(self, bitmask: torch.Tensor, row: int) -> bool:
        if threading.current_thread().name.startswith("corral-mask"):
            self.fills += 1
            if self.fills == self._nth:
                self.blocked.set()
                self.released = self.release.wait(self._timeout)
        return self._inner.fill_mask(bitmask, row)

    def native_cursor(self) -> None:
        return None  # its own (slow) fill must run, not a native batch fill of the inner cursor

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("jump_forward", [False, True])
def test_a_slow_mask_defers_only_its_own_row(tiny_model, city, jump_forward, overlap):
    prompts = [chat(tiny_model, q) for q in ("A city.", "Another city.", "Say hi.")]
    constraints = [city, city, None]
    settings = dict(mask_threads=2, mask_grace_ms=50.0, jump_forward=jump_forward, overlap=overlap)
    expected = make_engine(tiny_model, **settings).generate(prompts, GREEDY, constraints)

    eng = make_engine(tiny_model, **settings)
    rids = [eng.add_request(p, GREEDY, c) for p, c in zip(prompts, constraints, strict=True)]
    slow = next(s for s in eng.live_sequences() if s.request_id == rids[0])
    slow.matcher = SlowOnce(slow.matcher, nth=3)
    results: dict[str, list[int]] = {r: [] for r in rids}
    deferred_while_blocked = False  # a step returned, its row deferred, the fill still blocked
    while eng.has_unfinished():
        for out in eng.step():
            results[out.request_id] += out.token_ids
        blocked = slow.matcher.blocked.is_set() and not slow.matcher.release.is_set()
        if blocked and slow.mask_deferrals:
            deferred_while_blocked = True
            slow.matcher.release.set()
    assert slow.matcher.fills >= 3  # the slow fill happened
    assert slow.matcher.released is True, "a step waited for the slow mask"
    assert deferred_while_blocked
    assert slow.mask_deferrals == 1  # after the late fill, its masks were ready next step
    assert eng.counters["mask_deferrals"] == 1  # nobody else sat out
    for rid, want in zip(rids, expected, strict=True):
        assert results[rid] == want[0].token_ids  # the deferral changed no token
    settled(eng)
