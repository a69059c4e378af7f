"""Function calling: the tool-call text format, its constraint, and parsing it back.

Corral's tool-call format (used whatever the chat template, so one constraint fits all models):

    <tool_call>[{"name": "get_weather", "parameters": {"city": "Paris"}}]

``name`` is one of the request's functions and ``parameters`` validates against that function's
JSON schema; the array holds one call per element (exactly one when ``parallel_tool_calls`` is
false). The key is ``parameters``, not ``arguments``, so that a canonical (sorted-key) schema
still puts ``name`` first and the model picks the function before writing its arguments.

- ``required`` / a named function: the generation prompt ends with ``<tool_call>`` and the output
  is constrained by the JSON schema of the call array (strict analysis, cache, clear errors).
- ``auto``: a Lark grammar lets the model write either plain text that does not start with
  ``<tool_call>``, or ``<tool_call>`` followed by the call array.
- ``none``: no tools reach the prompt, nothing is constrained by them.

Copies: `calls_schema` embeds each tool's `parameters` (or `close_objects` of it, which shares
subtrees) without copying; the result goes only to `ConstraintSpec.json_schema` (serialised) or
`analyze_schema` (read-only), so the request's tool schemas, which the chat template also renders,
are never changed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from corral.api.errors import ApiError, bad_request, constraint_error
from corral.api.protocol import ChatCompletionRequest, NamedToolChoice, Tool
from corral.api.responses import FunctionCallOut, ToolCallOut, Unenforced, new_id
from corral.grammar import ConstraintError, ConstraintSpec, JsonFormat
from corral.grammar.schema_close import close_objects

TOOL_CALL_TAG = "<tool_call>"
#: Tool-call JSON is laid out like ``json.dumps`` (", " and ": "), as in the prompt and history.
TOOL_JSON_FORMAT = JsonFormat.python_default()


@dataclass(frozen=True)
class ToolPlan:
    """How one request uses its tools.

    ``mode``: ``"none"``, ``"auto"`` or ``"required"`` (a named function is ``required`` with a
    single tool). ``tools``: the functions the output may call. ``prompt_suffix`` goes after the
    generation prompt. ``spec``: the constraint of the whole output (None for ``none``).
    ``calls_spec`` (``auto`` only): the call array on its own, compiled before ``spec`` so that
    its compile-time probe runs: the probe of ``spec`` walks the free-text branch, and a call
    schema past a backend limit must be a 400, not a failure once the model starts a call.
    """

    mode: str
    tools: tuple[Tool, ...]
    prompt_suffix: str
    spec: ConstraintSpec | None
    unenforced: tuple[tuple[str, str, str], ...] = ()
    calls_spec: ConstraintSpec | None = None

    @property
    def active(self) -> bool:
        return self.mode != "none"


def plan_tools(req: ChatCompletionRequest, closed: bool = True) -> ToolPlan:
    """The tool plan of a request; ``none`` when it has no tools. Raises a 400 ``ApiError``.

    ``closed``: arguments get only the declared properties where a parameters schema is
    silent about extra keys (see ``grammar.schema_close``)."""
    choice = req.tool_choice or ("auto" if req.tools else "none")
    if not req.tools or choice == "none":
        return ToolPlan("none", (), "", None)
    try:
        return _plan(req, choice, closed)
    except ConstraintError as e:
        raise tool_constraint_error(e, _in_play(req, choice), req.tools) from e


def _in_play(req: ChatCompletionRequest, choice: Any) -> tuple[Tool, ...]:
    tools = tuple(req.tools or ())
    if isinstance(choice, NamedToolChoice):
        tools = tuple(t for t in tools if t.function.name == choice.function.name)
    return tools


def _plan(req: ChatCompletionRequest, choice: Any, closed: bool) -> ToolPlan:
    tools = _in_play(req, choice)
    # lenient only when every function in play asked for it (strict: false)
    strict = any(t.function.strict is not False for t in tools)
    parallel = req.parallel_tool_calls and not isinstance(choice, NamedToolChoice)
    schema = calls_schema(tools, parallel, closed)
    calls = ConstraintSpec.json_schema(schema, strict=strict, json_format=TOOL_JSON_FORMAT)
    if choice == "auto":
        spec, unenforced = _auto_spec(schema, strict)
        return ToolPlan("auto", tools, "", spec, unenforced, calls_spec=calls)
    return ToolPlan("required", tools, TOOL_CALL_TAG, calls)


def calls_schema(tools: tuple[Tool, ...], parallel: bool, closed: bool = True) -> dict[str, Any]:
    """The JSON schema of the call array: each item is one of the functions with its schema."""
    branches = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t.function.name},
                "parameters": (
                    close_objects(t.function.parameters) if closed else t.function.parameters
                ),
            },
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    items = branches[0] if len(branches) == 1 else {"anyOf": branches}
    schema: dict[str, Any] = {"type": "array", "items": items, "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    return schema


_BRANCH = re.compile(r"^/items(?:/anyOf/(\d+))?/properties/parameters(?=/|$)")


def tool_param(pointer: str, tools: tuple[Tool, ...], all_tools: list[Tool]) -> tuple[str, str]:
    """A pointer into the combined call schema -> (``tools[i].function.parameters``, pointer)."""
    m = _BRANCH.match(pointer)
    if not m:
        return "tools", pointer
    name = tools[int(m.group(1) or 0)].function.name
    index = next(i for i, t in enumerate(all_tools) if t.function.name == name)
    return f"tools[{index}].function.parameters", pointer[m.end() :]


def tool_constraint_error(
    e: ConstraintError, tools: tuple[Tool, ...], all_tools: list[Tool]
) -> ApiError:
    """A compile error of the combined call schema, reported against the function's schema."""
    param, pointer = tool_param(e.pointer, tools, all_tools)
    return constraint_error(e, param, pointer)


def tool_unenforced(
    items: list[tuple[str, str, str]], tools: tuple[Tool, ...], all_tools: list[Tool]
) -> list[Unenforced] | None:
    """Lenient mode's report with pointers into the functions' own schemas."""
    out = []
    for pointer, keyword, reason in items:
        param, local = tool_param(pointer, tools, all_tools)
        out.append(Unenforced(pointer=local, keyword=keyword, reason=reason, param=param))
    return out or None


def _auto_spec(
    schema: dict[str, Any], strict: bool
) -> tuple[ConstraintSpec, tuple[tuple[str, str, str], ...]]:
    """Lark: plain text not starting with the tag, or the tag and the call array.

    The call schema goes through Corral's schema analysis first (fail closed in strict mode,
    rewritten into forms the backend enforces exactly) and is then embedded with ``%json``.
    """
    from corral.grammar.schema_analysis import analyze_schema

    plan = analyze_schema(schema, lenient=not strict)
    embedded = dict(plan.schema) | {"x-guidance": _guidance_options()}
    tag = json.dumps(TOOL_CALL_TAG)
    lark = "\n".join(
        [
            "start: TEXT | calls",
            rf"TEXT: /(?s:.*)/ & ~/{re.escape(TOOL_CALL_TAG)}(?s:.*)/",
            f"calls: {tag} %json {json.dumps(embedded)}",
        ]
    )
    return ConstraintSpec.lark(lark), tuple(
        (u.pointer, u.keyword, u.reason) for u in plan.unenforced
    )


def _guidance_options() -> dict[str, Any]:
    from corral.grammar.backend_llguidance import json_options

    return json_options(TOOL_JSON_FORMAT)


@dataclass(frozen=True)
class ParsedOutput:
    """What an assistant turn said: text, tool calls, or (if unparsable) the raw text."""

    content: str | None
    tool_calls: list[ToolCallOut]


def parse_output(text: str, plan: ToolPlan) -> ParsedOutput:
    """Split generated text into content and tool calls according to the plan.

    In ``required`` mode the tag was part of the prompt, so the text is the bare array. Text that
    does not parse (cut by ``max_tokens`` or a stop string) is returned as content.
    """
    if plan.mode == "required":
        body = text
    elif plan.mode == "auto" and text.startswith(TOOL_CALL_TAG):
        body = text[len(TOOL_CALL_TAG) :]
    else:
        return ParsedOutput(text, [])
    calls = _calls(body, {t.function.name for t in plan.tools})
    return ParsedOutput(None, calls) if calls else ParsedOutput(text, [])


def _calls(body: str, names: set[str]) -> list[ToolCallOut]:
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return []
    if not isinstance(data, list):
        return []
    calls = []
    for item in data:
        if not (isinstance(item, dict) and item.get("name") in names):
            return []
        args = json.dumps(item.get("parameters", {}), ensure_ascii=False)
        calls.append(
            ToolCallOut(
                id=new_id("call_"), function=FunctionCallOut(name=item["name"], arguments=args)
            )
        )
    return calls


def history_text(tool_calls: list[Any], content: str) -> str:
    """An assistant turn's tool calls as the model would have written them (non-native templates)."""
    calls = []
    for call in tool_calls:
        try:
            params = json.loads(call.function.arguments or "{}")
        except json.JSONDecodeError as e:
            raise bad_request(
                f"tool call {call.id}: arguments are not valid JSON ({e})", param="messages"
            ) from e
        calls.append({"name": call.function.name, "parameters": params})
    return content + TOOL_CALL_TAG + json.dumps(calls, ensure_ascii=False)


def tools_system_prompt(tools: list[Tool]) -> str:
    """A system-prompt description of the tools, for templates that ignore ``tools``."""
    listing = [
        {
            "name": t.function.name,
            "description": t.function.description or "",
            "parameters": t.function.parameters,
        }
        for t in tools
    ]
    return (
        "You can call these functions (parameters are JSON Schema):\n"
        + json.dumps(listing, ensure_ascii=False)
        + f"\nTo call functions, reply with {TOOL_CALL_TAG} followed by a JSON array of calls, "
        f'like {TOOL_CALL_TAG}[{{"name": "function_name", "parameters": {{...}}}}]. '
        "Otherwise reply normally."
    )
