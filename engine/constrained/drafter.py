"""Jump-forward in the step loop: the tokens a sequence gets without a selection pass of its own.

`jump_forward` holds the mechanisms (forced tokens, grammar drafts, lookup drafts, the learned
boundary splits). `Drafter` applies them at the three points of a constrained sequence's life
where they matter, so that `Engine.step` stays schedule -> run -> postprocess:

- `start`: a new sequence gets its first draft, verified in its prefill pass (and a reasoning
  budget of 0 its end marker, a budget-closed JSON constraint its `BudgetSteer`);
- `verify`: after sampling, the draft fed in that pass is settled (learned from, counted,
  cleared); the engine frees the KV of its rejected tail;
- `jump_forward`: the tokens the grammar alone decides are appended, then what it forces next
  becomes the draft for the next pass.

Every figure it changes is one of the engine's counters (`engine.stats`).
"""

from __future__ import annotations

from collections import Counter

import torch

from corral.engine.constrained.budget_close import BudgetSteer
from corral.engine.constrained.jump_forward import (
    DraftHints,
    budget_room,
    forced_token,
    lookup_draft,
    make_draft,
    reasoning_close,
)
from corral.engine.serving.config import EngineConfig
from corral.engine.serving.core import Sequence, SequenceFailed, TokenSource
from corral.engine.serving.postprocess import Postprocessor


class Drafter:
    """Forced tokens and drafts for constrained sequences (a no-op when jump-forward is off),
    and the end marker of a think block at its reasoning budget (always)."""

    def __init__(
        self,
        config: EngineConfig,
        tokenizer,
        vocab_size: int,
        post: Postprocessor,
        counters: Counter[str],
    ) -> None:
        """`post` appends forced tokens; `counters` are the engine's own (shared, not copied)."""
        self.config = config
        self.tokenizer = tokenizer
        self.hints = DraftHints(tokenizer)
        self._post = post
        self._counters = counters
        self._force_mask = torch.empty(1, (vocab_size + 31) // 32, dtype=torch.int32)

    def _applies(self, seq: Sequence) -> bool:
        return self.config.jump_forward and seq.matcher is not None

    def start(self, seq: Sequence) -> None:
        """Give a new sequence its first draft. A sequence whose matcher is already broken gets
        none: its first mask fill fails it, inside a step, like any other matcher failure."""
        close = reasoning_close(seq, self.tokenizer)  # a reasoning budget of 0
        if seq.params.budget_close is not None and seq.matcher is not None:
            seq.budget = BudgetSteer(seq, self._post.max_model_len, self._force_mask)
        try:
            if len(close) < seq.params.max_tokens:  # a sequence never ends before its first pass
                self._force_all(seq, close)
            if self._applies(seq):
                seq.draft = self._draft(seq)
        except SequenceFailed:
            seq.draft = []

    def verify(self, seq: Sequence, appended: int) -> int:
        """Settle the draft fed in `seq`'s last pass, now that sampling appended `appended`
        tokens for it (each but the last confirms one draft token). Returns how many draft
        tokens were rejected: their KV slots hold nothing valid and must be freed."""
        draft = seq.draft
        got = seq.output_ids[len(seq.output_ids) - appended :]
        self.hints.observe(seq.draft_hint, draft, got)
        accepted = max(0, appended - 1)  # the last appended token is sampled, not a draft
        c = self._counters
        c["draft_tokens"] += len(draft)
        c["draft_accepted"] += accepted
        if seq.draft_looked_up:
            c["lookup_draft_tokens"] += len(draft)
            c["lookup_draft_accepted"] += accepted
        c["jump_forward_tokens"] += accepted
        seq.draft, seq.draft_hint, seq.draft_looked_up, seq.num_forced = [], None, False, 0
        return len(draft) - accepted

    def jump_forward(self, seq: Sequence) -> None:
        """Append the tokens the grammar alone decides (their KV comes with the next extend),
        then draft the forced text after them. A think block at its reasoning budget is closed
        first, constrained or not."""
        self._force_all(seq, reasoning_close(seq, self.tokenizer))
        if not self._applies(seq):
            return
        while seq.finish_reason is None:
            tok = forced_token(seq, self._force_mask)
            if tok is None:
                break
            self._force(seq, tok)
        if seq.finish_reason is None:
            seq.draft = self._draft(seq)

    def _force_all(self, seq: Sequence, tokens: list[int]) -> None:
        """Append a reasoning budget's end marker (a budget closed it: "closed")."""
        for tok in tokens:
            if seq.finish_reason is not None:
                return
            self._force(seq, tok, "closed")

    def _force(self, seq: Sequence, tok: int, source: TokenSource = "forced") -> None:
        self._post.force(seq, tok, source)
        seq.num_forced += 1
        for name in ("output_tokens", "forced_tokens", "jump_forward_tokens"):
            self._counters[name] += 1

    def _draft(self, seq: Sequence) -> list[int]:
        """The grammar's forced text as tokens, else a lookup draft (after the first output)."""
        # The draft's last token is verified with one more sampled token after it, so leave
        # room for that one within max_tokens.
        limit = min(self.config.max_draft_tokens, seq.params.max_tokens - len(seq.output_ids) - 1)
        room = budget_room(seq)  # nor past a reasoning budget
        if room is not None:
            limit = min(limit, room)
        draft = make_draft(seq, self.tokenizer, limit, self.hints)
        if not draft and seq.output_ids:
            draft = lookup_draft(seq, min(limit, self.config.lookup_draft_tokens))
            seq.draft_looked_up = bool(draft)
        return draft
