"""After sampling: accept tokens (verifying jump-forward drafts), decide finishes, emit outputs.

Finish rules, checked after every appended token, first match wins:
- an EOS token (unless `ignore_eos`) or a request stop token -> "stop"; neither appears in text;
- the grammar is terminated (EOS accepted, or nothing may follow) -> "stop";
- a stop string in the decoded text -> "stop" (cut there), only from `min_tokens` outputs on;
- `max_tokens` output tokens, or the context length reached -> "length".

Constrained outputs: the request's stop strings and stop tokens only count where the grammar
could end here (`matcher.can_terminate()`), so a stop string inside a JSON string value never
truncates the JSON. EOS is only sampled where the grammar allows it (the mask).

Budget closing (`budget_close`): a token that would leave too few tokens to close the JSON is
not taken; the shortest completion is appended instead and the output ends as "length".

Provenance (with logprobs): every appended token's `TokenLogprob` says how it came
(`core.TokenSource`): a drawn token the grammar decided (its row allowed only it, or it confirms
a grammar draft) is "forced", the rest of the drawn ones "sampled"; tokens appended without a
draw are "forced" (jump-forward) or "closed" (budget closing, a reasoning budget's end marker).

Failures: a sampled token the matcher refuses (after one recovery of a matcher in error, see
`grammar_masks.accept_checked`), or a row with no allowed token, raises `SequenceFailed`
("constraint_failed"); the engine then ends the sequence with finish reason "error" (`fail`).
"""

from __future__ import annotations

from dataclasses import replace

from corral.engine.constrained.masks import accept_checked, constraint_failed
from corral.engine.serving import prompt_logprobs
from corral.engine.serving.core import (
    EngineFailure,
    FinishReason,
    Output,
    SeqStatus,
    Sequence,
    TokenLogprob,
    TokenSource,
)


class Postprocessor:
    def __init__(self, eos_token_ids: frozenset[int], max_model_len: int) -> None:
        self.eos = eos_token_ids
        self.max_model_len = max_model_len

    def accept(self, seq: Sequence, tokens: list[int], logprobs: list[TokenLogprob | None]) -> int:
        """Append the sampled tokens of `seq`'s rows; returns how many were appended.

        Row 0 is always taken. Row i > 0 exists only for a jump-forward draft and is valid
        only if the token sampled at row i - 1 equals draft token i - 1 (the draft was right
        so far); the walk stops at the first mismatch or finish.
        """
        draft = seq.draft
        appended = 0
        for i, tok in enumerate(tokens):
            self._append(seq, tok, _provenance(seq, i, tok, logprobs[i]))
            appended += 1
            if seq.finish_reason is not None or i >= len(draft) or tok != draft[i]:
                break
        return appended

    def force(self, seq: Sequence, tok: int, source: TokenSource = "forced") -> None:
        """Append a token without a draw: the grammar allowed only it ("forced"), or a
        reasoning budget's end marker ("closed")."""
        self._append(seq, tok, _certain(seq, tok, source))

    def _append(self, seq: Sequence, tok: int, lp: TokenLogprob | None) -> None:
        m = seq.matcher
        if tok < 0:
            raise constraint_failed("no token was allowed: the grammar mask was empty")
        steer = seq.budget
        if steer is not None and not steer.admits(seq, tok):
            if steer.close(seq, lambda t: self._append(seq, t, _certain(seq, t, "closed"))):
                if seq.finish_reason is None:
                    self.finish(seq, "length")
                seq.finish_reason = "length"  # the budget shaped it, whatever ended it
                return
        if m is not None and not accept_checked(m, tok):
            raise constraint_failed(f"the grammar refused token {tok}, which its own mask allowed")
        seq.output_ids.append(tok)
        seq.pending_ids.append(tok)
        if lp is not None:
            seq.pending_logprobs.append(lp)
        p = seq.params
        complete = m is None or m.can_terminate()
        if (tok in self.eos and not p.ignore_eos) or (complete and tok in p.stop_token_ids):
            self.finish(seq, "stop")
            return
        seq.detok.add(tok)
        if m is not None and m.is_terminated():
            self.finish(seq, "stop")
            return
        if p.stop:
            if complete and len(seq.output_ids) >= p.min_tokens and seq.detok.find_stop():
                self.finish(seq, "stop", cut=True)
                return
            if not complete or len(seq.output_ids) < p.min_tokens:
                seq.detok.skip_stop_search()
        if len(seq.output_ids) >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            self.finish(seq, "length")

    def finish(self, seq: Sequence, reason: FinishReason, cut: bool = False) -> None:
        """Mark `seq` finished; unless a stop string cut the text, flush pending bytes."""
        seq.finish_reason = reason
        seq.status = SeqStatus.FINISHED
        if not cut:
            seq.detok.flush()

    def fail(self, seq: Sequence, failure: EngineFailure) -> None:
        """End `seq` with finish reason "error" (its pending bytes are dropped: its detokenizer
        may be what failed)."""
        seq.finish_reason = "error"
        seq.error = failure
        seq.status = SeqStatus.FINISHED

    def emit(self, seq: Sequence) -> Output:
        """What is new for `seq` since its last output."""
        final = seq.finish_reason is not None
        out = Output(
            request_id=seq.request_id,
            index=seq.index,
            text=seq.detok.take(final),
            token_ids=tuple(seq.pending_ids),
            logprobs=tuple(seq.pending_logprobs) if seq.params.wants_logprobs else None,
            finish_reason=seq.finish_reason,
            num_prompt_tokens=len(seq.prompt_ids),
            num_cached_tokens=seq.num_cached_tokens,
            error=seq.error,
            budget_close=seq.budget.report(seq) if final and seq.budget else None,
            prompt_logprobs=prompt_logprobs.pending(seq),
            spec_proposed=seq.spec.proposed if seq.spec else 0,
            spec_accepted=seq.spec.accepted if seq.spec else 0,
        )
        seq.pending_ids = []
        seq.pending_logprobs = []
        return out

    def bare_output(self, seq: Sequence) -> Output:
        """The final `Output` of a failed `seq` without touching its detokenizer or tokens."""
        return Output(
            request_id=seq.request_id,
            index=seq.index,
            text="",
            token_ids=(),
            logprobs=() if seq.params.wants_logprobs else None,
            finish_reason=seq.finish_reason,
            num_prompt_tokens=len(seq.prompt_ids),
            num_cached_tokens=seq.num_cached_tokens,
            error=seq.error,
        )


def _provenance(seq: Sequence, i: int, tok: int, lp: TokenLogprob | None) -> TokenLogprob | None:
    """Row `i`'s logprob, marked "forced" where the grammar decided the drawn token: its row
    allowed nothing else, or it confirms draft token `i` of a grammar draft (not a lookup)."""
    if lp is None or seq.matcher is None:
        return lp
    confirms = i < min(len(seq.draft), seq.draft_lookup_from) and tok == seq.draft[i]
    return replace(lp, source="forced") if confirms or lp.allowed == 1 else lp


def _certain(seq: Sequence, tok: int, source: TokenSource) -> TokenLogprob | None:
    """The logprob entry of a token appended without a draw (None unless logprobs are asked)."""
    p = seq.params
    if not p.wants_logprobs:
        return None
    return TokenLogprob.certain(tok, source, p.top_logprobs, 1 if source == "forced" else None)
