"""Jump-forward in the step loop: the tokens a sequence gets without a selection pass of its own.

`jump_forward` holds the mechanisms (forced tokens, grammar drafts, lookup drafts, the learned
boundary splits). `Drafter` applies them at the three points of a constrained sequence's life
where they matter, so that `Engine.step` stays schedule -> run -> postprocess:

- `start`: a new sequence gets its first draft, verified in its prefill pass (and a reasoning
  budget of 0 its end marker, a budget-closed JSON constraint its `BudgetSteer`);
- `verify`: after sampling, the draft fed in that pass is settled (learned from, counted,
  cleared); the engine frees the KV of its rejected tail;
- `jump_forward`: the tokens the grammar alone decides are appended, then what it forces next
  becomes the draft for the next pass, continued by a prompt-lookup proposal
  (`engine.constrained.lookup`, every sequence, constrained or not, while speculation pays
  for it) cut at the first token the grammar refuses.

Every figure it changes is one of the engine's counters (`engine.stats`).
"""

from __future__ import annotations

from collections import Counter

import torch

from corral.engine.constrained.budget_close import BudgetSteer
from corral.engine.constrained.jump_forward import (
    DraftHints,
    accepted_after,
    budget_room,
    forced_token,
    make_draft,
    reasoning_close,
)
from corral.engine.constrained.lookup import Proposer
from corral.engine.serving.config import EngineConfig
from corral.engine.serving.core import Sequence, SequenceFailed, TokenSource
from corral.engine.serving.postprocess import Postprocessor


class Drafter:
    """Forced tokens and grammar drafts for constrained sequences (when jump-forward is on),
    lookup drafts for every sequence (when speculation is on), and the end marker of a think
    block at its reasoning budget (always)."""

    def __init__(
        self,
        config: EngineConfig,
        tokenizer,
        vocab_size: int,
        post: Postprocessor,
        counters: Counter[str],
        row_cost: float = 0.5,
    ) -> None:
        """`post` appends forced tokens; `counters` are the engine's own (shared, not copied);
        `row_cost`: a draft row's cost as a share of a decode pass (`EngineConfig`)."""
        self.config = config
        self.tokenizer = tokenizer
        self.hints = DraftHints(tokenizer)
        self._post = post
        self._counters = counters
        self._force_mask = torch.empty(1, (vocab_size + 31) // 32, dtype=torch.int32)
        self.proposer = Proposer(
            config.lookup_min_ngram,
            config.lookup_max_ngram,
            config.lookup_draft_tokens if config.speculative else 0,
            config.lookup_min_tokens,
            row_cost,
        )

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
        split = min(seq.draft_lookup_from, len(draft))  # forced text first, then the lookup
        looked_up, lookup_ok = len(draft) - split, max(0, accepted - split)
        if looked_up:
            c["lookup_draft_tokens"] += looked_up
            c["lookup_draft_accepted"] += lookup_ok
            self.proposer.settle(seq, looked_up, lookup_ok)
        c["jump_forward_tokens"] += accepted - lookup_ok
        seq.draft, seq.draft_hint, seq.draft_lookup_from, seq.num_forced = [], None, 0, 0
        return len(draft) - accepted

    def jump_forward(self, seq: Sequence) -> None:
        """Append the tokens the grammar alone decides (their KV comes with the next extend),
        then draft the forced text after them. A think block at its reasoning budget is closed
        first, constrained or not."""
        self._force_all(seq, reasoning_close(seq, self.tokenizer))
        while self._applies(seq) and seq.finish_reason is None:
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
        """The grammar's forced text as tokens (jump-forward), then a lookup proposal after it
        (speculation, after the first output), cut to what the grammar accepts."""
        # The draft's last token is verified with one more sampled token after it, so leave
        # room for that one within max_tokens.
        limit = min(self.config.max_draft_tokens, seq.params.max_tokens - len(seq.output_ids) - 1)
        room = budget_room(seq)  # nor past a reasoning budget
        if room is not None:
            limit = min(limit, room)
        draft = make_draft(seq, self.tokenizer, limit, self.hints) if self._applies(seq) else []
        seq.draft_lookup_from = len(draft)
        if len(draft) < limit and self.proposer.applies(seq):
            more = self.proposer.propose(seq, draft, limit - len(draft))
            draft += more[: accepted_after(seq, draft, more)]
        return draft
