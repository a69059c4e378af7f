"""Overlap scheduling (`EngineConfig.overlap`): the host prepares step n+1 while the model runs it.

The synchronous step is schedule -> forward -> sample -> read back -> postprocess, one after the
other. With overlap (as SGLang's zero-overhead scheduler and mini-sglang's `overlap_loop`), one
call of `Engine.step` does, on two threads:

    host thread                                   device thread ("corral-device")
    schedule n+1 (n's tokens are placeholders)
    inputs of n+1 ------------------------------> forward n+1 (n's tokens read on the device)
    read back n, postprocess n (accept into the
      matchers, finish, jump-forward, emit)
    fill the masks of n+1 (worker threads)
    wait for the logits, then the masks (deadline)
    ------------------------------------------->  sample n+1 (stays on the device)
    return n's outputs

So the matchers advance as soon as n's ids arrive and n+1's masks are filled in the gap while
the model runs. A sequence sampled in step n without a draft gets exactly one token, so it is
scheduled for n+1 at once: its KV bookkeeping is done when n is launched (`ScheduledSeq.settled`)
and a placeholder (`PENDING`) stands for its token in `output_ids` until n is read back. Its
row in n+1 is dropped (the fed token's KV is kept) when n's postprocessing finished it or
appended forced tokens after it (jump-forward), since n+1 then sampled the wrong position. A
sequence whose step n carried a draft (how many tokens it gets is unknown) sits n+1 out, and
sequences still in flight are never preempted. A draft made in n's postprocessing for a sequence
already scheduled in n+1 is dropped. Outputs are the same as without overlap, token for token:
nothing here changes what a row samples, only when.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from corral.engine.serving.config import IDLE_WAIT_S
from corral.engine.serving.core import Output, Sequence
from corral.engine.serving.sampler import DeviceSample, ReadBack, RowSpec
from corral.engine.serving.scheduler import Schedule, ScheduledSeq
from corral.engine.serving.step_inputs import StepRows, step_inputs

if TYPE_CHECKING:
    from corral.engine.execution.batch import ForwardBatch
    from corral.engine.serving.engine import Engine

PENDING = -1  # stands in `output_ids` for a sampled token not read back yet


@dataclass
class Launched:
    """A step whose tokens are sampled on the device but not read back: `plan` holds the items
    postprocessing takes (their rows, in order), `rows` each settled sequence's row."""

    plan: Schedule
    drawn: DeviceSample
    read_back: ReadBack
    rows: dict[Sequence, int]

    @property
    def tokens(self) -> torch.Tensor:
        return self.drawn.result.tokens


class OverlapLoop:
    """`Engine.step` with overlap scheduling (module docstring)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.launched: Launched | None = None
        self.undelivered: list[Output] = []  # postprocessed when a later part of the step failed
        self._device = ThreadPoolExecutor(max_workers=1, thread_name_prefix="corral-device")

    def step(self) -> list[Output]:
        e, prev = self.engine, self.launched
        self.launched = None
        in_flight = [i.seq for i in prev.plan.items] if prev is not None else []
        hold = [i.seq for i in prev.plan.items if not i.settled] if prev is not None else []
        e.masks.late_done.clear()
        plan = e.scheduler.schedule(in_flight, hold)
        if not plan.items:
            outputs = self._postprocess(prev)
            if prev is None and e.scheduler.running:  # all wait for late mask fills
                e.masks.late_done.wait(IDLE_WAIT_S)
            return outputs
        e._batches += 1
        if e.faults:
            e.faults.fire("step", e._batches)
        batch, rows = step_inputs(plan)
        batch.pending = _pending(plan, prev)
        prev_tokens = prev.tokens if prev is not None else None
        forward = self._device.submit(self._forward, batch, prev_tokens)
        try:
            outputs = self._postprocess(prev)
        except BaseException:
            forward.exception()  # let the device thread finish before anything is reset
            raise
        settled = prev.rows if prev is not None else {}
        void = {i.seq for i in plan.items if i.seq in settled and _void(i)}
        rows.jobs = [j for j in rows.jobs if j.seq not in void]  # their rows are dropped
        try:
            self.launched = self._launch(plan, rows, void, forward)
        except BaseException:  # the engine restarts: n's outputs still go out (`fail_all`)
            self.undelivered += outputs
            raise
        e.counters["steps"] += 1
        e.counters["batched_tokens"] += batch.num_tokens
        return outputs

    def _launch(
        self, plan: Schedule, rows: StepRows, void: set[Sequence], forward: Future[torch.Tensor]
    ) -> Launched | None:
        """Fill n+1's masks, wait for its logits and the masks, sample it on the device."""
        e = self.engine
        fill = e.masks.start(rows, e._batches)
        try:
            logits = forward.result()
        except BaseException:  # never leave fills running on matchers past a failed forward
            e.masks.settle(fill)
            raise
        sitting_out = e.masks.late(fill)
        drop = sitting_out | void
        drawn, rows = self._device.submit(e.masks.draw, logits, rows, fill, drop).result()
        return self._settle(plan, void, sitting_out, drawn, rows.specs)

    def _forward(self, batch: ForwardBatch, prev_tokens: torch.Tensor | None) -> torch.Tensor:
        e = self.engine
        e._bind_threads()
        return e.runner.forward(batch, e.pool, prev_tokens)

    def _postprocess(self, prev: Launched | None) -> list[Output]:
        """Read back step n and postprocess it (settled items only take their token)."""
        if prev is None:
            return []
        tokens, logprobs = prev.read_back.result()
        return self.engine._postprocess(prev.plan, tokens, logprobs, set())

    def _settle(
        self,
        plan: Schedule,
        void: set[Sequence],
        sitting_out: set[Sequence],
        drawn: DeviceSample | None,
        specs: list[RowSpec],
    ) -> Launched | None:
        """Do now what postprocessing would do for each item without its tokens; returns the
        step for the next call to read back and postprocess (None when nothing was sampled)."""
        e = self.engine
        taken: list[ScheduledSeq] = []
        rows: dict[Sequence, int] = {}
        row = 0
        for item in plan.items:
            seq = item.seq
            if seq.finished:
                continue
            if seq in sitting_out:
                e.masks.sit_out(item)
                continue
            if seq in void or not item.sample:  # all it fed has KV; nothing to sample
                seq.forward_passes += 1
                e.counters["seq_forward_passes"] += 1
                seq.num_computed += item.num_new
                continue
            if item.draft_len == 0:  # exactly one token comes: schedulable before it does
                seq.num_computed += item.num_new
                seq.output_ids.append(PENDING)
                item.settled = True
                rows[seq] = row
                _drop_stale_draft(seq)
            taken.append(item)
            row += item.draft_len + 1
        if drawn is None:
            return None
        return Launched(Schedule(taken), drawn, ReadBack(drawn, specs), rows)

    def has_work(self) -> bool:
        return self.launched is not None

    def reset(self) -> None:
        self.launched = None
        self.undelivered = []

    def close(self) -> None:
        self._device.shutdown(wait=True)


def _void(item: ScheduledSeq) -> bool:
    """Its input was step n's token, but n's postprocessing ended it or appended forced tokens
    after that token: the row sampled the wrong position (or nothing)."""
    return item.seq.finished or item.seq.num_forced > 0


def _drop_stale_draft(seq: Sequence) -> None:
    """Drop the draft n's postprocessing made for `seq`, now settled in n+1: it continues n's
    token, but the next step feeds it after n+1's token (a placeholder until then). Fed there,
    it would also be verified against the draft n+1's postprocessing makes, not against itself,
    and the KV of a rejected draft token would be counted as computed. So the draft a step feeds
    is always the one its postprocessing verifies."""
    seq.draft, seq.draft_hint, seq.draft_lookup_from = [], None, 0


def _pending(plan: Schedule, prev: Launched | None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Where step n's tokens go in step n+1's input ids: each settled sequence's first fed
    token (its placeholder) comes from its row of n."""
    if prev is None or not prev.rows:
        return None
    at, rows, start = [], [], 0
    for item in plan.items:
        row = prev.rows.get(item.seq)
        if row is not None:
            at.append(start)
            rows.append(row)
        start += item.num_new
    if not at:
        return None
    return torch.tensor(at, dtype=torch.int64), torch.tensor(rows, dtype=torch.int64)
