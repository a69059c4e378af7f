"""One chat choice as its engine outputs arrive: what may be shown now, and what it was in the end.

Plain text streams as it comes. Tool-call output is held back until the choice finishes (its
arguments are only complete then); in ``auto`` mode the first characters are held only while they
could still be the start of the tool-call tag.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from corral.api.outcomes import finish_reason
from corral.api.responses import ChoiceLogprobs, TokenLogprob, TopLogprob
from corral.api.tools import TOOL_CALL_TAG, ParsedOutput, ToolPlan, parse_output

#: what a sampled token's log probability is reported as if it is not a finite number (OpenAI
#: itself reports -9999.0 for "as good as impossible"); JSON has no -inf or NaN
FLOOR_LOGPROB = -9999.0


class LogprobFormatter:
    """Engine ``TokenLogprob``s (ids) -> OpenAI logprob entries (token text and bytes).

    Every number is finite: alternatives the constraint masked out (log probability -inf) are
    omitted from ``top_logprobs``, so a constrained choice may list fewer than asked for. The
    engine already guarantees this; the guard here keeps a response valid JSON regardless.
    """

    def __init__(self, tokenizer: Any, top: int) -> None:
        self.top = top
        self._text = lru_cache(maxsize=65536)(lambda i: tokenizer.decode([i]))

    def entry(self, lp: Any) -> TokenLogprob:
        text = self._text(lp.token_id)
        allowed = [(i, v) for i, v in lp.top if math.isfinite(v)][: self.top]
        tops = [
            TopLogprob(token=self._text(i), logprob=v, bytes=list(self._text(i).encode()))
            for i, v in allowed
        ]
        value = lp.logprob if math.isfinite(lp.logprob) else FLOOR_LOGPROB
        return TokenLogprob(token=text, logprob=value, bytes=list(text.encode()), top_logprobs=tops)

    def content(self, lps: list[Any]) -> ChoiceLogprobs:
        return ChoiceLogprobs(content=[self.entry(lp) for lp in lps])


@dataclass
class ChoiceState:
    """Accumulates one choice; ``add`` returns the text (and logprobs) that may be shown now."""

    index: int
    plan: ToolPlan
    text: str = ""
    num_tokens: int = 0
    finish_reason: str | None = None
    logprobs: list[Any] = field(default_factory=list)
    _shown: int = 0  # characters of `text` already released
    _shown_lp: int = 0
    _holding: bool = True  # undecided or tool-call output: nothing released yet

    def __post_init__(self) -> None:
        self._holding = self.plan.mode in ("auto", "required")

    def add(self, out: Any) -> tuple[str, list[Any]]:
        self.text += out.text
        self.num_tokens += len(out.token_ids)
        if out.logprobs:
            self.logprobs.extend(out.logprobs)
        if out.finish_reason is not None:
            self.finish_reason = out.finish_reason
        if self._holding and self.plan.mode == "auto" and not self._maybe_tool_call():
            self._holding = False
        if self._holding:
            return "", []
        return self._release()

    def _maybe_tool_call(self) -> bool:
        """Still possibly a tool call: the text is a prefix of the tag or starts with it."""
        return self.text.startswith(TOOL_CALL_TAG) or (
            TOOL_CALL_TAG.startswith(self.text) and self.finish_reason is None
        )

    def _release(self) -> tuple[str, list[Any]]:
        delta, lps = self.text[self._shown :], self.logprobs[self._shown_lp :]
        self._shown, self._shown_lp = len(self.text), len(self.logprobs)
        return delta, lps

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def result(self) -> tuple[ParsedOutput, str]:
        """The final content / tool calls and the OpenAI finish reason (of a choice that ended
        well: failed choices are raised by ``EngineCall`` before they get here)."""
        parsed = parse_output(self.text, self.plan)
        return parsed, finish_reason(self.finish_reason, bool(parsed.tool_calls))

    def held_text(self) -> tuple[str, list[Any]]:
        """At the end: held-back text that turned out not to be tool calls, to release as content."""
        return self._release()
