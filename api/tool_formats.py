"""The tool-call formats models are trained on, each defined once.

A format says how a call is written — the strings around one call (``begin`` names the function,
the arguments JSON follows, then ``end``), the ``triggers`` that start a call in free text, and
what separates calls written back to back — and that one definition gives all three uses:

- the prompt: templates that render ``tools`` themselves get them natively; for the others a
  system prompt shows the call written in this format (``system_prompt``), and the history's
  calls are written in it (``render_calls``);
- the constraint: a structural tag whose structures are ``begin(name)`` + the function's
  ``parameters`` + ``end`` (``grammar.structural_tag``);
- the parser: ``api.tool_stream`` reads calls back with the same strings.

========== ================================================================= ==================
name       one call                                                          chosen when the
                                                                             template has
========== ================================================================= ==================
hermes     ``<tool_call>\\n{"name": "f", "arguments": {…}}\\n</tool_call>``  ``<tool_call>``
           (Hermes 2 Pro, Qwen 2.5 / 3)
llama3     ``<|python_tag|>{"name": "f", "parameters": {…}}`` or the same    ``<|python_tag|>``
           JSON without the tag (Llama 3.1-3.3 JSON tool calling)
mistral    ``[TOOL_CALLS][{"name": "f", "arguments": {…}}]``                 ``[TOOL_CALLS]``
phi4       ``<|tool_call|>[{"name": "f", "arguments": {…}}]<|/tool_call|>``  ``<|/tool|>``
           (Phi-4-mini: the tools go in the system message's ``tools``)
gemma      ````` ```tool_code\n{"name": "f", "arguments": {…}}\n``` `````    ``<start_of_turn>``
           (Gemma 2 / 3 have no tool tokens: Google's ``tool_code`` fence,   (even without tools)
           with a JSON call inside so the arguments can be constrained)
corral     ``<tool_call>[{"name": "f", "parameters": {…}}]`` — the generic   anything else
           form, described in a system prompt, for templates without tools
========== ================================================================= ==================

SmolLM3's template takes the tools as ``xml_tools`` and asks for hermes calls; Qwen3's renders
``tools`` and asks for the same (``api.prompting`` finds where a template takes its tools).
Formats with ``tool_result`` set write the history's tool results as a user turn in the
format's convention (Gemma's template knows no ``tool`` role and requires alternating turns).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ToolFormat:
    """One tool-call format (see the module docstring)."""

    name: str
    #: the call openers, as functions of the function's name (a call may start with any)
    openers: tuple[Callable[[str], str], ...]
    end: str
    triggers: tuple[str, ...]
    #: what separates calls written one after another (``tool_choice: "required"``)
    separator: str
    #: chosen automatically when the chat template contains this marker
    marker: str | None
    #: the marker counts even when the template does not render tools (a model family whose
    #: templates never do, recognised by its turn markers)
    any_template: bool = False
    #: how a tool result is shown to the model as (part of) a user turn, for templates that
    #: have no ``tool`` role; None: the template renders ``tool`` messages itself
    tool_result: Callable[[str], str] | None = None

    def begins(self, name: str) -> tuple[str, ...]:
        return tuple(opener(name) for opener in self.openers)

    def render_call(self, name: str, arguments: Any) -> str:
        """One call as the model writes it (its first opener)."""
        return self.begins(name)[0] + json.dumps(arguments, ensure_ascii=False) + self.end

    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        return self.separator.join(self.render_call(n, a) for n, a in calls)

    def system_prompt(self, tools: list[Any]) -> str:
        """A system-prompt description of the tools, for templates that ignore ``tools``."""
        listing = [
            {
                "name": t.function.name,
                "description": t.function.description or "",
                "parameters": t.function.parameters,
            }
            for t in tools
        ]
        example = self.render_call("function_name", {"argument": "value"})
        return (
            "You can call these functions (parameters are JSON Schema):\n"
            + json.dumps(listing, ensure_ascii=False)
            + f"\nTo call a function, reply with {example}. Otherwise reply normally."
        )


def _key(prefix: str, key: str) -> Callable[[str], str]:
    return lambda name: f'{prefix}{{"name": {json.dumps(name, ensure_ascii=False)}, "{key}": '


FORMATS: dict[str, ToolFormat] = {
    f.name: f
    for f in (
        ToolFormat(
            "hermes",
            (_key("<tool_call>\n", "arguments"),),
            "}\n</tool_call>",
            ("<tool_call>",),
            "\n",
            "<tool_call>",
        ),
        ToolFormat(
            "llama3",
            (_key("<|python_tag|>", "parameters"), _key("", "parameters")),
            "}",
            ("<|python_tag|>", '{"name": '),
            "; ",
            "<|python_tag|>",
        ),
        ToolFormat(
            "mistral",
            (_key("[TOOL_CALLS][", "arguments"),),
            "}]",
            ("[TOOL_CALLS]",),
            "",
            "[TOOL_CALLS]",
        ),
        ToolFormat(
            "phi4",
            (_key("<|tool_call|>[", "arguments"),),
            "}]<|/tool_call|>",
            ("<|tool_call|>",),
            "",
            "<|/tool|>",
        ),
        ToolFormat(
            "gemma",
            (_key("```tool_code\n", "arguments"),),
            "}\n```",
            ("```tool_code",),
            "\n",
            "<start_of_turn>",
            any_template=True,
            tool_result=lambda text: f"```tool_output\n{text}\n```",
        ),
        ToolFormat(
            "corral", (_key("<tool_call>[", "parameters"),), "}]", ("<tool_call>",), "", None
        ),
    )
}
GENERIC = FORMATS["corral"]
#: Detection order: the more specific markers first (a template may mention several).
_DETECT = ("mistral", "llama3", "phi4", "hermes", "gemma")


def choose_format(chat_template: str | None, renders_tools: bool, flag: str | None) -> ToolFormat:
    """The format a model is served with: ``--tool-call-format`` when given, else the one whose
    marker its chat template contains (if the template renders tools, or the format is
    recognised without), else the generic one."""
    if flag and flag != "auto":
        return FORMATS[flag]
    if chat_template:
        for name in _DETECT:
            fmt = FORMATS[name]
            if (renders_tools or fmt.any_template) and fmt.marker and fmt.marker in chat_template:
                return fmt
    return GENERIC


FORMAT_NAMES = ("auto", *FORMATS)
