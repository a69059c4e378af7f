"""A step's grammar masks from start to sampling: the moves both step loops share.

`Engine` (and `OverlapLoop`, one step ahead) starts the fills before the forward pass, waits for
them until the deadline once the logits are there, samples every row but those whose masks are
late (`grammar_masks`), and keeps the books of the sequences that sat the step out. Those moves
live here, beside the deadline they apply, so neither loop repeats them.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import TYPE_CHECKING

import torch

from corral.engine.constrained.masks import MaskFill, MaskFiller
from corral.engine.serving.config import EngineConfig
from corral.engine.serving.core import Sequence
from corral.engine.serving.faults import Faults
from corral.engine.serving.sampler import DeviceSample, sample_on_device

if TYPE_CHECKING:
    from corral.engine.kvcache.cache_manager import CacheManager
    from corral.engine.serving.scheduler import ScheduledSeq
    from corral.engine.serving.step_inputs import StepRows


class StepMasks:
    """The grammar masks of each step, under the per-step deadline (`mask_grace_ms`)."""

    def __init__(
        self,
        config: EngineConfig,
        vocab_size: int,
        device: torch.device,
        eos: frozenset[int],
        faults: Faults | None,
        cache: CacheManager,
        counters: Counter[str],
    ) -> None:
        """`faults` (tests, `engine.faults`): a "mask" fault is raised inside a step's fill;
        `cache` and `counters` are the engine's."""
        self.filler = MaskFiller(vocab_size, device, config.mask_threads)
        grace = config.mask_grace_ms
        self._grace_s = None if grace is None else grace / 1000
        self._eos = eos
        self._faults = faults
        self._cache = cache
        self._counters = counters

    @property
    def late_done(self) -> threading.Event:
        """Set whenever a late fill ends (its sequence can be scheduled again)."""
        return self.filler.late_done

    def start(self, rows: StepRows, batch_no: int) -> MaskFill | None:
        """Start filling the masks of `rows` (step number `batch_no`); None when none is
        constrained."""
        if not rows.jobs:
            return None
        fault = self._faults.take("mask", batch_no) if self._faults else None
        return self.filler.start(rows.jobs, len(rows.mask_rows), fault)

    def late(self, fill: MaskFill | None) -> set[Sequence]:
        """Wait for the masks until the deadline; the sequences whose rows sit this step out."""
        if fill is None:
            return set()
        return {job.seq for job in self.filler.wait(fill, self._grace_s)}

    def settle(self, fill: MaskFill | None) -> None:
        """Wait for every fill to end (the step failed: no fill may outlive it on a matcher)."""
        if fill is not None:
            self.filler.wait(fill, None)

    def draw(
        self, logits: torch.Tensor, rows: StepRows, fill: MaskFill | None, drop: set[Sequence]
    ) -> tuple[DeviceSample | None, StepRows]:
        """Sample every row but those of `drop` on the logits' device (no host sync); also
        returns the rows sampled. None when no row is left."""
        bitmask = fill.bitmask if fill is not None else None
        if drop:
            keep, mask_keep, rows = rows.without(drop)
            logits = logits[torch.tensor(keep, dtype=torch.int64)]
            if bitmask is not None:  # a copy: late fills may still write into the step's buffer
                bitmask = bitmask[torch.tensor(mask_keep, dtype=torch.int64)]
        if not rows.specs:
            return None, rows
        mask_rows = torch.tensor(rows.mask_rows, dtype=torch.int64) if rows.mask_rows else None
        with torch.inference_mode():  # the logits are inference tensors
            return sample_on_device(logits, rows.specs, bitmask, mask_rows, self._eos), rows

    def sit_out(self, item: ScheduledSeq) -> None:
        """Its mask missed the deadline: keep the KV of all it fed but its last real token
        (whose logits were dropped) and free the rest; it is fed that token again next step."""
        seq = item.seq
        seq.forward_passes += 1
        self._counters["seq_forward_passes"] += 1
        seq.mask_deferrals += 1
        self._counters["mask_deferrals"] += 1
        seq.num_computed += item.num_new - item.draft_len - 1
        self._cache.truncate(seq)

    def close(self) -> None:
        self.filler.close()
