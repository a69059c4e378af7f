"""POST /v1/chat/completions: prepare (validate, template, compile), then answer or stream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from corral.api.choices import ChoiceState, LogprobFormatter, Update
from corral.api.engine_call import (
    Admitted,
    EngineCall,
    framed_stream,
    require_engine,
    watch_disconnect,
)
from corral.api.errors import bad_request
from corral.api.protocol import ChatCompletionRequest, TextFormat
from corral.api.reasoning import ReasoningFormat
from corral.api.receipts import enforce
from corral.api.request_constraint import after_reasoning, chat_constraint
from corral.api.request_params import (
    budget_json,
    check_model,
    sampling_params,
    usage,
    with_budget_close,
)
from corral.api.responses import (
    ApiJSONResponse,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatMessageOut,
    ChunkChoice,
    Delta,
    FunctionCallDelta,
    Receipt,
    ToolCallDelta,
    Unenforced,
    dump,
    new_id,
    now,
)
from corral.api.sse import data_event
from corral.api.state import ServerState
from corral.api.tool_stream import Piece
from corral.api.tools import ToolPlan
from corral.engine.serving.core import ReasoningBudget

ENDPOINT = "chat.completions"


@dataclass
class PreparedChat:
    prompt_ids: list[int]
    params: Any
    constraint: Any
    plan: ToolPlan
    unenforced: list[Unenforced] | None
    reasoning: ReasoningFormat | None = None
    receipt: Receipt | None = None  # None: unconstrained

    def choices(self, n: int) -> dict[int, ChoiceState]:
        return {i: ChoiceState(i, self.plan, self.reasoning) for i in range(n)}


async def prepare_chat(
    state: ServerState, req: ChatCompletionRequest, request: Any
) -> PreparedChat:
    """Everything that can fail as the client's mistake, done before any response starts.

    Schema analysis, rendering and tokenizing run on threads (never on the event loop); the
    compile is abandoned if the client disconnects meanwhile."""
    tool_format = state.formatter.tool_format
    plan, constraint = await asyncio.to_thread(
        chat_constraint, req, state.config, tool_format, state.forms, None
    )
    limit = min(state.context_length, state.kv_capacity)
    # this request's think block: none where the prompt closed it (enable_thinking: false)
    prompt_ids, reasoning = await asyncio.to_thread(state.formatter.prompt, req, plan, limit)
    if constraint is not None and reasoning is not None:
        reasoning = reasoning.under_constraint()  # read as the grammar writes it
    stops = req.stop_list() if plan.mode != "required" else []  # a stop must not cut arguments
    params = sampling_params(state, req, len(prompt_ids), req.token_limit(), stops)
    if req.max_reasoning_tokens is not None and (reasoning or not state.formatter.reasoning):
        params = replace(params, reasoning_budget=_budget(reasoning, req.max_reasoning_tokens))
    markers = [*(tool_format.triggers if plan.active else ()), *_markers(reasoning)]
    if params.skip_special_tokens and _special(state.tokenizer, markers):
        params = replace(params, skip_special_tokens=False)  # the parsers must see the markers
    if constraint is None:
        return PreparedChat(prompt_ids, params, None, plan, None, reasoning)
    constraint = after_reasoning(constraint, reasoning)
    done = await enforce(state, request, constraint)
    params = await asyncio.to_thread(with_budget_close, state, params, req, constraint.spec)
    return PreparedChat(
        prompt_ids, params, done.compiled, plan, done.unenforced, reasoning, done.receipt
    )


def _markers(reasoning: ReasoningFormat | None) -> list[str]:
    return [reasoning.open, reasoning.close] if reasoning is not None else []


def _budget(reasoning: ReasoningFormat | None, tokens: int) -> ReasoningBudget:
    if reasoning is None:
        raise bad_request(
            "max_reasoning_tokens needs a reasoning model: start the server with "
            "--reasoning-format",
            param="max_reasoning_tokens",
        )
    return reasoning.budget(tokens)


def _special(tokenizer: Any, markers: list[str]) -> bool:
    """Whether any marker is one special token (dropped from the text unless kept)."""
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())
    for marker in markers:
        ids = tokenizer.encode(marker, add_special_tokens=False)
        if len(ids) == 1 and (ids[0] in special or _added_special(tokenizer, ids[0])):
            return True
    return False


def _added_special(tokenizer: Any, token_id: int) -> bool:
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    token = added.get(token_id)
    return bool(token is not None and getattr(token, "special", False))


async def chat_updates(
    prep: PreparedChat, call: EngineCall, n: int
) -> AsyncIterator[tuple[ChoiceState, Update]]:
    """Run a prepared chat request: each choice's updates as its engine outputs arrive.

    The one loop behind streamed and non-streamed chat answers (and any endpoint built on chat,
    such as ``/v1/responses``): content, reasoning and tool-call pieces in order; a choice's
    last update has ``state.finished`` set, and ``state.result()`` is then its final answer.
    Raises ``GenerationFailed`` for a failed choice (see ``EngineCall.outputs``)."""
    choices = prep.choices(n)
    async for out in call.outputs():
        c = choices[out.index]
        yield c, c.add(out)


async def create_chat_completion(
    state: ServerState, req: ChatCompletionRequest, request: Request
) -> JSONResponse | StreamingResponse:
    arrival = time.monotonic()
    check_model(state, req.model)
    if isinstance(req.response_format, TextFormat):
        req.response_format = None
    require_engine(state)
    with Admitted(state, ENDPOINT, arrival) as admitted:  # a 429 here, before any compile
        prep = await prepare_chat(state, req, request)
        call = EngineCall(state, prep.prompt_ids, prep.params, prep.constraint, arrival=arrival)
        if req.stream:
            return admitted.stream(_stream(state, req, prep, call, admitted), [call])
        return await _complete(state, req, prep, call, request)


async def _complete(
    state: ServerState,
    req: ChatCompletionRequest,
    prep: PreparedChat,
    call: EngineCall,
    request: Request,
) -> JSONResponse:
    choices: dict[int, ChoiceState] = {}
    watcher = asyncio.create_task(watch_disconnect(request, [call]))
    try:
        async for c, _ in chat_updates(prep, call, req.n):
            choices[c.index] = c
    finally:
        watcher.cancel()
        await call.close()
    lp = LogprobFormatter(state.tokenizer, req.top_logprobs or 0) if req.logprobs else None
    body = ChatCompletion(
        id=new_id("chatcmpl-"),
        created=now(),
        model=state.model_name,
        choices=[_final_choice(choices[i], lp) for i in sorted(choices)],
        usage=usage(call),
        unenforced=prep.unenforced,
        corral=prep.receipt,
    )
    return ApiJSONResponse(dump(body))


def _final_choice(c: ChoiceState, lp: LogprobFormatter | None) -> ChatChoice:
    r = c.result()
    message = ChatMessageOut(
        content=r.content, reasoning_content=r.reasoning, tool_calls=r.tool_calls or None
    )
    logprobs = lp.content(c.logprobs) if lp is not None else None
    return ChatChoice(
        index=c.index,
        message=message,
        finish_reason=r.finish_reason,
        logprobs=logprobs,
        budget_close=budget_json(c.budget_close),
    )


def _stream(
    state: ServerState,
    req: ChatCompletionRequest,
    prep: PreparedChat,
    call: EngineCall,
    admitted: Admitted,
) -> AsyncIterator[str]:
    return framed_stream(_events(state, req, prep, call), call.close, admitted)


async def _events(
    state: ServerState, req: ChatCompletionRequest, prep: PreparedChat, call: EngineCall
) -> AsyncIterator[str]:
    chunks = _ChunkMaker(state.model_name, prep.unenforced, prep.receipt)
    lp = LogprobFormatter(state.tokenizer, req.top_logprobs or 0) if req.logprobs else None
    first = None if prep.plan.active else ""  # tool calls: content stays null unless text comes
    for i in range(req.n):
        yield chunks.sse(i, Delta(role="assistant", content=first))
    async for c, update in chat_updates(prep, call, req.n):
        for event in _update_events(chunks, c, update, lp):
            yield event
    if req.stream_options is not None and req.stream_options.include_usage:
        yield chunks.usage_sse(usage(call))


def _update_events(
    chunks: _ChunkMaker, c: ChoiceState, update: Update, lp: LogprobFormatter | None
) -> list[str]:
    events = []
    # the released logprobs ride on the first event with output (or on the last one)
    pending = lp.content(update.logprobs) if lp is not None and update.logprobs else None
    if update.reasoning:
        events.append(chunks.sse(c.index, Delta(reasoning_content=update.reasoning)))
    if update.content:
        events.append(chunks.sse(c.index, Delta(content=update.content), logprobs=pending))
        pending = None
    if update.calls:
        calls = Delta(tool_calls=_call_deltas(update.calls))
        events.append(chunks.sse(c.index, calls, logprobs=pending))
        pending = None
    if c.finished:
        events.append(
            chunks.sse(
                c.index,
                Delta(),
                finish_reason=c.result().finish_reason,
                logprobs=pending,
                budget_close=budget_json(c.budget_close),
            )
        )
    return events


def _call_deltas(pieces: list[Piece]) -> list[ToolCallDelta]:
    """Tool-call deltas, one per call: its start (id, type and name) and/or its new arguments."""
    deltas: list[ToolCallDelta] = []
    for p in pieces:
        if deltas and deltas[-1].index == p.index:
            deltas[-1].function.arguments += p.arguments
        elif p.name is not None:
            function = FunctionCallDelta(name=p.name, arguments=p.arguments)
            deltas.append(ToolCallDelta(index=p.index, id=p.id, type="function", function=function))
        else:
            deltas.append(
                ToolCallDelta(index=p.index, function=FunctionCallDelta(arguments=p.arguments))
            )
    return deltas


class _ChunkMaker:
    """Builds ``chat.completion.chunk`` SSE events sharing one id and creation time."""

    def __init__(
        self, model: str, unenforced: list[Unenforced] | None, receipt: Receipt | None
    ) -> None:
        self.id, self.created, self.model = new_id("chatcmpl-"), now(), model
        self.unenforced, self.receipt = unenforced, receipt  # sent once, on the first chunk

    def sse(
        self,
        index: int,
        delta: Delta,
        finish_reason: str | None = None,
        logprobs: Any = None,
        budget_close: dict[str, Any] | None = None,
    ) -> str:
        choice = ChunkChoice(
            index=index,
            delta=delta,
            finish_reason=finish_reason,
            logprobs=logprobs,
            budget_close=budget_close,
        )
        return self._event(ChatCompletionChunk(**self._common(), choices=[choice]))

    def usage_sse(self, u: Any) -> str:
        return self._event(ChatCompletionChunk(**self._common(), choices=[], usage=u))

    def _common(self) -> dict[str, Any]:
        common: dict[str, Any] = {"id": self.id, "created": self.created, "model": self.model}
        if self.unenforced:
            common["unenforced"], self.unenforced = self.unenforced, None
        if self.receipt is not None:
            common["corral"], self.receipt = self.receipt, None
        return common

    @staticmethod
    def _event(chunk: ChatCompletionChunk) -> str:
        return data_event(chunk.model_dump_json(exclude_none=True))
