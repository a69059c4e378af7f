"""Grammar masks in the step loop: filled by worker threads during the forward pass.

Masks. Every constrained logits row gets one bitmask row (`int32[R, ceil(V/32)]`, the
project-wide format). The matchers fill them on `EngineConfig.mask_threads` worker threads
while the stepping thread runs the model (the grammar backends release the GIL while they
compute a mask); the sampler waits for them, then `mask_kernels` applies them. Jobs (one per
sequence, with its draft rows) are claimed in units from a shared counter, so a slow matcher
holds up only its own unit while another thread is free. A unit is one job, or a chunk of
rows (no draft) that the grammar layer fills in one native batch call (`MaskBatchFiller`, for
the matchers it `batched`, i.e. llguidance's: one GIL release and no Python per row but each
row's refinement; measured in `bench/masks.py`); every other job (drafts, xgrammar) fills on
its own. The engine never holds a backend object. The stepping thread never fills (a slow fill
there would hold the step past its deadline) and touches no matcher whose fill is in flight.

Deadline (`EngineConfig.mask_grace_ms`). A row whose mask is not ready when the logits are,
plus the grace, sits the step out (a native chunk's rows all together) instead of stalling the
batch: its logits are dropped and its sequence runs again (`Engine` keeps the KV of all but its
last fed token). A row is never sampled without its mask. A fill still running at the deadline
goes on; its sequence is `mask_busy` (the scheduler skips it) until the fill ends, and the
masks it made wait in `seq.late_mask` for the next step, which then only copies them: a mask
too slow for one step does not keep missing the next. Sequences that sat out are filled first
next time.

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

from corral.engine.serving.core import EngineFailure, Sequence, SequenceFailed
from corral.grammar import MaskBatchFiller, fill_row

if TYPE_CHECKING:
    from corral.grammar.core.matcher import Matcher

T = TypeVar("T")

# Plain rows per native batch call (`_fill_batch`): large enough that the calls' Python
# overhead is small next to the masks, small enough that a late chunk defers few rows (a unit
# is late as a whole) and that the worker threads share a step's chunks.
NATIVE_CHUNK = 16


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
    """One step's masks being filled: units of work claimed in turn by the worker threads.

    A unit is one job, or a chunk of up to `NATIVE_CHUNK` plain jobs filled by one native batch
    call (`_units`). A unit is late, or on time, as a whole.
    """

    def __init__(
        self,
        jobs: list[MaskJob],
        bitmask: torch.Tensor,
        fault: Exception | None,
        late_done: threading.Event,
        batch: MaskBatchFiller | None = None,
    ) -> None:
        """`late_done` is set whenever a late fill ends (its sequence can be scheduled again);
        `batch`: the grammar layer's batch fill, for the chunks of plain rows (None: every job
        on its own)."""
        # Sequences that sat out a step go first: a mask that is slow once is not late twice.
        jobs = sorted(jobs, key=lambda j: -j.seq.mask_deferrals)
        self.units = _units(jobs, fault is not None, batch)
        self.bitmask = bitmask
        self._fault = fault
        self._batch = batch
        self._next = 0  # units[:_next] are claimed
        self._done = [False] * len(self.units)
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
        """Fill units until none is left to claim (a worker thread's task)."""
        while True:
            with self._cv:
                if self._closed or self._next == len(self.units):
                    return
                if time.perf_counter() >= self._deadline:
                    return  # too late to start: leave the GIL to the waiting step
                i = self._next
                self._next += 1
            self._run(i)

    def wait(self, grace_s: float | None) -> list[MaskJob]:
        """Wait for the fills for up to `grace_s` (None: as long as they take). Returns the
        jobs whose rows must sit this step out; from here on no more units start, and the late
        ones still running mark their sequences `mask_busy`."""
        with self._cv:
            if grace_s is not None:
                self._deadline = time.perf_counter() + grace_s
            self._cv.wait_for(lambda: self._num_done == len(self.units), grace_s)
            self._closed = True
            late = [
                job for i, unit in enumerate(self.units) if not self._done[i] for job in unit.jobs
            ]
            for i in range(self._next):
                if not self._done[i]:
                    for job in self.units[i].jobs:
                        job.seq.mask_busy = True
        return late

    def _run(self, i: int) -> None:
        unit = self.units[i]
        if unit.native:
            _fill_batch(unit.jobs, self.bitmask, self._batch)
        else:
            _fill_guarded(unit.jobs[0], self.bitmask, self._fault if i == 0 else None)
        with self._cv:
            self._done[i] = True
            self._num_done += 1
            if self._closed:  # too late for its step: keep the masks for the next one
                for job in unit.jobs:
                    end = job.first_row + len(job.draft) + 1
                    job.seq.late_mask = LateMask(
                        tuple(job.draft), self.bitmask[job.first_row : end]
                    )
                    job.seq.mask_busy = False
                self._late_done.set()
            elif self._num_done == len(self.units):
                self._cv.notify_all()  # the step waits for all of them, not for each


@dataclass
class _Unit:
    """What one worker claims at once: one job, or (`native`) a chunk of plain jobs filled by
    one native batch call."""

    jobs: list[MaskJob]
    native: bool = False


def _units(jobs: list[MaskJob], fault: bool, batch: MaskBatchFiller | None) -> list[_Unit]:
    """`jobs` as units: plain jobs (`_plain`) in chunks of up to `NATIVE_CHUNK` when there is
    a `batch` fill, every other job alone (the first one too when a `fault` is to be raised in
    it)."""
    units: list[_Unit] = []
    chunk: _Unit | None = None
    for k, job in enumerate(jobs):
        if batch is None or (fault and k == 0) or not _plain(job, batch):
            units.append(_Unit([job]))
            continue
        if chunk is None or len(chunk.jobs) == NATIVE_CHUNK:
            chunk = _Unit([], native=True)
            units.append(chunk)
        chunk.jobs.append(job)
    if fault:  # (tests) the fault stays in unit 0
        return units
    # Longest first, within a deferral class: the chunks, then the single jobs that even out
    # the threads' loads at the end.
    return sorted(units, key=lambda u: (-u.jobs[0].seq.mask_deferrals, not u.native))


def _plain(job: MaskJob, batch: MaskBatchFiller) -> bool:
    """A job the native batch call can fill: one row of a matcher the grammar layer batches
    (`MaskBatchFiller.batched`), no late masks."""
    seq = job.seq
    return not job.draft and seq.late_mask is None and batch.batched(seq.matcher)


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
        self._batch = MaskBatchFiller(threads)

    def start(self, jobs: list[MaskJob], num_rows: int, fault: Exception | None = None) -> MaskFill:
        """Begin filling an `int32[num_rows, W]` bitmask (`MaskFill.wait`, then its `bitmask`).
        `fault` (tests, `engine.faults`) is raised inside the first job's fill."""
        fill = MaskFill(jobs, self._buffer(num_rows), fault, self.late_done, self._batch)
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
    _recovering(matcher, lambda: fill_row(matcher, bitmask, row))


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


def _fill_batch(jobs: list[MaskJob], bitmask: torch.Tensor, batch: MaskBatchFiller) -> None:
    """Fill plain jobs' rows in one native batch call (`_plain`): the GIL is released once
    for all of them, and the backend's own threads share the rows. Then the per-row contract:
    a row the batch did not fill (its matcher in its error state, or the batch call refused as
    a whole) is filled again the checked way (recovered once, or its sequence fails)."""
    try:
        failed = batch.fill([job.seq.matcher for job in jobs], [j.first_row for j in jobs], bitmask)
    except Exception:  # every row is filled again below, where failures are handled
        failed = range(len(jobs))
    for i in failed:
        _fill_guarded(jobs[i], bitmask, None)


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
