"""Request bodies: OpenAI's chat and completions APIs, vLLM's and SGLang's extensions, Corral's.

No parameter is silently ignored. Every field of OpenAI's request schemas is accepted, and is
either honoured or refused with a 400 that names it (``REFUSED``); a field no API defines is a
400 "Unrecognized request argument supplied: <name>". ``null`` means absent, as in OpenAI's API.
Types are strict: ``"5"`` is not an integer and ``"true"`` not a boolean (an integer is a
number). A lone surrogate anywhere in the body (``"\\ud800"``) is a 400 naming where it is.

The constraint dialects of vLLM (``guided_*``, ``structured_outputs``) and SGLang (``regex``,
``json_schema``, ``ebnf``) are folded into ``response_format`` while parsing, so one function
(``response_formats.format_spec``) turns any of them into a ConstraintSpec; the folded format
remembers the field it came from (``param``) for error messages. Two constraints in one request
are a 400. See docs/serving.md, "Extensions (beyond OpenAI)", for what each field means.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from corral.api.messages import (
    AssistantMessage,
    FunctionDef,
    Message,
    NamedToolChoice,
    StreamOptions,
    SystemMessage,
    Tool,
    ToolCall,
    ToolChoice,
    ToolMessage,
    UserMessage,
    _Closed,
    content_text,
)
from corral.api.response_formats import (
    DIALECT_FIELDS,
    NO_WHITESPACE_PATTERN,
    ChoiceFormat,
    GrammarFormat,
    JsonObjectFormat,
    JsonSchemaFormat,
    JsonSchemaResponseFormat,
    RegexFormat,
    ResponseFormat,
    StructuredOutputs,
    TextFormat,
    fold_constraint,
    request_error,
)
from corral.grammar.core.input_checks import lone_surrogate_path

# The response formats are defined with the rest of the constraint logic; they are part of
# the request bodies too, so they can be imported from here.
__all__ = [
    "AssistantMessage", "ChatCompletionRequest", "ChoiceFormat", "CompletionRequest",
    "ConstraintRequest",
    "FunctionDef", "GrammarFormat", "JsonObjectFormat", "JsonSchemaFormat",
    "JsonSchemaResponseFormat", "NamedToolChoice", "RegexFormat", "ResponseFormat",
    "StructuredOutputs", "SystemMessage", "TextFormat", "Tool", "ToolCall", "ToolMessage",
    "UserMessage", "content_text",
]  # fmt: skip

#: Upper bound on max_tokens in the schema; the model's context length is checked per request.
MAX_TOKENS_BOUND = 131072
#: Most ``stop_token_ids`` (each is looked up for every generated token).
MAX_STOP_TOKEN_IDS = 256


# -- sampling shared by both endpoints ----------------------------------------------------------


class _Request(_Closed):
    """A request body: unknown top-level fields are refused, ``null`` means absent."""

    @model_validator(mode="wrap")
    @classmethod
    def _screen(cls, data: Any, handler: Any) -> Any:
        if isinstance(data, dict):
            found = lone_surrogate_path(data)
            if found is not None:
                path, in_key = found
                where = "a key of this object" if in_key else "the text"
                raise request_error(
                    path,
                    f"{where} contains a lone surrogate (an unpaired \\ud800-\\udfff escape): "
                    "it is not valid Unicode text",
                )
            known = {f.alias or name for name, f in cls.model_fields.items()}
            for key in data:
                if key not in known:
                    raise request_error(
                        (key,),
                        f"Unrecognized request argument supplied: {key}",
                        "unknown_parameter",
                    )
            data = {k: v for k, v in data.items() if v is not None}
        return handler(data)


class _Sampling(_Request):
    model: str
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    n: int = Field(default=1, ge=1, description="at most the server's --max-n (default 8)")
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = Field(
        default=None, description="not supported: refused with a 400 unless empty"
    )
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, description="accepted; not used")
    response_format: ResponseFormat | None = None
    open_objects: bool | None = Field(
        default=None,
        description="Corral extension. false: an object whose schema declares properties and "
        "is silent about extra keys gets only the declared ones (the output stays valid); "
        "true: undeclared properties may be generated too; absent: the server's default",
    )
    budget_close: bool = Field(
        default=True,
        description="Corral extension. true: a json_schema output that max_tokens would cut is "
        "steered to close as a valid instance (finish_reason stays length; the choice's "
        "budget_close says what was cut short); false: cut like every peer does",
    )
    speculative: bool = Field(
        default=True,
        description="Corral extension. true (the default): prompt-lookup speculation where the server has it on (drafts copied from the prompt and output, verified exactly: the output is the same, only faster); false: off for this request",
    )
    # vLLM's and SGLang's sampling extensions
    top_k: int | None = Field(default=None, ge=-1, lt=2**31, description="0 or -1: off")
    min_p: float | None = Field(default=None, ge=0, le=1)
    repetition_penalty: float | None = Field(
        default=None, gt=0, le=2, description="1: off; > 1 discourages tokens already seen"
    )
    min_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS_BOUND)
    ignore_eos: bool = False
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None, max_length=MAX_STOP_TOKEN_IDS
    )
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = Field(
        default=False, description="only false is supported (true is refused with a 400)"
    )
    # vLLM's and SGLang's constraint fields, folded into response_format
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = Field(default=None, min_length=1)
    guided_choice: list[str] | None = Field(default=None, min_length=1)
    guided_grammar: str | None = Field(default=None, min_length=1)
    guided_decoding_backend: str | None = Field(
        default=None, description="only 'auto' is accepted: Corral picks its backends itself"
    )
    guided_whitespace_pattern: str | None = Field(
        default=None, description="not supported: refused with a 400"
    )
    structured_outputs: StructuredOutputs | None = None
    regex: str | None = Field(default=None, min_length=1, description="SGLang: a regex")
    json_schema: str | dict[str, Any] | None = Field(
        default=None, description="SGLang: a JSON schema (as JSON text)"
    )
    ebnf: str | None = Field(default=None, min_length=1, description="SGLang: an EBNF grammar")

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and len(stop) > 4:
            raise ValueError("at most 4 stop sequences are allowed")
        return stop

    @field_validator("logit_bias")
    @classmethod
    def _check_logit_bias(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        if bias:
            raise ValueError("logit_bias is not supported by this server; leave it out")
        return bias

    @field_validator("include_stop_str_in_output")
    @classmethod
    def _check_stop_str(cls, include: bool) -> bool:
        if include:
            raise ValueError("only false is supported: stop strings are never in the output")
        return include

    @field_validator("guided_decoding_backend")
    @classmethod
    def _check_backend(cls, backend: str | None) -> str | None:
        if backend not in (None, "auto"):
            raise ValueError(
                "Corral chooses the grammar backend per constraint (every one is enforced "
                "exactly); send 'auto' or leave it out"
            )
        return backend

    @field_validator("guided_whitespace_pattern")
    @classmethod
    def _check_whitespace(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            raise ValueError(NO_WHITESPACE_PATTERN)
        return pattern

    @model_validator(mode="after")
    def _check_stream_options(self) -> _Sampling:
        if self.stream_options is not None and not self.stream:
            raise request_error(("stream_options",), "stream_options needs stream: true")
        return self

    @model_validator(mode="after")
    def _fold(self) -> _Sampling:
        """vLLM's and SGLang's constraint fields become ``response_format`` (see constraints)."""
        values = {name: getattr(self, name) for name, _ in DIALECT_FIELDS}
        self.response_format = fold_constraint(  # type: ignore[assignment]
            self.response_format, values, self.structured_outputs
        )
        return self

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        return [s for s in stops if s]


# -- the two endpoints --------------------------------------------------------------------------


def _present(value: Any) -> bool:
    return value is not None


#: OpenAI chat fields (or values of them) Corral cannot honour: (field, refused when, why).
REFUSED: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("audio", _present, "audio output is not supported: this server generates text only"),
    ("modalities", lambda v: v is not None and "audio" in v,
     "audio output is not supported: this server generates text only; send ['text']"),
    ("prediction", _present, "predicted outputs are not supported by this server"),
    ("web_search_options", _present, "web search is not supported by this server"),
    ("reasoning_effort", _present, "the served model has no reasoning effort setting"),
    ("verbosity", _present, "the served model has no verbosity setting"),
    ("functions", _present, "the deprecated functions API is not supported; send tools"),
    ("function_call", _present, "the deprecated functions API is not supported; send tool_choice"),
    ("store", lambda v: v is True, "this server stores no completions; send false or leave it out"),
    ("service_tier", lambda v: v in ("flex", "scale", "priority"),
     "this server has a single service tier; send 'auto' or 'default'"),
    ("prompt_cache_retention", lambda v: v == "24h",
     "prompt prefixes are cached in memory only; send 'in-memory' or leave it out"),
)  # fmt: skip
_NOT_SUPPORTED = "not supported: refused with a 400 unless absent or null"


class ChatCompletionRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_BOUND)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_BOUND)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    max_reasoning_tokens: int | None = Field(
        default=None,
        ge=0,
        le=MAX_TOKENS_BOUND,
        description="with --reasoning-format: the think block is closed after this many tokens",
    )
    chat_template_kwargs: dict[str, Any] | None = Field(
        default=None,
        max_length=32,
        description="extra variables for the chat template, e.g. {'enable_thinking': false} "
        "(Qwen3, SmolLM3); names Corral passes itself are refused",
    )
    # accepted; they do not change the output
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = Field(
        default=None, max_length=16, description="accepted; not stored"
    )
    prompt_cache_key: str | None = Field(
        default=None, description="accepted; prefix caching is automatic"
    )
    prompt_cache_retention: Literal["in-memory", "24h"] | None = Field(
        default=None, description="only 'in-memory' (the radix prefix cache)"
    )
    safety_identifier: str | None = Field(default=None, max_length=64)
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = Field(
        default=None, description="'auto' and 'default' are served; other tiers are refused"
    )
    store: bool | None = Field(default=None, description="only false: no completions are stored")
    modalities: list[Literal["text", "audio"]] | None = Field(
        default=None, description="only ['text']"
    )
    # refused unless absent
    audio: dict[str, Any] | None = Field(default=None, description=_NOT_SUPPORTED)
    prediction: dict[str, Any] | None = Field(default=None, description=_NOT_SUPPORTED)
    web_search_options: dict[str, Any] | None = Field(default=None, description=_NOT_SUPPORTED)
    reasoning_effort: str | None = Field(default=None, description=_NOT_SUPPORTED)
    verbosity: str | None = Field(default=None, description=_NOT_SUPPORTED)
    functions: list[dict[str, Any]] | None = Field(default=None, description=_NOT_SUPPORTED)
    function_call: str | dict[str, Any] | None = Field(default=None, description=_NOT_SUPPORTED)

    @model_validator(mode="after")
    def _check_chat(self) -> ChatCompletionRequest:
        for name, refused, reason in REFUSED:
            if refused(getattr(self, name)):
                raise request_error((name,), reason)
        if self.metadata and any(len(k) > 64 for k in self.metadata):
            raise request_error(("metadata",), "metadata keys are at most 64 characters")
        if self.top_logprobs and not self.logprobs:
            raise request_error(("top_logprobs",), "top_logprobs requires logprobs to be true")
        if self.tool_choice not in (None, "none") and not self.tools:
            raise request_error(("tool_choice",), "tool_choice was given without any tools")
        if self.tools:
            self._check_tools(self.tools)
        return self

    def _check_tools(self, tools: list[Tool]) -> None:
        names = [t.function.name for t in tools]
        if len(set(names)) != len(names):
            raise request_error(("tools",), "function names must be unique")
        if isinstance(self.tool_choice, NamedToolChoice):
            if self.tool_choice.function.name not in names:
                raise request_error(
                    ("tool_choice",),
                    f"tool_choice names {self.tool_choice.function.name!r}, which is not in tools",
                )
        fmt = self.response_format
        if self.tool_choice != "none" and fmt is not None and not isinstance(fmt, TextFormat):
            mode = self.tool_choice or "auto"
            raise request_error(
                tuple(fmt.param.split(".")),
                f"{fmt.param} cannot be combined with tools: with tool_choice "
                f"{mode if isinstance(mode, str) else 'a named function'!r} the tool calls "
                "constrain the output; send tool_choice 'none' or leave one of them out",
            )

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class ConstraintRequest(ChatCompletionRequest):
    """``POST /v1/constraints`` and ``/v1/constraints/validate``: a chat request's body, checked
    as one; ``messages`` and ``model`` may be left out. Only its constraint acts: the response
    format (in any dialect), ``tools`` / ``tool_choice`` / ``parallel_tool_calls`` and
    ``open_objects``; nothing is generated."""

    model: str | None = None  # type: ignore[assignment]
    messages: list[Message] = Field(default_factory=list)


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int = Field(default=16, ge=1, le=MAX_TOKENS_BOUND)
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False
    suffix: str | None = Field(default=None, description="not supported unless empty")
    best_of: int | None = Field(default=None, ge=1, description="only equal to n")

    @model_validator(mode="after")
    def _check_completion(self) -> CompletionRequest:
        if self.suffix:
            raise request_error(("suffix",), "suffix is not supported by this server")
        if self.best_of is not None and self.best_of != self.n:
            raise request_error(("best_of",), "best_of other than equal to n is not supported")
        if self.echo and self.logprobs is not None:
            raise request_error(("echo",), "echo with logprobs is not supported; drop one")
        return self
