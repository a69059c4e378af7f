"""A request's constraint: the one path from a chat or completions request to a ``Constraint``.

Generation (``serving_chat``, ``serving_completion``), the dry run and precompile endpoints
(``serving_constraints``) and ``corral cache warm`` all build their constraint here, with the
server's settings (``open_objects``, ``reasoning_format``) and its tool-call format, so a
constraint validated or warmed ahead of traffic is the one a request compiles: same spec, same
digest, the same cache entry.

Both functions check the request limits and analyse schemas (O(size of the request)): call them
off the event loop. They take the server's schema forms (``ServerState.forms``), where a
schema's stats and spec are remembered by its form.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from corral.api.errors import ApiError, bad_request
from corral.api.limits import check_limits
from corral.api.reasoning import REASONING_FORMATS, ReasoningFormat
from corral.api.receipts import Constraint, Rewrite
from corral.api.response_formats import (
    FormatSpec,
    constraint_error,
    format_spec,
    unenforced_report,
    wants_closed_objects,
)
from corral.api.tools import (
    ToolPlan,
    plan_tools,
    tool_constraint_error,
    tool_param,
    tool_unenforced,
)
from corral.grammar import CompiledConstraint, ConstraintError, ConstraintSpec

if TYPE_CHECKING:
    from corral.api.config import ServerConfig
    from corral.api.protocol import ChatCompletionRequest, CompletionRequest
    from corral.api.schema_forms import SchemaForms
    from corral.api.tool_formats import ToolFormat


def reasoning_format(config: ServerConfig) -> ReasoningFormat | None:
    """The reasoning format ``--reasoning-format`` names, if any (``auto`` is resolved from the
    chat template by ``ChatFormatter.reasoning``: pass that as ``reasoning`` where known)."""
    return REASONING_FORMATS.get(config.reasoning_format or "")


_FROM_CONFIG: Any = object()


def chat_constraint(
    req: ChatCompletionRequest,
    config: ServerConfig,
    tool_format: ToolFormat,
    forms: SchemaForms,
    reasoning: ReasoningFormat | None = _FROM_CONFIG,
) -> tuple[ToolPlan, Constraint | None]:
    """The tool plan of a chat request and the constraint of its output (None: free text).

    The tools' structural tag or the response format, within the request limits, after the
    think block of a reasoning model (never dropped for it; ``reasoning``: the served model's
    format, by default the one ``--reasoning-format`` names). Raises the request's 400."""
    if reasoning is _FROM_CONFIG:
        reasoning = reasoning_format(config)
    check_limits(req, config, forms)
    closed = wants_closed_objects(req.open_objects, config.open_objects)
    plan = plan_tools(req, closed, tool_format)
    fmt = format_spec(req.response_format, forms, closed)
    if plan.mode == "auto" and fmt is not None:
        raise bad_request(
            "response_format other than text cannot be combined with tool_choice 'auto'; "
            "use tool_choice 'required' or 'none'",
            param="response_format",
        )
    if plan.spec is not None:
        constraint = _tools_constraint(plan, plan.spec, req)
    elif fmt is not None:
        constraint = _format_constraint(fmt)
    else:
        return plan, None
    return plan, after_reasoning(constraint, reasoning)


def required_constraint(
    req: ChatCompletionRequest,
    config: ServerConfig,
    tool_format: ToolFormat,
    forms: SchemaForms,
    reasoning: ReasoningFormat | None = _FROM_CONFIG,
) -> Constraint:
    """:func:`chat_constraint` of a body sent to be compiled (the constraint endpoints, cache
    warming): a 400 when it does not constrain the output."""
    _, constraint = chat_constraint(req, config, tool_format, forms, reasoning)
    if constraint is None:
        raise bad_request(
            "the request has no constraint: send a response_format other than text, "
            "one of its dialects, or tools with a tool_choice other than 'none'",
            param="response_format",
        )
    return constraint


def completion_constraint(
    req: CompletionRequest, config: ServerConfig, forms: SchemaForms
) -> Constraint | None:
    """The constraint of a completions request (None: free text); raises the request's 400.
    A raw prompt has no think block: the constraint applies from the first token."""
    check_limits(req, config, forms)
    closed = wants_closed_objects(req.open_objects, config.open_objects)
    fmt = format_spec(req.response_format, forms, closed)
    return _format_constraint(fmt) if fmt is not None else None


def _format_constraint(fmt: FormatSpec) -> Constraint:
    def refused(e: ConstraintError) -> ApiError:
        return constraint_error(e, fmt.param)

    def report(compiled: CompiledConstraint):
        return unenforced_report(compiled, fmt.param)

    def locate(pointer: str) -> tuple[str, str]:
        return fmt.param, pointer

    closed = (Rewrite(rewrite="close_objects", param=fmt.param),) if fmt.closed else ()
    return Constraint(fmt.spec, refused, report, locate, closed)


def _tools_constraint(
    plan: ToolPlan, spec: ConstraintSpec, req: ChatCompletionRequest
) -> Constraint:
    all_tools = req.tools or []

    def refused(e: ConstraintError) -> ApiError:
        return tool_constraint_error(e, plan, all_tools)

    def report(compiled: CompiledConstraint):
        found = [(u.pointer, u.keyword, u.reason) for u in compiled.unenforced]
        return tool_unenforced(found, plan, all_tools)

    def locate(pointer: str) -> tuple[str, str]:
        return tool_param(pointer, plan, all_tools)

    wrapped = Rewrite(rewrite="tool_calls", param="tools", detail=f"{plan.format.name} format")
    closed = (Rewrite(rewrite="close_objects", param="tools"),) if plan.closed else ()
    return Constraint(spec, refused, report, locate, (wrapped, *closed))


def after_reasoning(constraint: Constraint, reasoning: ReasoningFormat | None) -> Constraint:
    """``constraint`` after a free think block of format ``reasoning`` (unchanged for None)."""
    if reasoning is None:
        return constraint
    spec = constraint.spec.after_reasoning(reasoning.open, reasoning.close)
    after = Rewrite(rewrite="after_reasoning", detail=reasoning.name)
    return replace(constraint, spec=spec, rewrites=(*constraint.rewrites, after))
