"""The per-request cursor over a compiled constraint."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch


class Matcher(ABC):
    """A cheap, per-request cursor over a :class:`CompiledConstraint`.

    Invariants: a token is only accepted if the last mask allowed it; a rejected token leaves the
    matcher where it was (it is a state, not an exception); ``rollback(n)`` undoes exactly the
    last ``n`` accepted tokens. Masks use the project-wide format ``int32[B, ceil(V/32)]``.
    """

    @abstractmethod
    def fill_mask(self, bitmask: torch.Tensor, row: int) -> bool:
        """Write the allowed tokens into ``bitmask[row]``; False when every token is allowed."""

    def native_cursor(self) -> Any | None:
        """The llguidance cursor whose mask is this matcher's before ``refine_mask``, for a batch
        fill of many rows in one native call (``mask_batch``, ``backends.llg_batch``: nothing
        outside the grammar layer fills through it); None when there is none and ``fill_mask``
        must be called."""
        return None

    def refine_mask(self, bitmask: torch.Tensor, row: int) -> None:  # noqa: B027 - optional
        """Clear, in a row the native cursor filled, what this matcher forbids beyond it."""

    @abstractmethod
    def accept(self, token_id: int) -> bool:
        """Advance by one token; False (and no state change) when the grammar forbids it."""

    def accept_tokens(self, token_ids: list[int]) -> int:
        """Accept tokens in order until one is rejected; returns how many were accepted."""
        for i, t in enumerate(token_ids):
            if not self.accept(t):
                return i
        return len(token_ids)

    #: The tokens accepted so far, in order: what ``rollback`` trims and ``recover`` replays.
    _tokens: list[int]

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` accepted tokens."""
        if not 0 <= n <= len(self._tokens):
            raise ValueError(f"cannot roll back {n} tokens: only {len(self._tokens)} accepted")
        if n:
            del self._tokens[-n:]
            self._undo(n)

    @abstractmethod
    def _undo(self, n: int) -> None:
        """Move the backend's cursor back ``n`` tokens (``_tokens`` is already trimmed)."""

    @abstractmethod
    def forced_continuation(self) -> bytes:
        """The bytes the grammar forces next, whatever the model would pick (may be empty)."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """True once the grammar is finished: an EOS token was accepted or nothing may follow."""

    @abstractmethod
    def can_terminate(self) -> bool:
        """True when the text so far is a complete match, so an EOS token would be allowed."""

    def error(self) -> str | None:
        """None while the cursor is healthy; otherwise why it cannot go on.

        A backend that hits one of its runtime limits (llguidance: Earley row items, lexer
        states, fuel) enters a sticky error state in which its mask allows only EOS and EOS is
        refused. Callers check this after ``fill_mask`` and after a refused ``accept``.
        """
        return None

    def recover(self) -> bool:
        """Rebuild the cursor from the compiled constraint and replay the tokens accepted so far.

        The limit that tripped is per cursor copy, so a fresh copy often gets past it. True when
        the rebuilt cursor is healthy (``error()`` is None again); False when it failed too, and
        the sequence must be failed. A backend that cannot rebuild returns False.
        """
        return False
