"""``response_format`` (and its extensions) -> a ConstraintSpec, and compiling it before answering.

The compile is awaited before any status line is sent, so a bad schema or grammar is a 400 even
for ``stream: true``; compile errors name the request field they came from.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from corral.api.errors import ApiError, constraint_error
from corral.api.protocol import (
    ChoiceFormat,
    GrammarFormat,
    JsonObjectFormat,
    JsonSchemaResponseFormat,
    RegexFormat,
    ResponseFormat,
)
from corral.api.responses import Unenforced
from corral.grammar import CompiledConstraint, ConstraintError, ConstraintSpec
from corral.grammar.schema_close import close_objects


@dataclass(frozen=True)
class FormatSpec:
    """A constraint and the request field it came from (for error messages)."""

    spec: ConstraintSpec
    param: str


def wants_closed_objects(open_objects: bool | None, server_default_open: bool) -> bool:
    """Whether a request's schemas get closed objects (see ``grammar.schema_close``)."""
    return not (server_default_open if open_objects is None else open_objects)


def format_spec(fmt: ResponseFormat | None, closed: bool = True) -> FormatSpec | None:
    """The constraint a ``response_format`` asks for; None for plain text. Raises a 400.

    ``closed``: generate only the declared properties of objects whose schema is silent about
    extra keys (a narrowing: the output is still valid against the schema as sent)."""
    try:
        return _format_spec(fmt, closed)
    except ConstraintError as e:
        raise constraint_error(e, _param(fmt)) from e


def _format_spec(fmt: ResponseFormat | None, closed: bool) -> FormatSpec | None:
    if isinstance(fmt, JsonObjectFormat):
        return FormatSpec(ConstraintSpec.json_object(), "response_format")
    if isinstance(fmt, JsonSchemaResponseFormat):
        strict = fmt.json_schema.strict is not False  # absent means strict: fail closed
        schema = fmt.json_schema.schema_
        spec = ConstraintSpec.json_schema(
            close_objects(schema) if closed else schema, strict=strict
        )
        return FormatSpec(spec, _param(fmt))
    if isinstance(fmt, RegexFormat):
        return FormatSpec(ConstraintSpec.regex(fmt.regex), _param(fmt))
    if isinstance(fmt, GrammarFormat):
        make = ConstraintSpec.lark if fmt.syntax == "lark" else ConstraintSpec.ebnf
        return FormatSpec(make(fmt.grammar), _param(fmt))
    if isinstance(fmt, ChoiceFormat):
        return FormatSpec(ConstraintSpec.choice(fmt.choice), _param(fmt))
    return None  # None or {"type": "text"}


def _param(fmt: ResponseFormat | None) -> str:
    if isinstance(fmt, JsonSchemaResponseFormat):
        return "response_format.json_schema.schema"
    if isinstance(fmt, RegexFormat | GrammarFormat | ChoiceFormat):
        return f"response_format.{fmt.type}"
    return "response_format"


CompileFn = Callable[[ConstraintSpec], Awaitable[CompiledConstraint]]


async def compile_or_400(
    compile_fn: CompileFn,
    spec: ConstraintSpec,
    on_error: Callable[[ConstraintError], ApiError],
) -> CompiledConstraint:
    """Await the compile; a ConstraintError becomes the 400 that ``on_error`` builds."""
    try:
        return await compile_fn(spec)
    except ConstraintError as e:
        raise on_error(e) from e


def unenforced_report(
    compiled: CompiledConstraint | None, param: str, extra: tuple = ()
) -> list[Unenforced] | None:
    """Lenient mode's list of keywords that were not enforced; None when there are none."""
    items = [(u.pointer, u.keyword, u.reason) for u in (compiled.unenforced if compiled else ())]
    items += list(extra)
    if not items:
        return None
    return [Unenforced(pointer=p, keyword=k, reason=r, param=param) for p, k, r in items]
