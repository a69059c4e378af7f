"""Constraints in the loop: grammar masks filled on a worker thread during the forward.

Masks. Every constrained logits row gets one bitmask row (`int32[R, ceil(V/32)]`, the
project-wide format). The matchers fill them on a worker thread while the main thread runs the
model (the grammar backends release the GIL); the sampler waits for the result, then
`mask_kernels` applies it. The main thread does not touch a matcher while a fill is in flight.

Jump-forward drafts (see `jump_forward`) get one mask row per draft position. The verification
rows' masks are filled by accepting the draft tokens one by one (each row is
the mask *after* the draft tokens before it) and rolling the matcher back afterwards.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from corral.engine.core import Sequence


@dataclass
class MaskJob:
    """Fill bitmask rows `first_row ...` for `seq`: its current state, then after each draft."""

    seq: Sequence
    draft: list[int]
    first_row: int


class MaskFiller:
    """Fills grammar masks on one worker thread, overlapped with the forward pass."""

    def __init__(self, vocab_size: int) -> None:
        self.words = (vocab_size + 31) // 32
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="corral-mask")

    def start(self, jobs: list[MaskJob], num_rows: int) -> Future[torch.Tensor]:
        """Begin filling an `int32[num_rows, W]` bitmask; the future yields it."""
        bitmask = torch.empty(num_rows, self.words, dtype=torch.int32)
        return self._pool.submit(_fill, jobs, bitmask)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _fill(jobs: list[MaskJob], bitmask: torch.Tensor) -> torch.Tensor:
    for job in jobs:
        m = job.seq.matcher
        row = job.first_row
        _fill_row(m, bitmask, row)
        accepted = 0
        for tok in job.draft:
            if not m.accept(tok):  # drafts were checked when made; stay safe anyway
                break
            accepted += 1
            row += 1
            _fill_row(m, bitmask, row)
        m.rollback(accepted)
    return bitmask


def _fill_row(matcher, bitmask: torch.Tensor, row: int) -> None:
    if not matcher.fill_mask(bitmask, row):
        bitmask[row].fill_(-1)  # every token allowed
