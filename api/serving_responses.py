"""POST /v1/responses: a Responses request runs as the chat completion it translates to.

The request becomes a ``ChatCompletionRequest`` (``protocol_responses.chat_body``) and goes
through ``create_chat_completion`` unchanged: admission, templates, constraints, tool calls,
failures and metrics are the chat path's. Its answer (a chat completion, or its stream of
chunks) is translated back by ``responses_output``. Errors keep the chat path's status and code;
their ``param`` (and the message that quotes it) is renamed to the Responses field the client
sent (``response_format.json_schema.schema`` -> ``text.format.schema``, ``messages`` ->
``input``, ``tools[0].function.parameters`` -> ``tools[0].parameters``).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from corral.api.engine_call import GuardedStream
from corral.api.errors import ApiError, _validation_error, as_api_error, status_of
from corral.api.protocol import ChatCompletionRequest
from corral.api.protocol_responses import ResponsesRequest, chat_body
from corral.api.responses import ApiJSONResponse
from corral.api.responses_output import ResponseDraft, Translator, message_delta
from corral.api.serving_chat import create_chat_completion
from corral.api.state import ServerState

_TOOL_FIELD = re.compile(r"^tools\[(\d+)\]\.function(?=\.|$)")
_RENAMES = (
    ("response_format.json_schema", "text.format"),
    ("response_format", "text.format"),
    ("max_completion_tokens", "max_output_tokens"),
)


def responses_param(param: str | None) -> str | None:
    """The Responses field a chat request field came from."""
    if param is None:
        return None
    if param.startswith("messages"):
        return "input"  # instructions and merged function calls shift the message indices
    for old, new in _RENAMES:
        if param == old or param.startswith(old + "."):
            return new + param[len(old) :]
    return _TOOL_FIELD.sub(r"tools[\1]", param)


def renamed(error: ApiError) -> ApiError:
    """``error`` with its ``param`` (and the message's mention of it) in Responses terms."""
    new = responses_param(error.param)
    if new != error.param and error.param:
        error.message = error.message.replace(error.param, new or "")
        error.param = new
    return error


def _chat_request(req: ResponsesRequest) -> ChatCompletionRequest:
    body = chat_body(req)
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        raise renamed(_validation_error(RequestValidationError(e.errors(), body=body))) from e


async def create_response(
    state: ServerState, req: ResponsesRequest, request: Request
) -> JSONResponse | GuardedStream:
    chat = _chat_request(req)
    try:
        answer = await create_chat_completion(state, chat, request)
    except Exception as e:
        if status_of(e) >= 500:
            raise  # the chat path's own failure: answered (and logged) by the error handlers
        raise renamed(as_api_error(e)) from e
    draft = ResponseDraft(req, state.model_name)
    if isinstance(answer, GuardedStream):
        return GuardedStream(_events(answer.body_iterator, draft), answer.on_close)
    completion = json.loads(answer.body)
    _take_extras(draft, completion)
    t = Translator(draft)
    choice = completion["choices"][0]
    t.delta(message_delta(choice["message"]), choice["finish_reason"])
    return ApiJSONResponse(draft.body())


def _take_extras(draft: ResponseDraft, chat: dict[str, Any]) -> None:
    """Usage, the constraint's receipt and lenient mode's report (with Responses field names)
    from a chat body/chunk."""
    if chat.get("usage"):
        draft.set_usage(chat["usage"])
    if chat.get("corral"):
        draft.receipt = _renamed_receipt(chat["corral"])
    if chat.get("unenforced"):
        draft.unenforced = _renamed_params(chat["unenforced"])


def _renamed_receipt(receipt: dict[str, Any]) -> dict[str, Any]:
    """A chat receipt with the Responses API's field names in its rewrites and report."""
    fields = ("rewrites", "unenforced")
    return receipt | {f: _renamed_params(receipt.get(f) or []) for f in fields}


def _renamed_params(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        item | {"param": responses_param(item["param"])} if "param" in item else item
        for item in items
    ]


async def _events(chunks: AsyncIterator[Any], draft: ResponseDraft) -> AsyncIterator[str]:
    """The chat stream's chunks (``data: {...}``) as Responses events."""
    t = Translator(draft)
    async with aclosing(chunks):  # a client that leaves closes the chat stream at once
        async for sse in chunks:
            for chunk in _chunks(sse.decode() if isinstance(sse, bytes) else sse):
                if "error" in chunk:
                    for event in t.fail(chunk["error"]):
                        yield event
                    return
                _take_extras(draft, chunk)
                for choice in chunk.get("choices") or ():
                    for event in t.delta(choice.get("delta") or {}, choice.get("finish_reason")):
                        yield event
    for event in t.end():
        yield event


def _chunks(text: str) -> list[dict[str, Any]]:
    """The JSON payloads of the ``data:`` lines in a piece of the chat stream."""
    data = (line[5:].strip() for line in text.splitlines() if line.startswith("data:"))
    return [json.loads(d) for d in data if d != "[DONE]"]


_EVENT = {
    "type": "object",
    "required": ["type", "sequence_number"],
    "properties": {"type": {"type": "string"}, "sequence_number": {"type": "integer"}},
}
#: The OpenAPI description of a 200 (the Response object, or with stream=true its events).
RESPONSE_DOC: dict[str, Any] = {
    "description": "a Response object; with stream=true, server-sent events (event: <type>)",
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["id", "object", "created_at", "status", "model", "output"],
                "properties": {
                    "id": {"type": "string"},
                    "object": {"const": "response"},
                    "created_at": {"type": "integer"},
                    "status": {"enum": ["completed", "incomplete"]},
                    "model": {"type": "string"},
                    "output": {"type": "array", "items": {"type": "object"}},
                    "usage": {"type": "object"},
                },
            }
        },
        "text/event-stream": {
            "itemSchema": {
                "type": "object",
                "required": ["data"],
                "properties": {
                    "event": {"type": "string"},
                    "data": {"contentMediaType": "application/json", "contentSchema": _EVENT},
                },
            }
        },
    },
}
