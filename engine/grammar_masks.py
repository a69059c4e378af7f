"""Grammar masks in the step loop: filled by worker threads during the forward pass.

Masks. Every constrained logits row gets one bitmask row (`int32[R, ceil(V/32)]`, the
project-wide format). The matchers fill them on `EngineConfig.mask_threads` worker threads
while the stepping thread runs the model (the grammar backends release the GIL while they
compute a mask); the sampler waits for them, then `mask_kernels` applies them. Jobs (one per
sequence, with its draft rows) are claimed one at a time from a shared counter, so a slow
matcher holds up only its own job while another thread is free. The stepping thread never
fills (a slow fill there would hold the step past its deadline) and touches no matcher whose
fill is in flight.

Deadline (`EngineConfig.mask_grace_ms`). A row whose mask is not ready when the logits are,
plus the grace, sits the step out instead of stalling the batch: its logits are dropped and
its sequence runs again (`Engine` keeps the KV of all but its last fed token). A row is never
sampled without its mask. A fill still running at the deadline goes on; its sequence is
`mask_busy` (the scheduler skips it) until the fill ends, and the masks it made wait in
`seq.late_mask` for the next step, which then only copies them: a mask too slow for one step
does not keep missing the next. Sequences that sat out are filled first next time.

Jump-forward drafts (see `jump_forward`) get one mask row per draft position. The verification
rows' masks are filled by accepting the draft tokens one by one (each row is
the mask *after* the draft tokens before it) and rolling the matcher back afterwards.

Matcher failures (the `Matcher.error`/`recover` contract). A backend that hits a runtime limit
enters a sticky error state. After every fill, and after every refused accept, the matcher is
asked for `error()`; if set, it is rebuilt and replayed (`recover()`) once and the operation is
retried; if it is still in error, the sequence cannot continue under its constraint and
`SequenceFailed("constraint_failed")` is raised. On the mask thread the failure (or any other
exception of one sequence's matcher) is recorded on the sequence (`seq.failure`) and its rows
are filled with "everything allowed" so the batch samples normally; the step then fails that
sequence instead of taking its token.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import torch

from corral.engine.core import EngineFailure, Sequence, SequenceFailed

if TYPE_CHECKING:
    from corral.grammar.matcher import Matcher

T = TypeVar("T")


@dataclass
class MaskJob:
    """Fill bitmask rows `first_row ...` for `seq`: its current state, then after each draft."""

    seq: Sequence
    draft: list[int]
    first_row: int


@dataclass(frozen=True)
class LateMask:
    """The rows a fill made after its step's deadline: `rows[i]` is the mask after `draft[:i]`
    (valid while the matcher has not moved, i.e. until the sequence's next step)."""

    draft: tuple[int, ...]
    rows: torch.Tensor


class MaskFill:
    """One step's masks being filled: jobs claimed in turn by the worker threads."""

    def __init__(
        self,
        jobs: list[MaskJob],
        bitmask: torch.Tensor,
        fault: Exception | None,
        late_done: threading.Event,
    ) -> None:
        """`late_done` is set whenever a late fill ends (its sequence can be scheduled again)."""
        # Sequences that sat out a step go first: a mask that is slow once is not late twice.
        self.jobs = sorted(jobs, key=lambda j: -j.seq.mask_deferrals)
        self.bitmask = bitmask
        self._fault = fault
        self._next = 0  # jobs[:_next] are claimed
        self._done = [False] * len(jobs)
        self._num_done = 0
        self._closed = False  # the step stopped waiting: claim nothing more
        self._deadline = float("inf")  # `perf_counter` time past which nothing new starts
        self._cv = threading.Condition()
        self._late_done = late_done

    @property
    def stragglers(self) -> bool:
        """Fills still running past the deadline (they write into `bitmask` later)."""
        return self._num_done < self._next

    def work(self) -> None:
        """Fill jobs until none is left to claim (a worker thread's task)."""
        while True:
            with self._cv:
                if self._closed or self._next == len(self.jobs):
                    return
                if time.perf_counter() >= self._deadline:
                    return  # too late to start: leave the GIL to the waiting step
                i = self._next
                self._next += 1
            self._run(i)

    def wait(self, grace_s: float | None) -> list[MaskJob]:
        """Wait for the fills for up to `grace_s` (None: as long as they take). Returns the
        jobs whose rows must sit this step out; from here on no more jobs start, and the late
        ones still running mark their sequences `mask_busy`."""
        with self._cv:
            if grace_s is not None:
                self._deadline = time.perf_counter() + grace_s
            self._cv.wait_for(lambda: self._num_done == len(self.jobs), grace_s)
            self._closed = True
            late = [job for i, job in enumerate(self.jobs) if not self._done[i]]
            for i in range(self._next):
                if not self._done[i]:
                    self.jobs[i].seq.mask_busy = True
        return late

    def _run(self, i: int) -> None:
        job = self.jobs[i]
        _fill_guarded(job, self.bitmask, self._fault if i == 0 else None)
        with self._cv:
            self._done[i] = True
            self._num_done += 1
            if self._closed:  # too late for its step: keep the masks for the next one
                end = job.first_row + len(job.draft) + 1
                job.seq.late_mask = LateMask(tuple(job.draft), self.bitmask[job.first_row : end])
                job.seq.mask_busy = False
                self._late_done.set()
            elif self._num_done == len(self.jobs):
                self._cv.notify_all()  # the step waits for all of them, not for each


class MaskFiller:
    """Fills grammar masks on `threads` worker threads, overlapped with the forward pass.

    For a CUDA model the masks are filled into pinned host memory, so the sampler's copy to the
    device is one asynchronous transfer. Two buffers alternate: a step's copy has finished by the
    time the step after next fills the same buffer (every step ends by reading its sampled
    tokens back, which waits for the copy). A buffer that late fills still write into is given
    up (a new one is made in its place).
    """

    def __init__(
        self, vocab_size: int, device: torch.device | None = None, threads: int = 1
    ) -> None:
        self.words = (vocab_size + 31) // 32
        self.threads = threads
        self._pinned = device is not None and device.type == "cuda"
        self._buffers = [torch.empty(0, self.words, dtype=torch.int32) for _ in range(2)]
        self._turn = 0
        self.late_done = threading.Event()  # a late fill ended (`MaskFill`)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="corral-mask")

    def start(self, jobs: list[MaskJob], num_rows: int, fault: Exception | None = None) -> MaskFill:
        """Begin filling an `int32[num_rows, W]` bitmask (`MaskFill.wait`, then its `bitmask`).
        `fault` (tests, `engine.faults`) is raised inside the first job's fill."""
        fill = MaskFill(jobs, self._buffer(num_rows), fault, self.late_done)
        for _ in range(min(self.threads, len(jobs))):
            self._pool.submit(fill.work)
        return fill

    def wait(self, fill: MaskFill, grace_s: float | None) -> list[MaskJob]:
        """`fill.wait(grace_s)`; a buffer that late fills still write into is not reused."""
        late = fill.wait(grace_s)
        if fill.stragglers and self._pinned:
            self._buffers[self._turn] = torch.empty(0, self.words, dtype=torch.int32)
        return late

    def _buffer(self, rows: int) -> torch.Tensor:
        if not self._pinned:
            return torch.empty(rows, self.words, dtype=torch.int32)
        self._turn = 1 - self._turn
        buf = self._buffers[self._turn]
        if buf.shape[0] < rows:  # grows to the largest step seen, in powers of two
            size = 1 << max(rows - 1, 1).bit_length()
            buf = torch.empty(size, self.words, dtype=torch.int32, pin_memory=True)
            self._buffers[self._turn] = buf
        return buf[:rows]

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def constraint_failed(message: str) -> SequenceFailed:
    return SequenceFailed(EngineFailure("constraint_failed", message))


def _unrecoverable(error: str) -> SequenceFailed:
    # Backends append their whole state and grammar to the message: the first line says why.
    lines = error.strip().splitlines()
    why = lines[0][:300] if lines else "the matcher is in an error state"
    return constraint_failed(f"the grammar matcher failed and could not be rebuilt: {why}")


def fill_checked(matcher: Matcher, bitmask: torch.Tensor, row: int) -> None:
    """Fill `bitmask[row]` (all ones when everything is allowed), recovering a matcher in error
    once; raises `SequenceFailed` when it stays in error."""
    _recovering(matcher, lambda: _fill_row(matcher, bitmask, row))


def accept_checked(matcher: Matcher, token: int) -> bool:
    """`matcher.accept(token)`, recovering a matcher in error once. False: the grammar refused
    the token (a state, no error); raises `SequenceFailed` when the matcher stays in error."""
    if matcher.accept(token):  # the common case asks for no error state
        return True
    return _recovering(matcher, lambda: matcher.accept(token), done=True)


def _recovering(matcher: Matcher, op: Callable[[], T], done: bool = False) -> T | bool:
    """Run `op` (unless `done`: it just ran and returned False), then check the matcher's error
    state; in error, `recover()` once and run `op` again. The `Matcher.error`/`recover`
    contract in one place for every matcher operation the step makes."""
    result = False if done else op()
    error = matcher.error()
    if error is None:
        return result
    if matcher.recover():
        result = op()
        error = matcher.error()
        if error is None:
            return result
    raise _unrecoverable(error)


def _fill_guarded(job: MaskJob, bitmask: torch.Tensor, fault: Exception | None) -> None:
    """Fill `job`'s rows; a failure of its matcher is recorded on its sequence (module
    docstring) and never escapes."""
    try:
        if fault is not None:
            raise fault
        _fill_job(job, bitmask)
    except SequenceFailed as e:
        _fail_job(job, bitmask, e.failure)
    except Exception as e:  # one sequence's matcher broke: that sequence fails, not the step
        failure = EngineFailure("sequence_failed", f"filling the grammar mask failed: {e!r}")
        _fail_job(job, bitmask, failure)


def _fill_job(job: MaskJob, bitmask: torch.Tensor) -> None:
    m = job.seq.matcher
    row, last = job.first_row, job.first_row + len(job.draft)
    late, job.seq.late_mask = job.seq.late_mask, None
    if late is not None and late.draft[: len(job.draft)] == tuple(job.draft):
        bitmask[row : last + 1] = late.rows[: len(job.draft) + 1]  # made after a deadline
        return
    fill_checked(m, bitmask, row)
    accepted = 0
    for tok in job.draft:
        if not accept_checked(m, tok):  # drafts were checked when made; stay safe anyway
            break
        accepted += 1
        row += 1
        fill_checked(m, bitmask, row)
    if row < last:
        # Rows after a refused draft token are never taken (that token is masked out in the
        # row before); keep them defined.
        bitmask[row + 1 : last + 1].fill_(-1)
    m.rollback(accepted)


def _fail_job(job: MaskJob, bitmask: torch.Tensor, failure: EngineFailure) -> None:
    job.seq.failure = failure
    bitmask[job.first_row : job.first_row + len(job.draft) + 1].fill_(-1)


def _fill_row(matcher: Matcher, bitmask: torch.Tensor, row: int) -> None:
    if not matcher.fill_mask(bitmask, row):
        bitmask[row].fill_(-1)  # every token allowed
