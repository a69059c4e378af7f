"""llguidance's native batch mask fill: many matchers' rows in one call, one GIL release.

A matcher joins the batch when it has an llguidance cursor (``Matcher.native_cursor``: an
``LLGuidanceMatcher``, or a matcher that wraps one, such as the ``ScanningMatcher`` checks).
``LLExecutor.unsafe_compute_mask_ptr`` writes every cursor's mask into its row of the buffer
with no Python per row, sharing the rows among llguidance's own threads; then each row gets its
matcher's ``refine_mask`` (a wrapper clears what its own check forbids beyond the grammar).
Measured in ``bench/masks.py``. Only ``grammar.core.mask_batch`` uses this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import llguidance
import torch

from corral.grammar.core.matcher import Matcher


def joins(matcher: Matcher) -> bool:
    """Whether ``LLGBatch.fill`` fills ``matcher`` in its batch call."""
    return matcher.native_cursor() is not None


class LLGBatch:
    """One ``LLExecutor`` (its thread pool), for the batch fills of one mask filler."""

    __slots__ = ("_executor",)

    def __init__(self, threads: int) -> None:
        self._executor = llguidance.LLExecutor(threads)

    def fill(
        self, matchers: Sequence[Matcher], rows: Sequence[int], bitmask: torch.Tensor
    ) -> tuple[list[int], list[int]]:
        """Fill ``bitmask[rows[i]]`` with ``matchers[i]``'s mask, for every matcher that joins,
        in one native call, then refine each row. Returns the indices ``i`` whose row does not
        hold the mask (the matcher is in its error state, its refinement raised, or the batch
        call itself refused, e.g. a cursor borrowed elsewhere: then every joined row), and the
        indices of the matchers that do not join (their rows untouched)."""
        cursors: list[Any] = [m.native_cursor() for m in matchers]
        if None in cursors:  # some do not join: the others alone, in one call
            joined = [i for i, c in enumerate(cursors) if c is not None]
            left = [i for i, c in enumerate(cursors) if c is None]
            if not joined:
                return [], left
            some, _ = self.fill([matchers[i] for i in joined], [rows[i] for i in joined], bitmask)
            return [joined[k] for k in some], left
        try:
            self._executor.unsafe_compute_mask_ptr(
                list(zip(cursors, rows, strict=True)),
                bitmask.data_ptr(),
                bitmask.shape[1] * 4,
                bitmask.shape[0],
            )
        except Exception:  # e.g. a cursor borrowed elsewhere ("Already borrowed")
            return list(range(len(cursors))), []
        failed = []
        for i, m in enumerate(matchers):
            try:
                if m.error() is None:
                    m.refine_mask(bitmask, rows[i])
                    continue
            except Exception:  # noqa: S110 - the caller fills the row again, and handles it
                pass
            failed.append(i)  # in its error state its row allows only EOS: not its mask
        return failed, []
