"""Response bodies in OpenAI's shapes (chat, chunks, completions, models, errors).

They serve as the OpenAPI document's response schemas; handlers serialise them with
``exclude_none`` so absent optional fields are left out rather than sent as null.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

FinishReason = Literal["stop", "length", "tool_calls", "content_filter"]


def new_id(prefix: str) -> str:
    """An OpenAI-style id: ``chatcmpl-…``, ``cmpl-…``, ``call_…``."""
    return prefix + secrets.token_hex(12)


def now() -> int:
    return int(time.time())


class SpeculativeUsage(BaseModel):
    """Corral extension: prompt-lookup speculation for one request (all its choices)."""

    proposed_tokens: int = Field(description="draft tokens proposed and verified")
    accepted_tokens: int = Field(description="of those, the ones the sampled tokens confirmed")
    acceptance_rate: float


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int] | None = None
    speculative: SpeculativeUsage | None = Field(
        default=None,
        description="Corral extension: prompt-lookup speculation's draft tokens (absent when "
        "none were proposed); outputs are the same with or without it",
    )


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)
    # Corral extension: how the token was produced, and what the constraint allowed there.
    provenance: Literal["sampled", "forced", "closed"] = Field(
        default="sampled",
        description="Corral extension. sampled: drawn from the model's distribution; forced: "
        "decided by the grammar (its mask allowed only this token, or jump-forward proposed it "
        "from the text the grammar forces and the draw confirmed it); closed: appended to end "
        "the output at a budget (budget closing at max_tokens, or a reasoning budget's end "
        "marker). Forced tokens appended without a draw and closed ones have logprob 0.",
    )
    allowed_tokens: int | None = Field(
        default=None,
        description="Corral extension: how many tokens the step's mask allowed (the whole "
        "vocabulary when unconstrained); absent for closed tokens, which were not drawn",
    )


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class FunctionCallOut(BaseModel):
    name: str
    arguments: str


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class Unenforced(BaseModel):
    """Corral extension (lenient mode): a schema keyword that was not enforced."""

    pointer: str
    keyword: str
    reason: str
    param: str | None = None


class Rewrite(BaseModel):
    """A change Corral made to the request's constraint before compiling it."""

    rewrite: Literal["close_objects", "tool_calls", "after_reasoning", "keyword"] = Field(
        description="close_objects: objects silent about extra keys get only their declared "
        "properties; tool_calls: the tools became one structural tag in the model's call "
        "format; after_reasoning: the constraint starts after the think block; keyword: the "
        "schema analysis rewrote one keyword into a form the backend enforces exactly"
    )
    param: str | None = Field(default=None, description="the request field it applies to")
    pointer: str | None = Field(
        default=None, description="keyword: the JSON pointer of the keyword within param"
    )
    keyword: str | None = Field(default=None, description="keyword: the schema keyword")
    detail: str | None = Field(
        default=None,
        description="tool_calls: the call format; after_reasoning: the reasoning format; "
        "keyword: what was done, a fixed name such as 'oneOf->anyOf (branches disjoint)'",
    )


class Receipt(BaseModel):
    """Corral extension ``corral``: what enforced this response's constraint."""

    kind: str = Field(description="json_schema, json_object, regex, ebnf, lark, choice, ...")
    digest: str = Field(description="content digest of the constraint as compiled")
    cache_key: str = Field(description="its compiled-constraint cache key (digest, tokenizer, "
                           "cache format and grammar-code versions)")  # fmt: skip
    tokenizer: str = Field(description="fingerprint of the tokenizer it was compiled for")
    backend: str
    backend_version: str
    cache_format: str = Field(description="Corral's compiled-entry format . disk-store layout")
    analysis_version: str = Field(description="digest of Corral's grammar code (16 hex digits)")
    cache: str = Field(
        description="memory, disk or redis: a cache hit; compiled: compiled for this request; "
        "shared: this request waited for another caller's compile (or Redis load) of it"
    )
    compile_ms: float | None = Field(
        default=None, description="the compile's duration, when cache is 'compiled'"
    )
    exact: bool = Field(description="true: every keyword is enforced exactly")
    rewrites: list[Rewrite] = Field(default_factory=list)
    unenforced: list[Unenforced] = Field(
        default_factory=list, description="lenient mode: the keywords not enforced, with pointers"
    )


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = Field(
        default=None, description="the think block of a reasoning model (--reasoning-format)"
    )
    refusal: str | None = None
    tool_calls: list[ToolCallOut] | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    finish_reason: FinishReason
    logprobs: ChoiceLogprobs | None = None
    budget_close: dict[str, Any] | None = Field(
        default=None,
        description="Corral extension (in the last chunk when streamed): what budget closing "
        "did: steered, cut_short (JSON pointers), complete, reason",
    )


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None
    unenforced: list[Unenforced] | None = Field(
        default=None, description="Corral extension: what lenient mode did not enforce"
    )
    corral: Receipt | None = Field(
        default=None, description="Corral extension: the constraint's receipt (constrained only)"
    )


class FunctionCallDelta(BaseModel):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta | None = None


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: Delta
    finish_reason: FinishReason | None = None
    logprobs: ChoiceLogprobs | None = None
    budget_close: dict[str, Any] | None = Field(
        default=None,
        description="Corral extension (in the last chunk when streamed): what budget closing "
        "did: steered, cut_short (JSON pointers), complete, reason",
    )


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    unenforced: list[Unenforced] | None = None
    corral: Receipt | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: FinishReason | None = None
    logprobs: CompletionLogprobs | None = None
    budget_close: dict[str, Any] | None = Field(
        default=None,
        description="Corral extension (in the last chunk when streamed): what budget closing "
        "did: steered, cut_short (JSON pointers), complete, reason",
    )


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    unenforced: list[Unenforced] | None = None
    corral: Receipt | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "corral"
    context_length: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None
    pointer: str | None = Field(default=None, description="Corral: JSON pointer into the schema")
    keyword: str | None = Field(default=None, description="Corral: the schema keyword involved")
    limit: str | None = Field(
        default=None, description="Corral: the bound a too complex constraint would exceed"
    )


class ErrorResponse(BaseModel):
    error: ErrorDetail


def dump(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json", exclude_none=True)


class ApiJSONResponse(JSONResponse):
    """A JSON response that renders any Python string, lone surrogates included.

    A client may send ``"\\ud800"`` (valid JSON, not encodable as UTF-8); when an error message
    quotes it, the body is written with ASCII escapes instead of failing with a 500.
    """

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, allow_nan=False, separators=(",", ":")).encode("ascii")
