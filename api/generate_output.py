"""What ``POST /generate`` answers, in SGLang's shapes: ``{"text", "meta_info"}`` per choice.

``meta_info`` holds ``id``, ``finish_reason`` (``{"type": "stop"}``, ``{"type": "length",
"length": max_new_tokens}``, ``{"type": "abort", ...}``, or null while a stream goes on),
``prompt_tokens``, ``completion_tokens``, ``cached_tokens`` and ``e2e_latency``; with
``return_logprob``, ``input_token_logprobs`` and ``output_token_logprobs`` (one ``[logprob,
token_id, text]`` triple per token; ``text`` is null unless ``return_text_in_logprobs``; each
input token's logprob is given the tokens before it, null for the prompt's first token only) and
``input_top_logprobs`` / ``output_top_logprobs`` (per position a list of such triples, or
null).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from corral.engine.serving.core import Output, TokenLogprob

FLOOR_LOGPROB = -9999.0  # a logprob JSON cannot carry (-inf) is reported as this


class TokenText:
    """Token id -> its text (``tokenizer.decode([id])``), cached."""

    def __init__(self, tokenizer: Any) -> None:
        self.text = lru_cache(maxsize=65536)(lambda i: tokenizer.decode([i]))


@dataclass
class ChoiceState:
    """One choice of one item, as it is built from the engine's outputs."""

    rid: str
    max_new_tokens: int
    logprobs: bool
    with_text: bool
    top: int
    prompt_ids: list[int]
    input_start: int | None  # where input logprobs start (None: none asked)
    text: str = ""
    output: list[TokenLogprob] = field(default_factory=list)
    input: list[TokenLogprob] | None = None
    finish: str | None = None
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0

    def add(self, out: Output) -> None:
        self.text += out.text
        self.completion_tokens += len(out.token_ids)
        self.prompt_tokens = out.num_prompt_tokens
        self.cached_tokens = out.num_cached_tokens
        if out.logprobs:
            self.output.extend(out.logprobs)
        if out.prompt_logprobs is not None:
            self.input = list(out.prompt_logprobs)
        if out.finish_reason is not None:
            self.finish = out.finish_reason

    def body(self, names: TokenText, arrival: float) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": self.rid,
            "finish_reason": self._finish(),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "e2e_latency": time.monotonic() - arrival,
        }
        if self.logprobs:
            meta.update(self._logprobs(names))
        return {"text": self.text, "meta_info": meta}

    def _finish(self) -> dict[str, Any] | None:
        if self.finish is None:
            return None
        if self.finish == "length":
            return {"type": "length", "length": self.max_new_tokens}
        if self.finish == "abort":
            return {"type": "abort", "message": "the request was aborted"}
        return {"type": "stop", "matched": None}

    def _logprobs(self, names: TokenText) -> dict[str, Any]:
        inputs, input_tops = self._inputs(names)
        outputs = [self._triple(lp.logprob, lp.token_id, names) for lp in self.output]
        output_tops = [self._tops(lp, names) for lp in self.output] if self.top else None
        return {
            "input_token_logprobs": inputs,
            "output_token_logprobs": outputs,
            "input_top_logprobs": input_tops,
            "output_top_logprobs": output_tops,
        }

    def _inputs(self, names: TokenText) -> tuple[list[Any], list[Any] | None]:
        """The prompt tokens from ``input_start`` on; the prompt's first token has no logprob
        (nothing precedes it)."""
        if self.input_start is None or self.input_start >= len(self.prompt_ids):
            return [], [] if self.top else None
        scored = self.input or []
        triples = [self._triple(lp.logprob, lp.token_id, names) for lp in scored]
        tops = [self._tops(lp, names) for lp in scored] if self.top else None
        if self.input_start == 0:
            triples.insert(0, self._triple(None, self.prompt_ids[0], names))
            if tops is not None:
                tops.insert(0, None)
        return triples, tops

    def _triple(self, value: float | None, token_id: int, names: TokenText) -> list[Any]:
        if value is not None and not math.isfinite(value):
            value = FLOOR_LOGPROB
        return [value, token_id, names.text(token_id) if self.with_text else None]

    def _tops(self, lp: TokenLogprob, names: TokenText) -> list[list[Any]]:
        return [self._triple(v, i, names) for i, v in lp.top[: self.top] if math.isfinite(v)]
