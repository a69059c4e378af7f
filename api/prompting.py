"""Chat messages (with tools and tool-call history) -> the model's prompt token ids.

Rendering and tokenizing are slow for big prompts (a 10 MB prompt tokenizes for seconds), so
callers run them off the event loop, and ``encode_prompt`` refuses a prompt that cannot fit the
context before tokenizing it (see ``longest_token_chars``).
"""

from __future__ import annotations

import json
from typing import Any

import jinja2

from corral.api.errors import bad_request
from corral.api.protocol import (
    AssistantMessage,
    ChatCompletionRequest,
    SystemMessage,
    ToolMessage,
    content_text,
)
from corral.api.reasoning import ReasoningFormat, choose_reasoning, thinks
from corral.api.template_messages import (
    TOOL_SLOTS,
    placed,
    results_as_user_turns,
    template_kwargs,
    with_tool_prompt,
)
from corral.api.tool_formats import ToolFormat, choose_format
from corral.api.tools import ToolPlan, call_arguments, history_text
from corral.grammar.core.input_checks import lone_surrogate_at

_PROBE_TOOL = {
    "type": "function",
    "function": {"name": "probe_fn", "description": "probe", "parameters": {"type": "object"}},
}
_PROBE_CALL = {
    "id": "call_probe",
    "type": "function",
    "function": {"name": "probe_fn", "arguments": {"probe_arg": 1}},
}


class ChatFormatter:
    """Applies the model's chat template; knows where (and whether) the template takes tools.

    Templates that render tools (Llama 3.1, Qwen 2.5 / 3, Hermes, SmolLM3, Phi-4-mini…) get them
    where they read them (``tool_slot``, one of ``TOOL_SLOTS``), and the history's tool calls in
    Hugging Face's shape when they render those (``native_calls``), else written into the
    assistant's content in the tool-call format. Templates that ignore tools (SmolLM2, Gemma)
    get a system-prompt description of the tools and the calls written in the format.
    ``tool_format``: the format calls are written in (``tool_formats.choose_format``: the
    ``--tool-call-format`` flag, else detected from the template). ``reasoning``: the think
    block's format (``reasoning.choose_reasoning``: ``--reasoning-format``, ``auto`` detects it).
    """

    def __init__(
        self,
        tokenizer: Any,
        chat_template: str | None,
        tool_call_format: str | None = None,
        reasoning_format: str | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.tool_slot = self._find_tool_slot() if chat_template is not None else None
        self.native_tools = self.tool_slot is not None
        self.native_calls = self.native_tools and self._renders_calls()
        self.tool_format: ToolFormat = choose_format(
            chat_template, self.native_tools, tool_call_format
        )
        self.reasoning: ReasoningFormat | None = choose_reasoning(
            reasoning_format, chat_template, self._generation_prompt()
        )
        self.max_token_chars = longest_token_chars(tokenizer)

    def _generation_prompt(self) -> str | None:
        if self.chat_template is None:
            return None
        try:
            return self._apply([{"role": "user", "content": "hi"}], None)
        except Exception:  # a template that chokes on the probe says nothing about thinking
            return None

    def _find_tool_slot(self) -> str | None:
        probe = [{"role": "user", "content": "hi"}]
        for slot in TOOL_SLOTS:
            try:
                with_tools = self._apply(*placed(probe, [_PROBE_TOOL], slot))
                without = self._apply(*placed(probe, [], slot))
            except Exception:  # a template that chokes on the probe does not take tools there
                continue
            if with_tools != without and "probe_fn" in with_tools:
                return slot
        return None

    def _renders_calls(self) -> bool:
        history = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [_PROBE_CALL]},
            {"role": "tool", "tool_call_id": "call_probe", "content": "ok"},
        ]
        try:
            text = self._apply(*placed(history, [_PROBE_TOOL], self.tool_slot or "tools"))
        except Exception:  # a template that chokes on a call in the history does not render it
            return False
        return "probe_arg" in text

    def _apply(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        kwargs: dict[str, Any] | None = None,
    ) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            tools=tools,
            chat_template=self.chat_template,
            add_generation_prompt=True,
            tokenize=False,
            **(kwargs or {}),
        )

    def prompt_text(self, req: ChatCompletionRequest, plan: ToolPlan) -> str:
        """The rendered prompt, ending where the assistant's reply starts."""
        if self.chat_template is None:
            raise bad_request(
                "this model has no chat template; use /v1/completions with a plain prompt",
                param="messages",
            )
        tools = list(plan.tools) if plan.active else []
        for i, m in enumerate(req.messages):
            check_text(content_text(m.content), f"messages[{i}].content")
        extra = template_kwargs(req.chat_template_kwargs)
        messages = [self._message(m) for m in req.messages]
        if self.tool_format.tool_result is not None and not self.native_tools:
            messages = results_as_user_turns(messages, self.tool_format.tool_result)
        if tools and not self.native_tools:
            messages = with_tool_prompt(messages, self.tool_format.system_prompt(tools))
        listed = [t.model_dump(exclude_none=True) for t in tools]
        messages, native, kwargs = placed(messages, listed, self.tool_slot or "tools")
        try:
            text = self._apply(messages, native, {**extra, **kwargs})
        except jinja2.TemplateError as e:
            raise bad_request(
                f"the chat template refused these messages: {e}", param="messages"
            ) from e
        except (TypeError, ValueError, KeyError, AttributeError) as e:  # from template code
            raise bad_request(
                f"the chat template failed on these messages or chat_template_kwargs: {e}",
                param="chat_template_kwargs" if extra else "messages",
            ) from e
        return text

    def prompt_ids(
        self, req: ChatCompletionRequest, plan: ToolPlan, max_tokens: int | None = None
    ) -> list[int]:
        """The prompt's token ids (slow for big prompts: call it off the event loop).

        ``max_tokens``: the most prompt tokens that could be served; a prompt that cannot fit
        in them is refused (400 ``context_length_exceeded``) without being tokenized."""
        return self.prompt(req, plan, max_tokens)[0]

    def prompt(
        self, req: ChatCompletionRequest, plan: ToolPlan, max_tokens: int | None = None
    ) -> tuple[list[int], ReasoningFormat | None]:
        """The prompt's token ids and this request's reasoning format (None when the model
        does not think, or the prompt already closed the think block: ``reasoning.thinks``)."""
        text = self.prompt_text(req, plan)
        # The template already wrote any BOS it wants; do not let the tokenizer add another.
        ids = encode_prompt(self, text, "messages", max_tokens, add_special_tokens=False)
        return ids, thinks(self.reasoning, text)

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
        if not self.native_calls:
            return {
                "role": "assistant",
                "content": history_text(self.tool_format, m.tool_calls, text),
            }
        calls = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": call_arguments(c)},
            }
            for c in m.tool_calls
        ]
        return {"role": "assistant", "content": text, "tool_calls": calls}


def check_text(text: str, param: str) -> None:
    """400 for text that is not valid Unicode (a lone surrogate such as ``"\\ud800"`` is valid
    JSON, but no tokenizer can encode it)."""
    at = lone_surrogate_at(text)
    if at is None:
        return
    raise bad_request(
        f"{param}: the text contains a lone surrogate ({text[at]!a}) at character {at}; it is "
        "not valid Unicode and cannot be tokenized",
        param=param,
        code="invalid_value",
    )


def encode_prompt(
    formatter: ChatFormatter,
    text: str,
    param: str,
    max_tokens: int | None,
    add_special_tokens: bool = True,
) -> list[int]:
    """``text`` as token ids; a 400 for text that cannot be tokenized or cannot fit.

    A prompt longer than ``max_tokens`` × the longest token (in characters) needs more than
    ``max_tokens`` tokens whatever it says: it is refused at once, without tokenizing it.
    """
    bound = formatter.max_token_chars
    if max_tokens is not None and bound is not None and len(text) > max_tokens * bound:
        raise bad_request(
            f"the prompt is {len(text)} characters; no token of this model stands for more than "
            f"{bound}, so it needs more than the {max_tokens} tokens that fit; shorten the prompt",
            param=param,
            code="context_length_exceeded",
        )
    check_text(text, param)
    try:
        return list(formatter.tokenizer.encode(text, add_special_tokens=add_special_tokens))
    except TypeError as e:  # the tokenizer's answer to text it cannot take
        raise bad_request(f"{param}: the text cannot be tokenized ({e})", param=param,
                          code="invalid_value") from e  # fmt: skip


def longest_token_chars(tokenizer: Any) -> int | None:
    """The most characters of input text that one token can stand for, or None if unbounded.

    Sound only for tokenizers that never delete or shrink text: no normalizer (or ones that only
    add characters), pre-tokenizers that keep every character, no unknown token that could
    swallow a run of text (byte-level BPE or byte fallback), added tokens that strip nothing.
    Then every token stands for at most as many characters as its vocabulary entry has (a
    byte-level entry has one character per byte). Anything else gets no bound (None).
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        spec = json.loads(backend.to_str())
        vocab = tokenizer.get_vocab()
    except Exception:  # a tokenizer we cannot inspect gets no bound, never a wrong one
        return None
    model = spec.get("model") or {}
    byte_level = _all_types(spec.get("pre_tokenizer"), _KEEPS_TEXT) and (
        _has_type(spec.get("pre_tokenizer"), "ByteLevel") or model.get("byte_fallback") is True
    )
    lossless = (
        model.get("type") == "BPE"
        and byte_level
        and _all_types(spec.get("normalizer"), _GROWS_TEXT)
        and not any(a.get("lstrip") or a.get("rstrip") for a in spec.get("added_tokens", ()))
    )
    return max(map(len, vocab)) if lossless and vocab else None


_KEEPS_TEXT = {"ByteLevel", "Metaspace", "Digits", "Split", "Punctuation", "Sequence"}
_GROWS_TEXT = {"Prepend", "Replace", "Sequence"}


def _all_types(node: Any, allowed: set[str]) -> bool:
    """Every component of a normalizer / pre-tokenizer is of an allowed, text-keeping kind."""
    if node is None:
        return True
    kind = node.get("type")
    if kind not in allowed or node.get("behavior") == "Removed":
        return False
    if kind == "Replace":  # only as long or longer: " " -> "▁"
        pattern = (node.get("pattern") or {}).get("String")
        if pattern is None or len(node.get("content", "")) < len(pattern):
            return False
    parts = node.get("normalizers") or node.get("pretokenizers") or []
    return all(_all_types(p, allowed) for p in parts)


def _has_type(node: Any, kind: str) -> bool:
    if node is None:
        return False
    parts = node.get("normalizers") or node.get("pretokenizers") or []
    return node.get("type") == kind or any(_has_type(p, kind) for p in parts)
