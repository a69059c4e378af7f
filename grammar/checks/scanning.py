"""A backend matcher refined by a scan of the text it writes: the checks at value boundaries.

Repeated keys (``distinct_keys``), numbers that must be fractions and items that must not
repeat (``value_checks``) are things a context-free grammar cannot say. Each wraps the backend
matcher in a :class:`ScanningMatcher`: one immutable scan state per accepted token (for
rollback), and a mask that is the backend's (``fill_mask``, or a native batch fill of
``native_cursor`` followed by ``refine_mask``) with the tokens whose text the scan refuses taken
out, as they are out of ``accept`` and out of the forced continuation. A subclass says how text
moves its scan (``_scan``: None when refused), which tokens of a mask can be refused at all
(``_candidates``: the rest are never scanned), and whether the text may end (``_finished``).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from corral.grammar.core.matcher import Matcher


class ScanningMatcher(Matcher):
    """A backend matcher (``inner``) whose tokens also pass a scan of the text."""

    __slots__ = ("_inner", "_eos", "_bytes", "_states", "_tokens", "_view")

    def __init__(
        self, inner: Matcher, eos: frozenset[int], token_bytes: Sequence[bytes], start: Any
    ) -> None:
        self._inner, self._eos, self._bytes = inner, eos, token_bytes
        self._states = [start]
        self._tokens: list[int] = []
        self._view: tuple[torch.Tensor | None, np.ndarray | None] = (None, None)

    @abstractmethod
    def _scan(self, state: Any, data: bytes) -> Any | None:
        """``state`` after the text ``data``; None when the text is refused."""

    @abstractmethod
    def _candidates(self, state: Any, words: np.ndarray) -> np.ndarray:
        """Token ids that ``_scan`` may refuse from ``state`` (a superset; ``words``: the mask)."""

    def _finished(self, state: Any) -> bool:
        """Whether the text may end at ``state``."""
        return True

    def fill_mask(self, bitmask: torch.Tensor, row: int) -> bool:
        self._inner.fill_mask(bitmask, row)
        self._refine(bitmask, row)
        return True

    def native_cursor(self) -> Any | None:
        return self._inner.native_cursor()

    def refine_mask(self, bitmask: torch.Tensor, row: int) -> None:
        self._inner.refine_mask(bitmask, row)
        self._refine(bitmask, row)

    def _refine(self, bitmask: torch.Tensor, row: int) -> None:
        if self._view[0] is not bitmask:  # callers reuse one buffer: view it once
            self._view = (bitmask, bitmask.numpy().view(np.uint32))
        words = self._view[1][row]
        state = self._states[-1]
        ids = self._candidates(state, words)
        ids = ids[(words[ids >> 5] & (np.uint32(1) << (ids & 31).astype(np.uint32))) != 0]
        for token in ids.tolist():
            if token not in self._eos and self._scan(state, self._bytes[token]) is None:
                words[token >> 5] ^= np.uint32(1 << (token & 31))
        if not self._finished(state):
            for token in self._eos:
                words[token >> 5] &= ~np.uint32(1 << (token & 31))

    def accept(self, token_id: int) -> bool:
        state = self._states[-1]
        if token_id in self._eos:
            if not self._finished(state):
                return False
            after = state
        else:
            after = self._scan(state, self._bytes[token_id])
            if after is None:
                return False
        if not self._inner.accept(token_id):
            return False
        self._states.append(after)
        self._tokens.append(token_id)
        return True

    def _undo(self, n: int) -> None:
        self._inner.rollback(n)
        del self._states[-n:]

    def forced_continuation(self) -> bytes:
        """The backend's forced bytes, cut before the first one the scan refuses."""
        forced = self._inner.forced_continuation()
        state = self._states[-1]
        for i in range(len(forced)):
            state = self._scan(state, forced[i : i + 1])
            if state is None:
                return forced[:i]
        return forced

    def is_terminated(self) -> bool:
        return self._inner.is_terminated()

    def can_terminate(self) -> bool:
        return self._inner.can_terminate() and self._finished(self._states[-1])

    def error(self) -> str | None:
        return self._inner.error()

    def recover(self) -> bool:
        return self._inner.recover()
