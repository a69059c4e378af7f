"""One chat choice as its engine outputs arrive: what may be shown now, and what it was in the end.

Text streams as it comes, split into reasoning and content (``api.reasoning``) and, when tools
are in play, into content and tool-call pieces (``api.tool_stream``): a call's id and name as
soon as its opener is complete, then its arguments as they are generated. Only text that could
still be the start of a marker (a trigger, ``</think>``) is held back until it is decided.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from corral.api.outcomes import finish_reason
from corral.api.reasoning import ReasoningFormat, ReasoningSplitter
from corral.api.responses import (
    ChoiceLogprobs,
    FunctionCallOut,
    TokenLogprob,
    ToolCallOut,
    TopLogprob,
)
from corral.api.tool_stream import CallScanner, Piece
from corral.api.tools import ToolPlan

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
        return TokenLogprob(
            token=text,
            logprob=value,
            bytes=list(text.encode()),
            top_logprobs=tops,
            provenance=lp.source,
            allowed_tokens=lp.allowed,
        )

    def content(self, lps: list[Any]) -> ChoiceLogprobs:
        return ChoiceLogprobs(content=[self.entry(lp) for lp in lps])


@dataclass
class Update:
    """What one engine output made showable: free text, reasoning text, tool-call pieces, and
    the logprobs released with them (every token's, the call format's markers included, by the
    end of the choice)."""

    content: str = ""
    reasoning: str = ""
    calls: list[Piece] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)


@dataclass
class ChoiceResult:
    content: str | None
    reasoning: str | None
    tool_calls: list[ToolCallOut]
    finish_reason: str


@dataclass
class ChoiceState:
    """Accumulates one choice through the reasoning splitter (``--reasoning-format``) and the
    tool-call scanner (when tools are in play); streamed and non-streamed answers are both
    built from what ``add`` takes in (the last output flushes what was held back), so they
    cannot differ."""

    index: int
    plan: ToolPlan
    reasoning_format: ReasoningFormat | None = None
    finish_reason: str | None = None
    budget_close: Any = None  # the engine's BudgetReport, with the last output
    logprobs: list[Any] = field(default_factory=list)
    content: str = ""
    reasoning: str = ""
    _shown_lp: int = 0
    _splitter: ReasoningSplitter | None = field(init=False, default=None)
    _scanner: CallScanner | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.reasoning_format is not None:
            self._splitter = ReasoningSplitter(self.reasoning_format)
        if self.plan.active:
            self._scanner = self.plan.scanner()

    def add(self, out: Any) -> Update:
        if out.logprobs:
            self.logprobs.extend(out.logprobs)
        if out.finish_reason is not None:
            self.finish_reason = out.finish_reason
            self.budget_close = getattr(out, "budget_close", None)
        update = self._split(out.text, final=False)
        if self.finished:
            tail = self._split("", final=True)
            update.content += tail.content
            update.reasoning += tail.reasoning
            update.calls += tail.calls
        if update.content or update.calls or self.finished:
            update.logprobs = self.logprobs[self._shown_lp :]
            self._shown_lp = len(self.logprobs)
        return update

    def _split(self, text: str, final: bool) -> Update:
        reasoning, answer = "", text
        if self._splitter is not None:
            reasoning, answer = self._splitter.finish() if final else self._splitter.feed(text)
        calls: list[Piece] = []
        content = answer
        if self._scanner is not None:
            pieces = self._scanner.feed(answer) + (self._scanner.finish() if final else [])
            content = "".join(p.text for p in pieces)
            calls = [p for p in pieces if not p.text]
        self.content += content
        self.reasoning += reasoning
        return Update(content, reasoning, calls)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def result(self) -> ChoiceResult:
        """The final content / reasoning / tool calls and the OpenAI finish reason (of a choice
        that ended well: failed choices are raised by ``EngineCall`` before they get here).
        A call cut off by ``max_tokens`` is returned as far as it got, with ``length``."""
        scanned = self._scanner.calls if self._scanner is not None else []
        calls = [
            ToolCallOut(id=c.id, function=FunctionCallOut(name=c.name, arguments=c.arguments))
            for c in scanned
        ]
        called = bool(scanned) and all(c.complete for c in scanned) and self.finish_reason == "stop"
        return ChoiceResult(
            content=self.content or (None if calls else ""),
            reasoning=self.reasoning or None,
            tool_calls=calls,
            finish_reason=finish_reason(self.finish_reason, called),
        )
