"""Request limits: what one request may ask for, checked before any compile, each a clear 400.

The bounds are the server's configuration (``ServerConfig``: ``max_n``, ``max_tools``,
``max_schema_bytes``, ``max_schema_depth``, ``max_schema_properties``, ``max_enum_values``) and
are listed beside OpenAI's in docs/serving.md, "Limits". A refusal names the request field
(``param``), the limit (``limit``, the setting's name), the request's value and the bound.

Every walk here is iterative and linear in the size of the request: schemas arrive thousands
of levels deep, and nothing may recurse on them (or spend more than O(size)) before these checks
have passed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from corral.api.errors import ApiError
from corral.api.schema_stats import SchemaStats, json_pointer, schema_stats, text_bytes

if TYPE_CHECKING:
    from corral.api.config import ServerConfig
    from corral.api.protocol import ChatCompletionRequest, CompletionRequest, Tool
    from corral.api.response_formats import ResponseFormat
    from corral.api.schema_forms import SchemaForms

TOO_COMPLEX = "constraint_too_complex"


def check_limits(
    req: ChatCompletionRequest | CompletionRequest, config: ServerConfig, forms: SchemaForms
) -> None:
    """Raise the 400 for the first limit ``req`` exceeds: the number of tools, then the size,
    depth, properties and enum values of each constraint (``n`` is ``check_n``'s, with the
    other sampling parameters). A json_schema's stats are measured once per form, remembered
    in the server's ``forms``.

    ``req`` is a parsed chat or completions request whose constraint extensions are already
    folded into ``response_format`` (see ``protocol``). Run it before planning tools or
    compiling anything: it is O(size of the request) and never recurses."""
    tools = getattr(req, "tools", None) or []
    check_count("tools", len(tools), config.max_tools, "tools", "max_tools", "--max-tools")
    for param, stats in _constraint_stats(req.response_format, tools, forms):
        _check_stats(param, stats, config)


def check_n(n: int, config: ServerConfig) -> None:
    """400 when a request asks for more choices than the server allows (``--max-n``)."""
    check_count("n", n, config.max_n, "choices", "max_n", "--max-n")


def check_count(param: str, value: int, bound: int, what: str, limit: str, flag: str) -> None:
    """400 ``invalid_value`` when a request asks for more than ``bound`` of ``what``."""
    if value > bound:
        raise ApiError(
            400,
            f"{param}: the request asks for {value:,} {what}, but this server allows at most "
            f"{bound:,} per request ({limit}, its {flag} setting)",
            param=param,
            code="invalid_value",
            extra={"limit": limit},
        )


def _constraint_stats(
    fmt: ResponseFormat | None, tools: list[Tool], forms: SchemaForms
) -> Iterator[tuple[str, SchemaStats]]:
    """(param, stats) for the response format, then the tools' schemas as one running total
    (they compile into one constraint), yielded after each tool."""
    if fmt is not None:
        if fmt.type == "json_schema":
            yield fmt.param, forms.stats(fmt.schema_form(), fmt.json_schema.schema_)
        elif fmt.type == "regex":
            yield fmt.param, SchemaStats(size=text_bytes(fmt.regex))
        elif fmt.type == "grammar":
            yield fmt.param, SchemaStats(size=text_bytes(fmt.grammar))
        elif fmt.type == "choice":
            size = sum(text_bytes(c) + 3 for c in fmt.choice)  # quotes and a comma each
            yield fmt.param, SchemaStats(size=size, enum_values=len(fmt.choice))
        elif fmt.type == "structural_tag":  # its schemas and strings, as one document
            tag = {"structures": fmt.structures, "triggers": fmt.triggers, "sep": fmt.separator}
            yield fmt.param, schema_stats(tag)
    total = SchemaStats()
    for i, tool in enumerate(tools):
        one = schema_stats(tool.function.parameters)
        total.size += one.size
        total.properties += one.properties
        total.enum_values += one.enum_values
        total.depth, total.deepest = one.depth, one.deepest  # depth is per schema
        yield f"tools[{i}].function.parameters", total


def _check_stats(param: str, stats: SchemaStats, config: ServerConfig) -> None:
    checks = (
        (stats.size, config.max_schema_bytes, "max_schema_bytes", "--max-schema-bytes",
         "is {value:,} bytes as JSON text"),
        (stats.depth, config.max_schema_depth, "max_schema_depth", "--max-schema-depth",
         "nests JSON objects and arrays {value:,} levels deep"),
        (stats.properties, config.max_schema_properties, "max_schema_properties",
         "--max-schema-properties", "declares {value:,} properties (all objects together)"),
        (stats.enum_values, config.max_enum_values, "max_enum_values", "--max-enum-values",
         "lists {value:,} enum values or choices (all enums together)"),
    )  # fmt: skip
    for value, bound, limit, flag, what in checks:
        if value > bound:
            # for depth: where the document first goes past the bound, on its deepest path
            pointer = json_pointer(stats.deepest[:bound]) if limit == "max_schema_depth" else None
            summed = param.startswith("tools[") and limit != "max_schema_depth"
            together = " (the tools' schemas together)" if summed else ""
            raise ApiError(
                400,
                f"{param}{together} {what.format(value=value)}; this server allows at most "
                f"{bound:,} ({limit}, its {flag} setting)",
                param=param,
                code=TOO_COMPLEX,
                extra={"limit": limit, "pointer": pointer},
            )
