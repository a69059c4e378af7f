"""Messages and tools laid out the way a chat template reads them.

Templates take tools in different places — Hugging Face's ``tools=``, SmolLM3's ``xml_tools=``,
Phi-4-mini's ``tools`` field of the system message — and some have no ``tool`` role (Gemma's
wants user and model turns to alternate). ``api.prompting.ChatFormatter`` finds which applies to
the served template; the functions here do the laying out, and check a request's
``chat_template_kwargs``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from corral.api.errors import bad_request

#: Where chat templates take the tools, tried in this order: Hugging Face's ``tools=`` (Qwen,
#: Llama 3.1, Hermes, Mistral), SmolLM3's ``xml_tools=``, and Phi-4-mini's ``tools`` field of
#: the system message (a JSON string).
TOOL_SLOTS = ("tools", "xml_tools", "system")
#: ``chat_template_kwargs`` a request may not set: the ones Corral or the tokenizer passes, and
#: the template's own functions (Jinja's globals and Hugging Face's).
_RESERVED_KWARGS = frozenset(
    {"messages", "tools", "xml_tools", "python_tools", "documents", "chat_template",
     "add_generation_prompt", "continue_final_message", "tokenize", "return_dict",
     "return_tensors", "padding", "truncation", "max_length", "tokenizer_kwargs",
     "bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token",
     "additional_special_tokens", "raise_exception", "strftime_now", "range", "dict", "lipsum",
     "cycler", "joiner", "namespace"}
)  # fmt: skip


def template_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """A request's ``chat_template_kwargs`` (``{"enable_thinking": false}``): a 400 for a name
    Corral passes itself or one that is not a plain identifier."""
    for name in kwargs or {}:
        if not name.isidentifier() or name.startswith("_") or name in _RESERVED_KWARGS:
            raise bad_request(
                f"chat_template_kwargs: {name!r} cannot be set (reserved or not an identifier)",
                param="chat_template_kwargs",
                code="invalid_value",
            )
    return dict(kwargs or {})


def placed(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]], slot: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any]]:
    """(messages, ``tools=``, other template arguments) with ``tools`` where ``slot`` says."""
    if not tools:
        return messages, None, {}
    if slot == "tools":
        return messages, tools, {}
    functions = [
        {k: v for k, v in t["function"].items() if k in ("name", "description", "parameters")}
        for t in tools
    ]
    if slot == "xml_tools":
        return messages, None, {"xml_tools": functions}
    listing = json.dumps(functions, ensure_ascii=False)
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "tools": listing}, *messages[1:]], None, {}
    return [{"role": "system", "content": "", "tools": listing}, *messages], None, {}


def results_as_user_turns(
    messages: list[dict[str, Any]], wrap: Callable[[str], str]
) -> list[dict[str, Any]]:
    """Tool results as user turns, for templates with no ``tool`` role: consecutive results,
    and a user message right after them, share one turn (such templates want turns to
    alternate)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        follows_results = bool(out) and out[-1].get("from_tools")
        if m["role"] == "tool":
            text = wrap(m["content"])
        elif m["role"] == "user" and follows_results:
            text = m["content"]
        else:
            out.append(m)
            continue
        if follows_results:
            out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + text}
        else:
            out.append({"role": "user", "content": text, "from_tools": True})
    return [{k: v for k, v in m.items() if k != "from_tools"} for m in out]


def with_tool_prompt(messages: list[dict[str, Any]], description: str) -> list[dict[str, Any]]:
    """Add the tools' description to the system prompt (creating one if there is none)."""
    if messages and messages[0]["role"] == "system":
        first = dict(messages[0])
        first["content"] = (first["content"] + "\n\n" + description).strip()
        return [first, *messages[1:]]
    return [{"role": "system", "content": description}, *messages]
