"""Many matchers' masks into rows of one bitmask: the grammar layer's batch fill.

A caller (the engine's mask workers) holds one :class:`MaskBatchFiller` and never a backend
object. ``fill`` writes each matcher's mask (``Matcher.fill_mask``'s, all ones where everything
is allowed) into its row of an ``int32[R, ceil(V/32)]`` bitmask. Matchers the backend can fill
together (``batched``: llguidance cursors, wrapped or not) go in one native call, one release
of the GIL for all of them (``backends/llg_batch``); the others are filled one by one here.

A matcher in its error state (``Matcher.error``) is not filled: ``fill`` reports its row as
not done, and the caller applies the ``error``/``recover`` contract itself (and decides what a
matcher that stays in error means), then fills that row on its own, e.g. with :func:`fill_row`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from corral.grammar.backends.llg_batch import LLGBatch, joins
from corral.grammar.core.matcher import Matcher


class MaskBatchFiller:
    """Batch mask fills on ``threads`` native threads; create one per caller and reuse it (it
    holds the backend's thread pool). Calls from several threads at once are safe, as long as
    no matcher is in two calls (or a call and another operation) at once."""

    __slots__ = ("_llg",)

    def __init__(self, threads: int = 1) -> None:
        self._llg = LLGBatch(threads)

    #: Whether ``fill`` fills a matcher in a native batch call (with no Python per row but its
    #: refinement); False: ``fill`` fills it on its own, like :func:`fill_row`.
    batched = staticmethod(joins)

    def fill(
        self, matchers: Sequence[Matcher], rows: Sequence[int], bitmask: torch.Tensor
    ) -> list[int]:
        """Fill ``bitmask[rows[i]]`` with ``matchers[i]``'s mask (all ones where everything is
        allowed). ``bitmask``: ``int32[R, W]``, contiguous, on the CPU; the rows distinct.

        Returns the indices ``i`` (ascending) whose row does not hold ``matchers[i]``'s mask,
        empty when every row does. Such a row's content is undefined: the matcher is in its
        error state, or its fill raised, or the native batch call refused as a whole (then every
        batched row of this call). The caller fills those rows its own way (recovering the
        matcher first). Rows that no matcher names are left as they are.
        """
        if bitmask.dtype is not torch.int32 or bitmask.dim() != 2 or not bitmask.is_contiguous():
            raise ValueError("the bitmask must be a contiguous int32[rows, words] tensor")
        if not bitmask.is_cpu:
            raise ValueError("the bitmask must be in host memory")
        failed, left = self._llg.fill(matchers, rows, bitmask)
        if not left:
            return failed
        failed += [i for i in left if not _filled_alone(matchers[i], bitmask, rows[i])]
        return sorted(failed)


def fill_row(matcher: Matcher, bitmask: torch.Tensor, row: int) -> None:
    """Fill ``bitmask[row]`` with ``matcher``'s mask on its own: all ones when every token is
    allowed. The caller checks ``matcher.error()`` afterwards."""
    if not matcher.fill_mask(bitmask, row):
        bitmask[row].fill_(-1)  # every token allowed


def _filled_alone(matcher: Matcher, bitmask: torch.Tensor, row: int) -> bool:
    try:
        fill_row(matcher, bitmask, row)
        return matcher.error() is None
    except Exception:  # the caller fills the row again, where failures are handled
        return False
