"""Function calling: a request's tools as a structural tag in the served model's format.

The format (``api.tool_formats``: Hermes/Qwen/SmolLM3, Llama 3 JSON, Mistral, Phi-4-mini, Gemma,
or Corral's generic one) gives each function a call opener; the constraint is a structural tag
whose structures are ``opener + the function's parameters + end``, so every call the model
starts is constrained to the named function's ``parameters`` (strict analysis, the
compiled-constraint cache, errors that name ``tools[i].function.parameters``):

- ``auto``: free text (without the format's triggers) and calls, interleaved; with
  ``parallel_tool_calls: false`` the output ends after the first call.
- ``required`` / a named function: calls only, at least one (exactly one when
  ``parallel_tool_calls`` is false or a function is named).
- ``none``: no tools reach the prompt, nothing is constrained by them.

Calls are read back by ``api.tool_stream.CallScanner`` with the same openers.

Copies: each tool's ``parameters`` (or ``close_objects`` of it, which shares subtrees) goes only
to ``ConstraintSpec.structural_tag_of``, which serialises it; the request's tool schemas, which
the chat template also renders, are never changed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from corral.api.errors import ApiError, bad_request, constraint_error
from corral.api.protocol import ChatCompletionRequest, NamedToolChoice, Tool
from corral.api.responses import Unenforced
from corral.api.tool_formats import GENERIC, ToolFormat
from corral.api.tool_stream import CallScanner
from corral.grammar import ConstraintError, ConstraintSpec, JsonFormat
from corral.grammar.schema.closed_objects import close_objects

#: Tool-call JSON is laid out like ``json.dumps`` (", " and ": "), as in the prompt and history.
TOOL_JSON_FORMAT = JsonFormat.python_default()


@dataclass(frozen=True)
class ToolPlan:
    """How one request uses its tools.

    ``mode``: ``"none"``, ``"auto"`` or ``"required"`` (a named function is ``required`` with a
    single tool). ``tools``: the functions the output may call; ``structure_tools[i]``: the
    index in ``tools`` of the structural tag's structure ``i``. ``spec``: the constraint of the
    whole output (None for ``none``). ``closed``: whether ``close_objects`` narrowed any
    function's parameters.
    """

    mode: str
    tools: tuple[Tool, ...]
    format: ToolFormat = GENERIC
    spec: ConstraintSpec | None = None
    structure_tools: tuple[int, ...] = ()
    closed: bool = False

    @property
    def active(self) -> bool:
        return self.mode != "none"

    def scanner(self) -> CallScanner:
        """A fresh reader of one choice's output under this plan."""
        begins = {
            b: t.function.name for t in self.tools for b in self.format.begins(t.function.name)
        }
        return CallScanner(begins, self.format.triggers, self.format.end, self.mode == "required")


def plan_tools(
    req: ChatCompletionRequest, closed: bool = True, fmt: ToolFormat = GENERIC
) -> ToolPlan:
    """The tool plan of a request; ``none`` when it has no tools. Raises a 400 ``ApiError``.

    ``closed``: arguments get only the declared properties where a parameters schema is
    silent about extra keys (see ``grammar.schema_close``)."""
    choice = req.tool_choice or ("auto" if req.tools else "none")
    if not req.tools or choice == "none":
        return ToolPlan("none", ())
    tools = _in_play(req, choice)
    mode = "auto" if choice == "auto" else "required"
    parallel = req.parallel_tool_calls and not isinstance(choice, NamedToolChoice)
    structures, owners, narrowed = [], [], False
    for k, t in enumerate(tools):
        params = close_objects(t.function.parameters) if closed else t.function.parameters
        narrowed |= params != t.function.parameters
        for begin in fmt.begins(t.function.name):
            structures.append({"begin": begin, "schema": params, "end": fmt.end})
            owners.append(k)
    tag = {
        "structures": structures,
        "triggers": list(fmt.triggers),
        "at_least_one": mode == "required",
        "stop_after_first": not parallel,
        "free_text": mode == "auto",
        "separator": fmt.separator,
    }
    # lenient only when every function in play asked for it (strict: false)
    strict = any(t.function.strict is not False for t in tools)
    plan = ToolPlan(mode, tools, fmt, None, tuple(owners))
    try:
        spec = ConstraintSpec.structural_tag_of(tag, strict=strict, json_format=TOOL_JSON_FORMAT)
    except ConstraintError as e:
        raise tool_constraint_error(e, plan, req.tools or []) from e
    return ToolPlan(mode, tools, fmt, spec, tuple(owners), narrowed)


def _in_play(req: ChatCompletionRequest, choice: Any) -> tuple[Tool, ...]:
    tools = tuple(req.tools or ())
    if isinstance(choice, NamedToolChoice):
        tools = tuple(t for t in tools if t.function.name == choice.function.name)
    return tools


_STRUCTURE = re.compile(r"^/structures/(\d+)/schema(?=/|$)")


def tool_param(pointer: str, plan: ToolPlan, all_tools: list[Tool]) -> tuple[str, str]:
    """A pointer into the structural tag -> (``tools[i].function.parameters``, pointer)."""
    m = _STRUCTURE.match(pointer)
    if not m:
        return "tools", pointer
    name = plan.tools[plan.structure_tools[int(m.group(1))]].function.name
    index = next(i for i, t in enumerate(all_tools) if t.function.name == name)
    return f"tools[{index}].function.parameters", pointer[m.end() :]


def tool_constraint_error(e: ConstraintError, plan: ToolPlan, all_tools: list[Tool]) -> ApiError:
    """A compile error of the tools' structural tag, reported against the function's schema."""
    param, pointer = tool_param(e.pointer, plan, all_tools)
    return constraint_error(e, param, pointer)


def tool_unenforced(
    items: list[tuple[str, str, str]], plan: ToolPlan, all_tools: list[Tool]
) -> list[Unenforced] | None:
    """Lenient mode's report with pointers into the functions' own schemas. A function used by
    several structures (a format with two openers) is reported once per keyword."""
    out, seen = [], set()
    for pointer, keyword, reason in items:
        param, local = tool_param(pointer, plan, all_tools)
        if (param, local, keyword) not in seen:
            seen.add((param, local, keyword))
            out.append(Unenforced(pointer=local, keyword=keyword, reason=reason, param=param))
    return out or None


def history_text(fmt: ToolFormat, tool_calls: list[Any], content: str) -> str:
    """An assistant turn's tool calls as the model would have written them (for templates that
    do not render tool calls themselves)."""
    calls = [(call.function.name, call_arguments(call)) for call in tool_calls]
    return content + fmt.render_calls(calls)


def call_arguments(call: Any) -> Any:
    """A history tool call's arguments as JSON data; a 400 when they are not JSON."""
    try:
        return json.loads(call.function.arguments or "{}")
    except json.JSONDecodeError as e:
        raise bad_request(
            f"tool call {call.id}: arguments are not valid JSON ({e})", param="messages"
        ) from e
