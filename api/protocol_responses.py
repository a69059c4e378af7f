"""The request body of ``POST /v1/responses`` (OpenAI's Responses API), and its chat request.

``/v1/responses`` is a translation over the chat path: ``chat_body`` turns a Responses request
into the body of a chat completion (``input`` items become messages, ``text.format`` the
``response_format``, flat function tools chat tools), so the chat path's templates, constraints,
tool calls and errors serve both endpoints.

As in the chat API, no field is silently ignored: a field the Responses API does not define is a
400 "Unrecognized request argument supplied", and a feature Corral does not offer (stored
responses, built-in tools, background mode, non-text input) is a 400 naming its field. Nothing is
stored: ``store`` absent means false here (OpenAI's default is true), and a request that needs a
stored response (``previous_response_id``, ``conversation``) is refused.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from corral.api.messages import StreamOptions
from corral.api.protocol import MAX_TOKENS_BOUND, _Request
from corral.api.response_formats import request_error

#: Corral's constraint formats (see the chat API's ``response_format``), accepted in text.format
CORRAL_FORMATS = ("regex", "grammar", "choice")
_FORMATS = ("text", "json_schema", "json_object", *CORRAL_FORMATS)
_TEXT_PARTS = ("input_text", "output_text", "text")
_ITEMS = ("message", "function_call", "function_call_output", "reasoning")
_NO_STORE = "this server stores no responses; send the whole conversation in input"


def _present(value: Any) -> bool:
    return value is not None


#: Responses fields (or values of them) Corral cannot honour: (field, refused when, why).
REFUSED = (
    ("previous_response_id", _present, _NO_STORE),
    ("conversation", _present, _NO_STORE),
    ("store", lambda v: v is True, "this server stores no responses; send false or leave it out"),
    ("background", lambda v: v is True, "background responses are not supported; send false"),
    ("prompt", _present, "stored prompt templates are not supported; send instructions and input"),
    ("reasoning", lambda v: bool(v) and any(x is not None for x in v.values()),
     "the served model has no reasoning settings; leave reasoning out"),
    ("include", bool, "no extra output data can be included; leave include out"),
    ("max_tool_calls", _present, "not supported; use parallel_tool_calls: false for one call"),
    ("top_logprobs", bool, "log probabilities are not supported on /v1/responses; use "
     "/v1/chat/completions"),
    ("truncation", lambda v: v == "auto",
     "the input is never truncated; send 'disabled' or leave it out"),
    ("service_tier", lambda v: v in ("flex", "scale", "priority"),
     "this server has a single service tier; send 'auto' or 'default'"),
    ("prompt_cache_retention", lambda v: v == "24h",
     "prompt prefixes are cached in memory only; send 'in_memory' or leave it out"),
)  # fmt: skip


class ResponsesRequest(_Request):
    """``POST /v1/responses``. ``input`` items and tools are kept as sent (JSON objects) and
    checked by :meth:`_check_items`; the chat request built from them types every field."""

    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    text: dict[str, Any] | None = Field(
        default=None, description="{format: text | json_schema | json_object | regex | grammar "
        "| choice}; json_schema is flat: {type, name, schema, strict, description}",
    )  # fmt: skip
    tools: list[dict[str, Any]] | None = Field(
        default=None, description="function tools only: {type: function, name, parameters, ...}"
    )
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_BOUND)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    speculative: bool = Field(
        default=True, description="Corral extension: false turns prompt-lookup speculation off"
    )
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = Field(
        default=None, max_length=16, description="accepted; echoed in the response, not stored"
    )
    user: str | None = Field(default=None, description="accepted; not used")
    safety_identifier: str | None = Field(default=None, max_length=64)
    prompt_cache_key: str | None = Field(
        default=None, description="accepted; prefix caching is automatic"
    )
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    store: bool | None = Field(default=None, description="only false: nothing is stored")
    background: bool | None = Field(default=None, description="only false")
    # refused unless absent (see REFUSED)
    previous_response_id: str | None = Field(default=None, description="not supported")
    conversation: str | dict[str, Any] | None = Field(default=None, description="not supported")
    prompt: dict[str, Any] | None = Field(default=None, description="not supported")
    reasoning: dict[str, Any] | None = Field(default=None, description="not supported")
    include: list[str] | None = Field(default=None, description="only empty")
    max_tool_calls: int | None = Field(default=None, description="not supported")
    top_logprobs: int | None = Field(default=None, ge=0, le=20, description="only 0")

    @model_validator(mode="after")
    def _check(self) -> ResponsesRequest:
        for name, refused, reason in REFUSED:
            if refused(getattr(self, name)):
                raise request_error((name,), reason)
        if self.stream_options is not None and not self.stream:
            raise request_error(("stream_options",), "stream_options needs stream: true")
        if self.metadata and any(len(k) > 64 for k in self.metadata):
            raise request_error(("metadata",), "metadata keys are at most 64 characters")
        if isinstance(self.input, list):
            _check_items(self.input)
        if self.text is not None:
            _check_text(self.text)
        for i, tool in enumerate(self.tools or ()):
            _check_tool(tool, i)
        if isinstance(self.tool_choice, dict):
            _check_tool_choice(self.tool_choice)
        return self

    def format(self) -> dict[str, Any]:
        """``text.format`` as sent (``{"type": "text"}`` when absent)."""
        return (self.text or {}).get("format") or {"type": "text"}


# -- shape checks: a clear 400 naming the field, before anything is translated ------------------


def _kind(value: Any, loc: tuple[str | int, ...], allowed: tuple[str, ...], what: str) -> str:
    if not isinstance(value, dict):
        raise request_error(loc, f"{what} must be an object")
    kind = value.get("type")
    if kind not in allowed:
        raise request_error(
            (*loc, "type"),
            f"{what} of type {kind!r} is not supported by this server; "
            f"use {', '.join(repr(a) for a in allowed)}",
        )
    return kind


def _check_items(items: list[dict[str, Any]]) -> None:
    for i, item in enumerate(items):
        kind = item.get("type", "message" if "role" in item else None)
        _kind({"type": kind}, ("input", i), _ITEMS, "an input item")
        if kind == "message":
            _check_content(item, i)
        elif kind == "function_call":
            _require_str(item, ("call_id", "name", "arguments"), i)
        elif kind == "function_call_output":
            _require_str(item, ("call_id",), i)
            if not isinstance(item.get("output"), str):
                _check_parts(item.get("output"), ("input", i, "output"))


def _check_content(item: dict[str, Any], i: int) -> None:
    if item.get("role") not in ("user", "assistant", "system", "developer"):
        raise request_error(
            ("input", i, "role"), "role must be 'user', 'assistant', 'system' or 'developer'"
        )
    content = item.get("content")
    if not isinstance(content, str):
        _check_parts(content, ("input", i, "content"))


def _check_parts(parts: Any, loc: tuple[str | int, ...]) -> None:
    if not isinstance(parts, list):
        raise request_error(loc, "must be a string or a list of text parts")
    for k, part in enumerate(parts):
        kind = _kind(part, (*loc, k), (*_TEXT_PARTS, "refusal"), "a content part (text only)")
        field = "refusal" if kind == "refusal" else "text"
        if not isinstance(part.get(field), str):
            raise request_error((*loc, k, field), f"{field} must be a string")


def _require_str(item: dict[str, Any], fields: tuple[str, ...], i: int) -> None:
    for f in fields:
        if not isinstance(item.get(f), str):
            raise request_error(("input", i, f), f"{f} must be a string")


def _check_text(text: dict[str, Any]) -> None:
    if text.get("verbosity") not in (None, "medium"):
        raise request_error(("text", "verbosity"), "the served model has no verbosity setting")
    if set(text) - {"format", "verbosity"}:
        extra = sorted(set(text) - {"format", "verbosity"})[0]
        raise request_error(("text", extra), f"Unrecognized request argument supplied: {extra}")
    fmt = text.get("format")
    if fmt is not None:
        _kind(fmt, ("text", "format"), _FORMATS, "text.format")


def _check_tool(tool: dict[str, Any], i: int) -> None:
    _kind(tool, ("tools", i), ("function",), "a tool (only function tools are served)")
    if not isinstance(tool.get("name"), str):
        raise request_error(("tools", i, "name"), "a function tool needs a name")


def _check_tool_choice(choice: dict[str, Any]) -> None:
    _kind(choice, ("tool_choice",), ("function",), "tool_choice")
    if not isinstance(choice.get("name"), str):
        raise request_error(("tool_choice", "name"), "tool_choice needs the function's name")


# -- Responses request -> chat request ------------------------------------------------------------


def chat_body(req: ResponsesRequest) -> dict[str, Any]:
    """The chat completion body that asks for the same generation as ``req``."""
    body: dict[str, Any] = {
        "model": req.model,
        "messages": messages(req),
        "temperature": req.temperature,
        "top_p": req.top_p,
        "max_completion_tokens": req.max_output_tokens,
        "stream": req.stream,
        "stream_options": {"include_usage": True} if req.stream else None,
        "response_format": _response_format(req.format()),
        "speculative": req.speculative,
    }
    if req.tools:
        body["tools"] = [_chat_tool(t) for t in req.tools]
        body["parallel_tool_calls"] = req.parallel_tool_calls
    if req.tool_choice is not None:
        choice = req.tool_choice
        body["tool_choice"] = (
            choice
            if isinstance(choice, str)
            else {"type": "function", "function": {"name": choice["name"]}}
        )
    return {k: v for k, v in body.items() if v is not None}


def _response_format(fmt: dict[str, Any]) -> dict[str, Any] | None:
    if fmt["type"] == "text":
        return None
    if fmt["type"] != "json_schema":
        return fmt  # json_object and Corral's formats have the chat shape already
    inner = {k: v for k, v in fmt.items() if k != "type"}
    return {"type": "json_schema", "json_schema": inner}


def _chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = {k: v for k, v in tool.items() if k != "type" and v is not None}
    return {"type": "function", "function": function}


def messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    """``instructions`` and ``input`` as chat messages; consecutive function calls (and the
    assistant text before them) become one assistant message with ``tool_calls``."""
    out: list[dict[str, Any]] = []
    if req.instructions:
        out.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        return [*out, {"role": "user", "content": req.input}]
    for item in req.input:
        kind = item.get("type", "message")
        if kind == "message":
            out.append({"role": item["role"], "content": _text(item["content"])})
        elif kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append(
                {"role": "tool", "tool_call_id": item["call_id"], "content": _text(item["output"])}
            )
        # reasoning items are not shown to the model again (chat templates drop past reasoning)
    return out


def _text(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text") or p.get("refusal") or "" for p in content)
