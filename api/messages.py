"""The parts of a request body shared by both endpoints: messages, tools, stream options.

Nested objects tolerate fields they do not know (clients pass back assistant messages with
``annotations`` and the like); the fields they have are strictly typed. Re-exported by
``protocol``, which holds the request bodies themselves.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Open(BaseModel):
    """A nested object that tolerates fields it does not know (e.g. an assistant message a
    client passes back with ``annotations``); its own fields are strictly typed."""

    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


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


class StreamOptions(_Closed):
    include_usage: bool = False
    include_obfuscation: bool = Field(
        default=True, description="accepted; Corral's stream events carry no obfuscation padding"
    )
