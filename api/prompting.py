"""Chat messages (with tools and tool-call history) -> the model's prompt token ids."""

from __future__ import annotations

import json
from typing import Any

import jinja2

from corral.api.errors import bad_request
from corral.api.protocol import (
    AssistantMessage,
    ChatCompletionRequest,
    SystemMessage,
    Tool,
    ToolMessage,
    content_text,
)
from corral.api.tools import ToolPlan, history_text, tools_system_prompt

_PROBE_TOOL = {
    "type": "function",
    "function": {"name": "probe_fn", "description": "probe", "parameters": {"type": "object"}},
}


class ChatFormatter:
    """Applies the model's chat template; knows whether the template renders ``tools`` itself.

    Templates that render tools (Llama 3.1, Qwen 2.5, Hermes…) get them as ``tools=`` and the
    history's tool calls in Hugging Face's shape. Templates that ignore them (SmolLM2) get a
    system-prompt description of the tools and tool calls written in Corral's tool-call format.
    """

    def __init__(self, tokenizer: Any, chat_template: str | None) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.native_tools = chat_template is not None and self._template_renders_tools()

    def _template_renders_tools(self) -> bool:
        probe = [{"role": "user", "content": "hi"}]
        try:
            with_tools = self._apply(probe, [_PROBE_TOOL])
            without = self._apply(probe, None)
        except Exception:  # a template that chokes on the probe does not handle tools natively
            return False
        return with_tools != without

    def _apply(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            tools=tools,
            chat_template=self.chat_template,
            add_generation_prompt=True,
            tokenize=False,
        )

    def prompt_text(self, req: ChatCompletionRequest, plan: ToolPlan) -> str:
        """The rendered prompt, ending where the assistant's reply starts (plus the plan's suffix)."""
        if self.chat_template is None:
            raise bad_request(
                "this model has no chat template; use /v1/completions with a plain prompt",
                param="messages",
            )
        tools = list(plan.tools) if plan.active else []
        messages = [self._message(m) for m in req.messages]
        if tools and not self.native_tools:
            messages = _with_tool_prompt(messages, tools)
        native = (
            [t.model_dump(exclude_none=True) for t in tools]
            if self.native_tools and tools
            else None
        )
        try:
            text = self._apply(messages, native)
        except jinja2.TemplateError as e:
            raise bad_request(
                f"the chat template refused these messages: {e}", param="messages"
            ) from e
        return text + plan.prompt_suffix

    def prompt_ids(self, req: ChatCompletionRequest, plan: ToolPlan) -> list[int]:
        text = self.prompt_text(req, plan)
        # The template already wrote any BOS it wants; do not let the tokenizer add another.
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _message(self, m: Any) -> dict[str, Any]:
        if isinstance(m, SystemMessage):
            return {"role": "system", "content": content_text(m.content)}
        if isinstance(m, ToolMessage):
            return {
                "role": "tool",
                "content": content_text(m.content),
                "tool_call_id": m.tool_call_id,
            }
        if isinstance(m, AssistantMessage):
            return self._assistant(m)
        return {"role": "user", "content": content_text(m.content)}

    def _assistant(self, m: AssistantMessage) -> dict[str, Any]:
        text = content_text(m.content)
        if not m.tool_calls:
            return {"role": "assistant", "content": text}
        if not self.native_tools:
            return {"role": "assistant", "content": history_text(m.tool_calls, text)}
        calls = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": _arguments(c)},
            }
            for c in m.tool_calls
        ]
        return {"role": "assistant", "content": text, "tool_calls": calls}


def _arguments(call: Any) -> Any:
    try:
        return json.loads(call.function.arguments or "{}")
    except json.JSONDecodeError as e:
        raise bad_request(
            f"tool call {call.id}: arguments are not valid JSON ({e})", param="messages"
        ) from e


def _with_tool_prompt(messages: list[dict[str, Any]], tools: list[Tool]) -> list[dict[str, Any]]:
    """Add the tools' description to the system prompt (creating one if there is none)."""
    description = tools_system_prompt(tools)
    if messages and messages[0]["role"] == "system":
        first = dict(messages[0])
        first["content"] = (first["content"] + "\n\n" + description).strip()
        return [first, *messages[1:]]
    return [{"role": "system", "content": description}, *messages]
