"""Request bodies, mirroring OpenAI's chat and completions APIs plus Corral's extensions.

OpenAI's own fields keep OpenAI's names, types and bounds. Unknown top-level fields are ignored
(clients and frameworks send fields this server has no use for, such as ``user`` or ``store``).
Corral's extensions are extra ``response_format`` types (``regex``, ``grammar``, ``choice``) and
the meaning of ``strict: false`` (lenient mode); see the README.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

#: Most choices one request may ask for (``n``); each is a full generation.
MAX_N = 8
#: Upper bound on max_tokens in the schema; the model's context length is checked per request.
MAX_TOKENS_BOUND = 131072


class _Open(BaseModel):
    """A body that ignores fields it does not know (as most OpenAI-compatible servers do)."""

    model_config = ConfigDict(extra="ignore")


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- messages ---------------------------------------------------------------------------------


class TextPart(_Open):
    type: Literal["text"]
    text: str


Content = str | list[TextPart]


class FunctionCall(_Open):
    name: str
    arguments: str = Field(description="the arguments as a JSON object in a string")


class ToolCall(_Open):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class SystemMessage(_Open):
    role: Literal["system", "developer"]
    content: Content
    name: str | None = None


class UserMessage(_Open):
    role: Literal["user"]
    content: Content
    name: str | None = None


class AssistantMessage(_Open):
    role: Literal["assistant"]
    content: Content | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    refusal: str | None = None


class ToolMessage(_Open):
    role: Literal["tool"]
    content: Content
    tool_call_id: str


Message = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")
]


def content_text(content: Content | None) -> str:
    """The text of a message's content: the string, or its text parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content)


# -- response_format ----------------------------------------------------------------------------


class JsonSchemaFormat(_Open):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    name: str = Field(max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    schema_: dict[str, Any] | bool = Field(default=True, alias="schema")
    strict: bool | None = Field(
        default=None,
        description="true or absent: every keyword is enforced exactly or the request fails (400); "
        "false: lenient, keywords that cannot be enforced are listed in the response",
    )


class TextFormat(_Closed):
    type: Literal["text"]


class JsonObjectFormat(_Closed):
    type: Literal["json_object"]


class JsonSchemaResponseFormat(_Closed):
    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


class RegexFormat(_Closed):
    """Corral extension: the output matches this regular expression (whole output)."""

    type: Literal["regex"]
    regex: str = Field(min_length=1)


class GrammarFormat(_Closed):
    """Corral extension: the output is a sentence of this grammar (GBNF-style EBNF or Lark)."""

    type: Literal["grammar"]
    grammar: str = Field(min_length=1)
    syntax: Literal["ebnf", "lark"] = "ebnf"


class ChoiceFormat(_Closed):
    """Corral extension: the output is exactly one of these strings."""

    type: Literal["choice"]
    choice: list[str] = Field(min_length=1)


ResponseFormat = Annotated[
    TextFormat
    | JsonObjectFormat
    | JsonSchemaResponseFormat
    | RegexFormat
    | GrammarFormat
    | ChoiceFormat,
    Field(discriminator="type"),
]


# -- tools ------------------------------------------------------------------------------------


class FunctionDef(_Open):
    name: str = Field(max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None


class Tool(_Open):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Open):
    name: str


class NamedToolChoice(_Open):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class StreamOptions(_Open):
    include_usage: bool = False


# -- sampling shared by both endpoints ----------------------------------------------------------


class _Sampling(_Open):
    model: str
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    open_objects: bool | None = Field(
        default=None,
        description="Corral extension. false: an object whose schema declares properties and "
        "is silent about extra keys gets only the declared ones (the output stays valid); "
        "true: undeclared properties may be generated too; absent: the server's default",
    )

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

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        return [s for s in stops if s]


class ChatCompletionRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_BOUND)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_BOUND)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True

    @model_validator(mode="after")
    def _check_chat(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs to be true")
        if self.tool_choice not in (None, "none") and not self.tools:
            raise ValueError("tool_choice was given without any tools")
        if self.tools:
            names = [t.function.name for t in self.tools]
            if len(set(names)) != len(names):
                raise ValueError("tools: function names must be unique")
            if (
                isinstance(self.tool_choice, NamedToolChoice)
                and self.tool_choice.function.name not in names
            ):
                raise ValueError(
                    f"tool_choice names {self.tool_choice.function.name!r}, which is not in tools"
                )
        return self

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int = Field(default=16, ge=1, le=MAX_TOKENS_BOUND)
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1, le=MAX_N)

    @model_validator(mode="after")
    def _check_completion(self) -> CompletionRequest:
        if self.suffix:
            raise ValueError("suffix is not supported by this server; leave it out")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of is not supported (other than equal to n); leave it out")
        if self.echo and self.logprobs is not None:
            raise ValueError("echo with logprobs is not supported; drop one of them")
        return self
