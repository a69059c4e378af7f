"""POST /v1/chat/completions: prepare (validate, template, compile), then answer or stream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from corral.api.choices import ChoiceState, LogprobFormatter
from corral.api.config import ServerConfig
from corral.api.engine_call import (
    CLIENT_LEFT,
    Admitted,
    EngineCall,
    compile_for,
    require_engine,
    watch_disconnect,
)
from corral.api.errors import ApiError, bad_request, error_events, status_of
from corral.api.limits import check_limits
from corral.api.protocol import ChatCompletionRequest, TextFormat
from corral.api.request_params import check_model, sampling_params, usage
from corral.api.response_formats import (
    FormatSpec,
    constraint_error,
    format_spec,
    unenforced_report,
    wants_closed_objects,
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
    ToolCallDelta,
    Unenforced,
    dump,
    new_id,
    now,
)
from corral.api.state import ServerState
from corral.api.tools import ToolPlan, plan_tools, tool_constraint_error, tool_unenforced
from corral.grammar import ConstraintError

ENDPOINT = "chat.completions"


@dataclass
class PreparedChat:
    prompt_ids: list[int]
    params: Any
    constraint: Any
    plan: ToolPlan
    unenforced: list[Unenforced] | None


def _plan(
    req: ChatCompletionRequest, closed: bool, config: ServerConfig
) -> tuple[ToolPlan, FormatSpec | None]:
    """The tool plan and the response format's constraint, within the request limits (schema
    analysis: slow, run off the event loop)."""
    check_limits(req, config)
    plan = plan_tools(req, closed)
    fmt = format_spec(req.response_format, closed)
    if plan.mode == "auto" and fmt is not None:
        raise bad_request(
            "response_format other than text cannot be combined with tool_choice 'auto'; "
            "use tool_choice 'required' or 'none'",
            param="response_format",
        )
    return plan, fmt


async def prepare_chat(
    state: ServerState, req: ChatCompletionRequest, request: Any
) -> PreparedChat:
    """Everything that can fail as the client's mistake, done before any response starts.

    Schema analysis, rendering and tokenizing run on threads (never on the event loop); the
    compile is abandoned if the client disconnects meanwhile."""
    closed = wants_closed_objects(req.open_objects, state.config.open_objects)
    plan, fmt = await asyncio.to_thread(_plan, req, closed, state.config)
    limit = min(state.context_length, state.kv_capacity)
    prompt_ids = await asyncio.to_thread(state.formatter.prompt_ids, req, plan, limit)
    stops = req.stop_list() if plan.mode != "required" else []  # a stop must not cut arguments
    params = sampling_params(state, req, len(prompt_ids), req.token_limit(), stops)
    if plan.spec is not None:
        all_tools = req.tools or []

        def refused(e: ConstraintError) -> ApiError:
            return tool_constraint_error(e, plan.tools, all_tools)

        if plan.calls_spec is not None:  # probed on its own (see ToolPlan.calls_spec)
            await compile_for(state, request, plan.calls_spec, refused)
        compiled = await compile_for(state, request, plan.spec, refused)
        found = [(u.pointer, u.keyword, u.reason) for u in compiled.unenforced]
        report = tool_unenforced(found + list(plan.unenforced), plan.tools, all_tools)
    elif fmt is not None:
        compiled = await compile_for(
            state, request, fmt.spec, lambda e: constraint_error(e, fmt.param)
        )
        report = unenforced_report(compiled, fmt.param)
    else:
        compiled, report = None, None
    return PreparedChat(prompt_ids, params, compiled, plan, report)


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
    choices = {i: ChoiceState(i, prep.plan) for i in range(req.n)}
    watcher = asyncio.create_task(watch_disconnect(request, [call]))
    try:
        async for out in call.outputs():
            choices[out.index].add(out)
    finally:
        watcher.cancel()
        await call.close()
    lp = LogprobFormatter(state.tokenizer, req.top_logprobs or 0) if req.logprobs else None
    body = ChatCompletion(
        id=new_id("chatcmpl-"),
        created=now(),
        model=state.model_name,
        choices=[_final_choice(c, lp) for c in choices.values()],
        usage=usage(call),
        unenforced=prep.unenforced,
    )
    return ApiJSONResponse(dump(body))


def _final_choice(c: ChoiceState, lp: LogprobFormatter | None) -> ChatChoice:
    parsed, finish = c.result()
    message = ChatMessageOut(content=parsed.content, tool_calls=parsed.tool_calls or None)
    logprobs = lp.content(c.logprobs) if lp is not None and not parsed.tool_calls else None
    return ChatChoice(index=c.index, message=message, finish_reason=finish, logprobs=logprobs)


async def _stream(
    state: ServerState,
    req: ChatCompletionRequest,
    prep: PreparedChat,
    call: EngineCall,
    admitted: Admitted,
) -> AsyncIterator[str]:
    chunks = _ChunkMaker(state.model_name, prep.unenforced)
    lp = LogprobFormatter(state.tokenizer, req.top_logprobs or 0) if req.logprobs else None
    choices = {i: ChoiceState(i, prep.plan) for i in range(req.n)}
    status = CLIENT_LEFT  # unless the stream reaches its end
    try:
        for i in choices:
            yield chunks.sse(i, Delta(role="assistant", content=""))
        async for out in call.outputs():
            c = choices[out.index]
            text, lps = c.add(out)
            if text:
                logprobs = lp.content(lps) if lp is not None else None
                yield chunks.sse(c.index, Delta(content=text), logprobs=logprobs)
            if c.finished:
                for event in _finish_events(chunks, c):
                    yield event
        if req.stream_options is not None and req.stream_options.include_usage:
            yield chunks.usage_sse(usage(call))
        yield "data: [DONE]\n\n"
        status = 200
    except Exception as e:  # after the first byte: an error event, then [DONE]
        status = status_of(e)
        for event in error_events(e):
            yield event
    finally:
        await call.close()
        admitted.end(status)


def _finish_events(chunks: _ChunkMaker, c: ChoiceState) -> list[str]:
    parsed, finish = c.result()
    events = []
    if parsed.tool_calls:
        for k, call in enumerate(parsed.tool_calls):
            delta = ToolCallDelta(
                index=k,
                id=call.id,
                type="function",
                function=FunctionCallDelta(
                    name=call.function.name, arguments=call.function.arguments
                ),
            )
            events.append(chunks.sse(c.index, Delta(tool_calls=[delta])))
    else:
        held, _ = c.held_text()
        if held:
            events.append(chunks.sse(c.index, Delta(content=held)))
    events.append(chunks.sse(c.index, Delta(), finish_reason=finish))
    return events


class _ChunkMaker:
    """Builds ``chat.completion.chunk`` SSE events sharing one id and creation time."""

    def __init__(self, model: str, unenforced: list[Unenforced] | None) -> None:
        self.id, self.created, self.model = new_id("chatcmpl-"), now(), model
        self.unenforced = unenforced  # sent once, on the first chunk

    def sse(
        self, index: int, delta: Delta, finish_reason: str | None = None, logprobs: Any = None
    ) -> str:
        choice = ChunkChoice(
            index=index, delta=delta, finish_reason=finish_reason, logprobs=logprobs
        )
        return self._event(ChatCompletionChunk(**self._common(), choices=[choice]))

    def usage_sse(self, u: Any) -> str:
        return self._event(ChatCompletionChunk(**self._common(), choices=[], usage=u))

    def _common(self) -> dict[str, Any]:
        common: dict[str, Any] = {"id": self.id, "created": self.created, "model": self.model}
        if self.unenforced:
            common["unenforced"], self.unenforced = self.unenforced, None
        return common

    @staticmethod
    def _event(chunk: ChatCompletionChunk) -> str:
        return f"data: {chunk.model_dump_json(exclude_none=True)}\n\n"
