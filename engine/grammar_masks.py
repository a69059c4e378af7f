"""Grammar masks in the step loop: filled on a worker thread during the forward pass.

Masks. Every constrained logits row gets one bitmask row (`int32[R, ceil(V/32)]`, the
project-wide format). The matchers fill them on a worker thread while the main thread runs the
model (the grammar backends release the GIL); the sampler waits for the result, then
`mask_kernels` applies it. The main thread does not touch a matcher while a fill is in flight.

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

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
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


class MaskFiller:
    """Fills grammar masks on one worker thread, overlapped with the forward pass.

    For a CUDA model the masks are filled into pinned host memory, so the sampler's copy to the
    device is one asynchronous transfer. Two buffers alternate: a step's copy has finished by the
    time the step after next fills the same buffer (every step ends by reading its sampled
    tokens back, which waits for the copy).
    """

    def __init__(self, vocab_size: int, device: torch.device | None = None) -> None:
        self.words = (vocab_size + 31) // 32
        self._pinned = device is not None and device.type == "cuda"
        self._buffers = [torch.empty(0, self.words, dtype=torch.int32) for _ in range(2)]
        self._turn = 0
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="corral-mask")

    def start(
        self, jobs: list[MaskJob], num_rows: int, fault: Exception | None = None
    ) -> Future[torch.Tensor]:
        """Begin filling an `int32[num_rows, W]` bitmask; the future yields it. `fault` (tests,
        `engine.faults`) is raised inside the first job's fill."""
        return self._pool.submit(_fill, jobs, self._buffer(num_rows), fault)

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


def _fill(jobs: list[MaskJob], bitmask: torch.Tensor, fault: Exception | None) -> torch.Tensor:
    for i, job in enumerate(jobs):
        try:
            if i == 0 and fault is not None:
                raise fault
            _fill_job(job, bitmask)
        except SequenceFailed as e:
            _fail_job(job, bitmask, e.failure)
        except Exception as e:  # one sequence's matcher broke: that sequence fails, not the step
            failure = EngineFailure("sequence_failed", f"filling the grammar mask failed: {e!r}")
            _fail_job(job, bitmask, failure)
    return bitmask


def _fill_job(job: MaskJob, bitmask: torch.Tensor) -> None:
    m = job.seq.matcher
    row, last = job.first_row, job.first_row + len(job.draft)
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
