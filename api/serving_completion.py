"""POST /v1/completions: plain prompts (text or token ids), one engine request per prompt."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from corral.api.choices import LogprobFormatter
from corral.api.engine_call import (
    Admitted,
    EngineCall,
    close_all,
    framed_stream,
    merged,
    require_engine,
    watch_disconnect,
)
from corral.api.errors import bad_request
from corral.api.outcomes import finish_reason
from corral.api.prompting import encode_prompt
from corral.api.protocol import CompletionRequest
from corral.api.receipts import Enforced, enforce
from corral.api.request_constraint import completion_constraint
from corral.api.request_params import (
    budget_json,
    check_model,
    sampling_params,
    speculative_usage,
    with_budget_close,
)
from corral.api.responses import (
    ApiJSONResponse,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    Usage,
    dump,
    new_id,
    now,
)
from corral.api.sse import data_event
from corral.api.state import ServerState

ENDPOINT = "completions"
MAX_PROMPTS = 16


def prompt_ids_list(state: ServerState, prompt: Any) -> list[list[int]]:
    """The request's prompts as token ids (text is tokenized with the tokenizer's own BOS rule).

    Slow for big prompts: call it off the event loop. A text prompt that cannot fit the context
    is refused before it is tokenized."""
    if isinstance(prompt, str):
        prompts: list[Any] = [prompt]
    elif prompt and all(isinstance(t, int) for t in prompt):
        prompts = [prompt]
    else:
        prompts = list(prompt)
    if not prompts:
        raise bad_request("prompt must not be empty", param="prompt")
    if len(prompts) > MAX_PROMPTS:
        raise bad_request(f"at most {MAX_PROMPTS} prompts per request", param="prompt")
    vocab = len(state.tokenizer)
    limit = min(state.context_length, state.kv_capacity)
    out = []
    for p in prompts:
        ids = encode_prompt(state.formatter, p, "prompt", limit) if isinstance(p, str) else list(p)
        if not ids:
            raise bad_request("a prompt must have at least one token", param="prompt")
        if any(not 0 <= t < vocab for t in ids):
            raise bad_request(f"token ids must be in [0, {vocab})", param="prompt")
        out.append(ids)
    return out


async def create_completion(
    state: ServerState, req: CompletionRequest, request: Request
) -> JSONResponse | StreamingResponse:
    arrival = time.monotonic()
    check_model(state, req.model)
    require_engine(state)
    with Admitted(state, ENDPOINT, arrival) as admitted:  # a 429 here, before any compile
        job = await _prepare(state, req, request, arrival)
        if req.stream:
            return admitted.stream(job.stream(admitted), job.calls)
        return await job.complete(request)


async def _prepare(
    state: ServerState, req: CompletionRequest, request: Request, arrival: float
) -> _Job:
    """Tokenize and analyse off the event loop, compile (abandoned if the client leaves)."""
    prompts = await asyncio.to_thread(prompt_ids_list, state, req.prompt)
    constraint = await asyncio.to_thread(completion_constraint, req, state.config, state.forms)
    params = [sampling_params(state, req, len(p), req.max_tokens, req.stop_list()) for p in prompts]
    done = await enforce(state, request, constraint) if constraint is not None else None
    if constraint is not None:
        params = [
            await asyncio.to_thread(with_budget_close, state, sp, req, constraint.spec)
            for sp in params
        ]
    compiled = done.compiled if done is not None else None
    calls = [
        EngineCall(state, p, sp, compiled, arrival=arrival)
        for p, sp in zip(prompts, params, strict=True)
    ]
    return _Job(state, req, calls, done)


class _Job:
    """The engine calls of one completions request and how their outputs become choices."""

    def __init__(
        self,
        state: ServerState,
        req: CompletionRequest,
        calls: list[EngineCall],
        enforced: Enforced | None,
    ) -> None:
        self.state, self.req, self.calls = state, req, calls
        # lenient mode's report and the receipt; a stream sends them with its first event only
        self.report = enforced.unenforced if enforced is not None else None
        self.receipt = enforced.receipt if enforced is not None else None
        self.id, self.created = new_id("cmpl-"), now()
        self.lp = (
            LogprobFormatter(state.tokenizer, req.logprobs or 0)
            if req.logprobs is not None
            else None
        )

    def _echo(self, k: int) -> str:
        return self.state.tokenizer.decode(self.calls[k].prompt_ids) if self.req.echo else ""

    def _index(self, k: int, out: Any) -> int:
        return k * self.req.n + out.index

    async def complete(self, request: Request) -> JSONResponse:
        texts: dict[int, str] = {}
        lps: dict[int, list[Any]] = {}
        finish: dict[int, str] = {}
        budget: dict[int, dict[str, Any] | None] = {}
        watcher = asyncio.create_task(watch_disconnect(request, self.calls))
        try:
            async for k, out in merged(self.calls):
                i = self._index(k, out)
                texts[i] = texts.get(i, self._echo(k)) + out.text
                lps.setdefault(i, []).extend(out.logprobs or ())
                if out.finish_reason is not None:
                    finish[i] = finish_reason(out.finish_reason)
                    budget[i] = budget_json(out.budget_close)
        finally:
            watcher.cancel()
            await close_all(self.calls)
        choices = [
            CompletionChoice(
                index=i,
                text=texts.get(i, ""),
                finish_reason=finish.get(i, "stop"),
                logprobs=self._logprobs(lps.get(i, [])),
                budget_close=budget.get(i),
            )
            for i in range(len(self.calls) * self.req.n)
        ]
        body = Completion(
            id=self.id,
            created=self.created,
            model=self.state.model_name,
            choices=choices,
            usage=self._usage(),
            unenforced=self.report,
            corral=self.receipt,
        )
        return ApiJSONResponse(dump(body))

    def _logprobs(self, lps: list[Any], offset: int = 0) -> CompletionLogprobs | None:
        if self.lp is None:
            return None
        entries = [self.lp.entry(lp) for lp in lps]
        offsets, pos = [], offset
        for e in entries:
            offsets.append(pos)
            pos += len(e.token)
        return CompletionLogprobs(
            tokens=[e.token for e in entries],
            token_logprobs=[e.logprob for e in entries],
            top_logprobs=[{t.token: t.logprob for t in e.top_logprobs} for e in entries],
            text_offset=offsets,
        )

    def _usage(self) -> Usage:
        prompt = sum(c.num_prompt_tokens for c in self.calls)
        completion = sum(c.num_output_tokens for c in self.calls)
        cached = sum(c.num_cached_tokens for c in self.calls)
        return Usage(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            prompt_tokens_details={"cached_tokens": cached},
            speculative=speculative_usage(self.calls),
        )

    def stream(self, admitted: Admitted) -> AsyncIterator[str]:
        return framed_stream(self._events(), self._close, admitted)

    async def _close(self) -> None:
        await close_all(self.calls)

    async def _events(self) -> AsyncIterator[str]:
        started: set[int] = set()
        offsets: dict[int, int] = {}
        async for k, out in merged(self.calls):
            i = self._index(k, out)
            text = out.text
            if i not in started:
                started.add(i)
                text = self._echo(k) + text
            lp = self._logprobs(list(out.logprobs or ()), offsets.get(i, 0))
            offsets[i] = offsets.get(i, 0) + len(text)
            finish = None if out.finish_reason is None else finish_reason(out.finish_reason)
            choice = CompletionChoice(
                index=i,
                text=text,
                finish_reason=finish,
                logprobs=lp,
                budget_close=budget_json(out.budget_close) if finish else None,
            )
            yield self._event([choice])
        if self.req.stream_options is not None and self.req.stream_options.include_usage:
            yield self._event([], self._usage())

    def _event(self, choices: list[CompletionChoice], usage: Usage | None = None) -> str:
        chunk = Completion(
            id=self.id,
            created=self.created,
            model=self.state.model_name,
            choices=choices,
            usage=usage,
            unenforced=self.report,
            corral=self.receipt,
        )
        self.report = self.receipt = None  # they go with the first event only
        return data_event(chunk.model_dump_json(exclude_none=True))
