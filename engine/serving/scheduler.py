"""The scheduler: every policy decision of a step, and nothing else.

Each step it decides which sequences run and how many tokens each feeds, under one token budget
(`EngineConfig.max_batched_tokens`) that it alone owns:

1. running decodes, oldest first: their last token (and any tokens the grammar forced after
   it), plus a jump-forward draft when budget and memory allow. Every decode's own tokens are
   reserved before any draft takes budget, so drafts never starve a younger decode (and a
   draft is dropped, never a reason to preempt);
2. running sequences still prefilling: the next chunk of their prompt (the chunk that reaches
   the end carries the draft, if any). While sequences wait for a seat, a share of the budget
   is held back from these chunks (`admission_reserve`): a short request sent during a long
   chunked prefill is admitted at once and finishes first, instead of waiting for the whole
   prefill;
3. waiting sequences, preempted ones first, then those overtaken `lpm_max_overtakes` times by
   later arrivals (oldest first), then longest cached prefix first: admitted while there is
   budget, a free seat (`max_num_seqs`) and memory for their first chunk. Without the second
   rule a prompt that shares no prefix with a steady stream of requests that do would wait
   for ever. A waiting sequence whose prompt shares at least `SHARED_PREFILL_MIN` more tokens
   with a sequence being prefilled than the prefix cache holds waits until that prefill is
   cached (in-batch prefix sharing: the branches of a fork, sent together, prefill their
   common prefix once).

A sequence whose grammar mask is still being filled for an earlier step (`Sequence.mask_busy`:
its row missed the mask deadline, see `grammar_masks`) sits out until the fill ends; it keeps
its seat and KV and is never picked for preemption meanwhile.

When memory runs out for a running sequence, the radix tree is evicted first (inside
`CacheManager.alloc`); if still short, the most recently admitted running sequence that has not
been scheduled this step is preempted (its KV goes to the tree, its output is kept and it waits to
be recomputed). The oldest sequence can therefore always grow until it finishes: nothing larger
than the whole pool is admitted (`Engine.add_request` rejects it), so there is no deadlock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field

from corral.engine.kvcache.cache_manager import CacheManager
from corral.engine.serving.config import EngineConfig
from corral.engine.serving.core import SeqStatus, Sequence

#: A waiting sequence defers to a running prefill that would give it this many more cached tokens.
SHARED_PREFILL_MIN = 32


@dataclass
class ScheduledSeq:
    """One sequence's share of a step: feed `num_new` tokens (the last `draft_len` of them a
    jump-forward draft); `sample` when the chunk reaches its last token (logits wanted)."""

    seq: Sequence
    num_new: int
    draft_len: int
    sample: bool
    # Overlap scheduling (`engine.overlap`): its KV bookkeeping was done when its step was
    # launched and a placeholder stands for its sampled token; postprocessing only takes that.
    settled: bool = False


@dataclass
class Schedule:
    items: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(i.num_new for i in self.items)


class Scheduler:
    """Waiting queue, running set, and the per-step decision (see module docstring)."""

    def __init__(self, config: EngineConfig, cache: CacheManager) -> None:
        self.config = config
        self.cache = cache
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order
        self._admissions = 0
        self._arrivals = 0
        self._draft_left = 0  # draft tokens this step may still feed (max_step_draft_tokens)
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.queued_at = self._arrivals
        self._arrivals += 1
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(
        self, in_flight: Collection[Sequence] = (), hold: Collection[Sequence] = ()
    ) -> Schedule:
        """The next step's plan. Overlap scheduling (`engine.overlap`) passes the sequences of
        the step still running (`in_flight`: never preempted now) and those of them whose next
        input is not known yet (`hold`: they sit this one out)."""
        plan = Schedule()
        budget = self.config.max_batched_tokens
        self._draft_left = self.config.max_step_draft_tokens
        scheduled: set[int] = {id(s) for s in in_flight}  # never a victim
        hold_ids = {id(s) for s in hold}
        ready = [s for s in self.running if not s.mask_busy and id(s) not in hold_ids]
        decoding = [s for s in ready if not s.prefilling]
        reserved = sum(_own_tokens(s) for s in decoding)  # every decode's token comes first
        for seq in decoding:
            reserved -= _own_tokens(seq)
            if seq.status is SeqStatus.RUNNING and budget > 0:
                budget -= self._schedule_running(seq, budget, budget - reserved, plan, scheduled)
        held = self.admission_reserve(budget)
        for seq in (s for s in ready if s.prefilling):
            room = budget - held
            if seq.status is SeqStatus.RUNNING and room > 0:
                budget -= self._schedule_running(seq, room, room, plan, scheduled)
        self._admit(budget, plan)
        return plan

    def admission_reserve(self, budget: int) -> int:
        """Tokens of `budget` that running prefills leave to the waiting queue this step: what
        its admissible sequences ask for, at most half the budget; 0 when none could be seated
        (a full house, or only n > 1 siblings waiting for their leader)."""
        if not self.waiting or len(self.running) >= self.config.max_num_seqs:
            return 0
        cap, need = budget // 2, 0
        for seq in self.waiting:
            if _leader_ready(seq):
                need += seq.num_tokens
                if need >= cap:
                    return cap
        return need

    # ---- running sequences ---------------------------------------------------------------

    def _schedule_running(
        self, seq: Sequence, budget: int, draft_room: int, plan: Schedule, scheduled: set[int]
    ) -> int:
        """Feed what `seq` lacks KV for (its last token and forced tokens after it, or the next
        prompt chunk, up to `budget`), plus its draft when that reaches the end and fits in
        `draft_room` (with the tokens before it); returns the tokens used."""
        left = seq.num_tokens - seq.num_computed
        n = min(left, budget)
        draft = self._grow_with_draft(seq, n, left, draft_room)
        if draft is None:
            draft = 0
            if not self._grow_or_preempt(seq, n, plan, scheduled):
                return 0
        plan.items.append(ScheduledSeq(seq, n + draft, draft, sample=n == left))
        scheduled.add(id(seq))
        return n + draft

    def _grow_with_draft(self, seq: Sequence, n: int, left: int, budget: int) -> int | None:
        """Allocate `n` tokens plus as much of the draft as fits in `budget` and the step's
        draft allowance (the draft only rides on the chunk that reaches the end, and is dropped
        rather than evicting anything running). Returns the draft length used, or None when not
        even `n` slots could be had."""
        if n < left:
            return 0 if self.cache.grow(seq, n) else None
        draft = max(0, min(len(seq.draft), budget - n, self._draft_left))
        if draft and self.cache.grow(seq, n + draft):
            seq.draft = seq.draft[:draft]
            self._draft_left -= draft
            return draft
        seq.draft = []
        return 0 if self.cache.grow(seq, n) else None

    def _grow_or_preempt(self, seq: Sequence, n: int, plan: Schedule, scheduled: set[int]) -> bool:
        """Allocate `n` slots for `seq`, preempting newer unscheduled sequences as needed;
        preempts `seq` itself (returns False) when nothing else can give way."""
        while not self.cache.grow(seq, n):
            victim = self._victim(seq, scheduled)
            self.preempt(victim, plan)
            if victim is seq:
                return False
        return True

    def _victim(self, seq: Sequence, scheduled: set[int]) -> Sequence:
        for other in reversed(self.running):
            if other is not seq and id(other) not in scheduled and not other.mask_busy:
                return other
        return seq

    def preempt(self, seq: Sequence, plan: Schedule) -> None:
        """Stop `seq`, keep its output, park its KV in the tree; it resumes from the queue."""
        self.cache.release(seq, keep=True)
        self.running.remove(seq)
        seq.status = SeqStatus.WAITING
        seq.draft, seq.num_forced = [], 0
        self.waiting.appendleft(seq)
        plan.preempted.append(seq)
        self.num_preemptions += 1

    # ---- admission -------------------------------------------------------------------------

    def _admit(self, budget: int, plan: Schedule) -> None:
        if not self.waiting or budget <= 0 or len(self.running) >= self.config.max_num_seqs:
            return
        self._order_waiting()
        skipped: list[Sequence] = []
        admitted: list[int] = []  # arrival numbers of the fresh sequences admitted now
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting.popleft()
            if not _leader_ready(seq) or self._shares_a_prefill(seq):
                skipped.append(seq)
                continue
            self.cache.admit(seq)
            left = seq.num_tokens - seq.num_computed
            n = min(left, budget)
            draft = self._grow_with_draft(seq, n, left, budget)
            if draft is None:
                self.cache.release(seq, keep=True)
                self.waiting.appendleft(seq)
                break
            if seq.admitted_at < 0:
                seq.num_cached_tokens = seq.num_computed
                self.cache.hit_tokens += seq.num_computed
                admitted.append(seq.queued_at)
            self._admissions += 1
            seq.admitted_at = self._admissions
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            plan.items.append(ScheduledSeq(seq, n + draft, draft, sample=n == left))
            budget -= n + draft
        self.waiting.extendleft(reversed(skipped))
        for seq in self.waiting if admitted else ():
            if seq.admitted_at < 0:
                seq.overtaken += sum(a > seq.queued_at for a in admitted)

    def _shares_a_prefill(self, seq: Sequence) -> bool:
        """A running sequence is prefilling a prefix of `seq`'s prompt that the tree lacks (by
        at least `SHARED_PREFILL_MIN` tokens): `seq` waits to reuse it rather than compute it
        again. Resumed (preempted) sequences never wait."""
        if not self.cache.prefix_cache or seq.admitted_at >= 0:
            return False
        others = [s for s in self.running if s.prefilling and s.leader is None]
        if not others:
            return False
        cached = self.cache.match_len(seq)
        limit = seq.reuse_limit
        for other in others:
            if (
                _common_prefix(seq.prompt_ids, other.prompt_ids, limit) - cached
                >= SHARED_PREFILL_MIN
            ):
                return True
        return False

    def _order_waiting(self) -> None:
        """Preempted sequences first (in their order), then the sequences overtaken too often
        (oldest first), then longest cached prefix first."""
        if len(self.waiting) < 2 or len(self.waiting) > self.config.lpm_queue_limit:
            return
        resumed = [s for s in self.waiting if s.admitted_at >= 0]
        fresh = [s for s in self.waiting if s.admitted_at < 0]
        if self.cache.prefix_cache and len(fresh) > 1:
            limit = self.config.lpm_max_overtakes
            starved = sorted((s for s in fresh if s.overtaken >= limit), key=lambda s: s.queued_at)
            rest = [s for s in fresh if s.overtaken < limit]
            rest.sort(key=lambda s: -self.cache.match_len(s))  # stable: FCFS among equals
            fresh = starved + rest
        self.waiting = deque(resumed + fresh)

    def finish(self, seq: Sequence) -> None:
        """Drop a finished (or aborted) sequence from the running set or the queue."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)


def _own_tokens(seq: Sequence) -> int:
    """What a decode feeds before any draft: its last sampled token and the forced ones after."""
    return seq.num_tokens - seq.num_computed


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _leader_ready(seq: Sequence) -> bool:
    """n > 1: a sibling waits until its leader's prompt is in the tree, to share its KV."""
    lead = seq.leader
    if lead is None or lead.finished:
        return True
    return lead.status is SeqStatus.RUNNING and lead.prefix_len >= len(lead.prompt_ids)
