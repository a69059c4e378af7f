"""What a JSON schema holds, counted in one iterative walk: the figures the request limits bound.

``schema_stats`` measures size, depth, properties and enum values without recursing (schemas
arrive thousands of levels deep) and in time linear in the schema; ``limits`` compares them with
the server's bounds, ``schema_forms`` remembers them per schema form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
                size += (len(key) if key.isascii() else text_bytes(key)) + 2
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
        return text_bytes(value) + 2
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


def text_bytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def json_pointer(path: tuple[str | int, ...]) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


# -- the checks ---------------------------------------------------------------------------------
