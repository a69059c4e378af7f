"""Request limits: what one request may ask for, checked before any compile, each a clear 400.

The bounds are the server's configuration (``ServerConfig``: ``max_n``, ``max_tools``,
``max_schema_bytes``, ``max_schema_depth``, ``max_schema_properties``, ``max_enum_values``) and
are listed beside OpenAI's in the README's "Limits" section. A refusal names the request field
(``param``), the limit (``limit``, the setting's name), the request's value and the bound.

Every walk here is iterative and linear in the size of the request: schemas arrive thousands
of levels deep, and nothing may recurse on them (or spend more than O(size)) before these checks
have passed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from corral.api.errors import ApiError

if TYPE_CHECKING:
    from corral.api.config import ServerConfig
    from corral.api.protocol import ChatCompletionRequest, CompletionRequest, Tool
    from corral.api.response_formats import ResponseFormat

TOO_COMPLEX = "constraint_too_complex"

# Schema keywords whose value is a map of subschemas, a list of them, or one subschema; the
# values of any other keyword (enum, const, default, examples, unknown ones) are data.
_SCHEMA_MAPS = frozenset(
    ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
)
_SCHEMA_LISTS = frozenset(("allOf", "anyOf", "oneOf", "prefixItems", "items"))
_SCHEMA_ONE = frozenset(
    ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
     "unevaluatedItems", "unevaluatedProperties", "additionalItems", "contentSchema")
)  # fmt: skip
_SCALAR_BYTES = {True: 4, False: 5, None: 4}
_CONTAINERS = (dict, list)


# -- schema statistics --------------------------------------------------------------------------


@dataclass
class SchemaStats:
    """Size measures of one JSON schema document (or of several, summed).

    ``size``: bytes of the document as compact JSON text; ``depth``: deepest nesting of JSON
    objects and arrays (the root object is 1), reached along ``deepest`` (a path);
    ``properties``: members of every ``properties`` map; ``enum_values``: items of every
    ``enum``."""

    size: int = 0
    depth: int = 0
    deepest: tuple[str | int, ...] = ()
    properties: int = 0
    enum_values: int = 0


_DATA, _SCHEMA, _SCHEMA_MAP = 0, 1, 2  # what a node of a schema document is
#: A container on the walk's stack: (node, depth, role, the parent's entry, the key in it).
_Entry = tuple[Any, int, int, "_Entry | None", "str | int | None"]


def schema_stats(schema: Any) -> SchemaStats:
    """Measure a schema in one iterative pass (no recursion, O(size)).

    It runs on every constrained request, so it is written for speed: only containers go on the
    stack, each with its parent's entry and its key (the path to the deepest one is rebuilt at
    the end, not copied for every container), and ASCII text is measured by ``len``."""
    stats = SchemaStats(size=_scalar_bytes(schema))
    if not isinstance(schema, _CONTAINERS):
        return stats
    root: _Entry = (schema, 1, _SCHEMA, None, None)
    stack, deepest = [root], root
    size = 0
    while stack:
        entry = stack.pop()
        node, depth, role = entry[0], entry[1], entry[2]
        if depth > stats.depth:
            stats.depth, deepest = depth, entry
        if isinstance(node, dict):
            size += 1 + 2 * len(node) if node else 2  # braces, colons, commas
            for key, value in node.items():
                size += (len(key) if key.isascii() else _text_bytes(key)) + 2
                if isinstance(value, _CONTAINERS):
                    child = _child_role(stats, role, key, value)
                    stack.append((value, depth + 1, child, entry, key))
                elif isinstance(value, str) and value.isascii():
                    size += len(value) + 2
                else:
                    size += _scalar_bytes(value)
        else:
            size += 1 + len(node) if node else 2  # brackets, commas
            for i, value in enumerate(node):
                if isinstance(value, _CONTAINERS):
                    stack.append((value, depth + 1, role, entry, i))
                elif isinstance(value, str) and value.isascii():
                    size += len(value) + 2
                else:
                    size += _scalar_bytes(value)
    stats.size += size
    path: list[str | int] = []
    while deepest[3] is not None:
        path.append(deepest[4])
        deepest = deepest[3]
    stats.deepest = tuple(reversed(path))
    return stats


def _scalar_bytes(value: Any) -> int:
    """Bytes of a JSON scalar as text (0 for a container: the walk counts those)."""
    if isinstance(value, str):
        return _text_bytes(value) + 2
    if isinstance(value, bool) or value is None:
        return _SCALAR_BYTES[value]
    if isinstance(value, int | float):
        return len(repr(value))
    return 0


def _child_role(stats: SchemaStats, role: int, key: str, value: Any) -> int:
    """What the value of member ``key`` of a node with ``role`` is; counts properties and enums."""
    if role == _SCHEMA_MAP:
        return _SCHEMA
    if role == _DATA:
        return _DATA
    if key in _SCHEMA_MAPS and isinstance(value, dict):
        if key == "properties":
            stats.properties += len(value)
        return _SCHEMA_MAP
    if key == "enum" and isinstance(value, list):
        stats.enum_values += len(value)
        return _DATA
    return _SCHEMA if key in _SCHEMA_LISTS or key in _SCHEMA_ONE else _DATA


def _text_bytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _pointer(path: tuple[str | int, ...]) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


# -- the checks ---------------------------------------------------------------------------------


def check_limits(req: ChatCompletionRequest | CompletionRequest, config: ServerConfig) -> None:
    """Raise the 400 for the first limit ``req`` exceeds: the number of tools, then the size,
    depth, properties and enum values of each constraint (``n`` is ``check_n``'s, with the
    other sampling parameters).

    ``req`` is a parsed chat or completions request whose constraint extensions are already
    folded into ``response_format`` (see ``protocol``). Run it before planning tools or
    compiling anything: it is O(size of the request) and never recurses."""
    tools = getattr(req, "tools", None) or []
    check_count("tools", len(tools), config.max_tools, "tools", "max_tools", "--max-tools")
    for param, stats in _constraint_stats(req.response_format, tools):
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
    fmt: ResponseFormat | None, tools: list[Tool]
) -> Iterator[tuple[str, SchemaStats]]:
    """(param, stats) for the response format, then the tools' schemas as one running total
    (they compile into one constraint), yielded after each tool."""
    if fmt is not None:
        if fmt.type == "json_schema":
            from corral.api.schema_forms import FORMS  # it imports this module

            yield fmt.param, FORMS.stats(fmt.schema_form(), fmt.json_schema.schema_)
        elif fmt.type == "regex":
            yield fmt.param, SchemaStats(size=_text_bytes(fmt.regex))
        elif fmt.type == "grammar":
            yield fmt.param, SchemaStats(size=_text_bytes(fmt.grammar))
        elif fmt.type == "choice":
            size = sum(_text_bytes(c) + 3 for c in fmt.choice)  # quotes and a comma each
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
            pointer = _pointer(stats.deepest[:bound]) if limit == "max_schema_depth" else None
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
