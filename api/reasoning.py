"""Reasoning models: the think block, split from the answer as the text arrives.

``--reasoning-format`` names how the served model thinks. The block is free text; a constraint
(response format, tools) applies after its end marker (``ConstraintSpec.after_reasoning``), and
the response carries the block as ``reasoning_content`` beside ``content`` — streamed as
``reasoning_content`` deltas — as vLLM and SGLang do.

- ``deepseek-r1``: the chat template opens the block (its generation prompt ends with
  ``<think>``), so the output starts inside it; without an end marker, all of it is reasoning.
- ``qwen3``: the model opens the block itself; an output that does not start with ``<think>``
  has no reasoning (e.g. thinking switched off in the template).

``auto`` (the default) detects the format from the chat template (``detect_reasoning``): a
generation prompt that ends with ``<think>`` is ``deepseek-r1``; a template that mentions
``</think>`` otherwise (Qwen3, SmolLM3: the model opens the block itself) is ``qwen3``; any other
template has no think block. ``none`` switches it off.

Per request, a prompt that already closes the block (Qwen3's ``enable_thinking: false`` and
SmolLM3's ``/no_think`` render an empty ``<think>\n\n</think>`` after the assistant's turn
starts) has no reasoning: the output is the answer, constrained from its first token
(``thinks``).

``max_reasoning_tokens`` (a request field) bounds the block: after that many output tokens
inside it, the engine appends the end marker itself (``engine.jump_forward``), and the
constraint takes over as if the model had closed the block.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from corral.engine.serving.core import ReasoningBudget


@dataclass(frozen=True)
class ReasoningFormat:
    name: str
    open: str
    close: str
    #: the template opens the block: output that never closes it is all reasoning
    starts_inside: bool

    def under_constraint(self) -> ReasoningFormat:
        """The format as a constrained output is read: the constraint's grammar
        (``ConstraintSpec.after_reasoning``) makes the block mandatory — an optional open
        marker, free text, the close marker — so everything before the close marker is
        reasoning, whether or not the model wrote the open marker, and a budget counts from the
        first output token."""
        return replace(self, starts_inside=True)

    def budget(self, tokens: int) -> ReasoningBudget:
        """``max_reasoning_tokens``: the engine closes a block still open after ``tokens``
        output tokens (one the model opens itself, where the template does not)."""
        return ReasoningBudget(tokens, self.close, "" if self.starts_inside else self.open)


REASONING_FORMATS: dict[str, ReasoningFormat] = {
    "deepseek-r1": ReasoningFormat("deepseek-r1", "<think>", "</think>", True),
    "qwen3": ReasoningFormat("qwen3", "<think>", "</think>", False),
}

REASONING_NAMES = ("auto", "none", *REASONING_FORMATS)


def detect_reasoning(
    chat_template: str | None, generation_prompt: str | None
) -> ReasoningFormat | None:
    """The reasoning format a chat template implies (see the module docstring);
    ``generation_prompt``: the template rendered for one user message, ready for the answer."""
    if not chat_template:
        return None
    if generation_prompt is not None and generation_prompt.rstrip().endswith("<think>"):
        return REASONING_FORMATS["deepseek-r1"]
    if "</think>" in chat_template:
        return REASONING_FORMATS["qwen3"]
    return None


def choose_reasoning(
    flag: str | None, chat_template: str | None, generation_prompt: str | None
) -> ReasoningFormat | None:
    """``--reasoning-format``: a named format, ``none``, or ``auto`` (detected)."""
    if flag in (None, "", "none"):
        return None
    if flag == "auto":
        return detect_reasoning(chat_template, generation_prompt)
    return REASONING_FORMATS[flag]


def thinks(fmt: ReasoningFormat | None, prompt: str) -> ReasoningFormat | None:
    """The reasoning format of one request: None when its prompt already closed the block."""
    if fmt is None or prompt.rstrip().endswith(fmt.close):
        return None
    return fmt


_START, _REASONING, _ANSWER = range(3)


class ReasoningSplitter:
    """Splits one choice's output into (reasoning, answer) deltas; ``feed`` then ``finish``.

    Text that could still be the start of a marker is held back until it is decided, so the
    split does not depend on how the text was cut into pieces."""

    def __init__(self, fmt: ReasoningFormat) -> None:
        self.fmt = fmt
        self._buf = ""
        self._state = _START
        self._answered = False  # the answer's leading whitespace is dropped

    def feed(self, text: str) -> tuple[str, str]:
        self._buf += text
        reasoning, answer = "", ""
        if self._state == _START:
            self._decide_start(final=False)
        if self._state == _REASONING:
            reasoning = self._reasoning()
        if self._state == _ANSWER:
            answer = self._answer()
        return reasoning, answer

    def finish(self) -> tuple[str, str]:
        if self._state == _START:
            self._decide_start(final=True)
        if self._state == _REASONING:
            reasoning, self._buf = self._buf, ""
            return reasoning, ""
        answer = self._answer() + self._buf
        self._buf = ""
        return "", answer

    def _decide_start(self, final: bool) -> None:
        head = self._buf.lstrip()
        if head.startswith(self.fmt.open):
            self._buf, self._state = head[len(self.fmt.open) :], _REASONING
        elif (not head or self.fmt.open.startswith(head)) and not final:
            return  # could still be the open marker
        else:
            self._state = _REASONING if self.fmt.starts_inside else _ANSWER

    def _reasoning(self) -> str:
        at = self._buf.find(self.fmt.close)
        if at >= 0:
            out, self._buf = self._buf[:at], self._buf[at + len(self.fmt.close) :]
            self._state = _ANSWER
            return out
        keep = _partial_tail(self._buf, self.fmt.close)
        out, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep :]
        return out

    def _answer(self) -> str:
        if not self._answered:
            self._buf = self._buf.lstrip()
            if not self._buf:
                return ""
            self._answered = True
        out, self._buf = self._buf, ""
        return out


def _partial_tail(text: str, marker: str) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0
