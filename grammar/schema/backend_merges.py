"""Which parts of a schema the backend merges with another: leave their layout as it is.

llguidance merges the object keywords of ``allOf`` parts, ``anyOf``/``oneOf`` branches and
``$ref`` targets with those of the schema that holds them, and it is that merge that decides
how the merged object's properties are laid out (``backends.quirks``:
``MERGED_PROPERTIES_IN_KEYWORD_ORDER``, ``PATTERN_KEYS_DISJOINT``). A rewrite of an object's
layout (``schema_order`` freeing optional properties) must therefore stay out of such nodes, out
of everything below them, and out of the definitions referenced from them; and a definition that
a reference points inside cannot be rewritten either (the pointer would not survive).
``merged_definitions`` finds those definitions; ``merges`` says which nodes merge.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from corral.grammar.backends.quirks import APPLICATORS_READ_IN_ORDER, READ_BEFORE_APPLICATORS

_DEFS = "#/$defs/"
#: Where a schema node holds subschemas: maps of them, lists of them, and single ones.
SCHEMA_MAPS = frozenset(("properties", "patternProperties", "$defs", "dependentSchemas"))
SCHEMA_LISTS = frozenset(("allOf", "anyOf", "oneOf", "prefixItems"))
SCHEMAS = frozenset(
    "items additionalProperties additionalItems contains not if then else propertyNames "
    "unevaluatedProperties unevaluatedItems".split()
)
#: Keywords that say nothing about the instance: the backend merges nothing over them.
_INERT = frozenset(("$defs", "$schema", "$id", "$comment", "title", "description"))


def _subschemas(node: dict):
    """The (keyword, subschema) pairs of a schema node, maps and lists flattened."""
    for key, value in node.items():
        if key in SCHEMA_MAPS and isinstance(value, dict) and key != "$defs":
            for sub in value.values():
                yield key, sub
        elif key in SCHEMA_LISTS and isinstance(value, list):
            for sub in value:
                yield key, sub
        elif key in SCHEMAS:
            yield key, value


def merges(node: dict) -> bool:
    """Whether the backend merges this node's subschemas with each other or with the node
    (conservative: ``anyOf``/``oneOf`` next to any keyword that says something)."""
    if "allOf" in node or ("$ref" in node and len(set(node) - _INERT) > 1):
        return True
    if "anyOf" in node or "oneOf" in node:
        return len(set(node) - _INERT - {"anyOf", "oneOf"}) > 0 or (
            "anyOf" in node and "oneOf" in node
        )
    return False


def merged_definitions(
    schema: dict, defs: dict, merging: Callable[[dict], bool] = merges
) -> set[str]:
    """The definitions (``""``: the root) to leave as they are: those the backend may merge with
    another schema (referenced from inside a merge, and, transitively, everything they
    reference), and those a reference points inside. ``merging``: which nodes merge."""
    merged: set[str] = set()
    stack: list[tuple[Any, bool]] = [(schema, False)]
    stack += [(d, False) for d in defs.values()]
    seen: set[tuple[int, bool]] = set()
    while stack:
        node, inside = stack.pop()
        if not isinstance(node, dict) or (id(node), inside) in seen:
            continue
        seen.add((id(node), inside))
        inside = inside or merging(node)
        ref = node.get("$ref")
        if isinstance(ref, str) and (inside or not _whole(ref, defs)):
            name = _def_name(ref)
            if name not in merged:
                merged.add(name)
                target = schema if name == "" else defs.get(name)
                stack.append((target, True))
        stack += [(sub, inside) for _, sub in _subschemas(node)]
    return merged


def _def_name(ref: str) -> str:
    """The definition a reference points into (``""``: the root, or any other pointer)."""
    if not ref.startswith(_DEFS):
        return ""
    return ref[len(_DEFS) :].split("/")[0].replace("~1", "/").replace("~0", "~")


def _whole(ref: str, defs: dict) -> bool:
    """Whether ``ref`` names the root or a whole definition (a pointer inside one would not
    survive a rewrite of that definition)."""
    return ref == "#" or (ref.startswith(_DEFS) and ref[len(_DEFS) :] in defs)


def map_schemas(node: Any, change: Callable[[dict], dict], memo: dict[int, Any]) -> Any:
    """``node`` with ``change`` applied to each schema node, innermost first (``properties``,
    ``$defs``, branches, ``items``...; ``const``/``enum`` values are not schemas). Copy-on-write:
    each shared subtree is mapped once (``memo``, by id), and stays shared."""
    if not isinstance(node, dict):
        return node
    if id(node) in memo:
        return memo[id(node)]
    out: dict = {}
    for key, value in node.items():
        if key in SCHEMA_MAPS and isinstance(value, dict):
            value = {k: map_schemas(v, change, memo) for k, v in value.items()}
        elif key in SCHEMA_LISTS and isinstance(value, list):
            value = [map_schemas(v, change, memo) for v in value]
        elif key in SCHEMAS:
            value = map_schemas(value, change, memo)
        out[key] = value
    memo[id(node)] = out = change(out)
    return out


def pattern_keys_first(node: Any) -> Any:
    """``node`` with ``patternProperties`` and ``additionalProperties`` ahead of every
    ``allOf``/``anyOf``/``oneOf`` of the same schema: written after one, the backend loses them
    to its merge (``quirks.PATTERN_KEYS_READ_BEFORE_APPLICATORS``). Nothing else moves: the
    order of ``properties`` against an ``allOf`` decides which keys the backend lays out first
    (``quirks.MERGED_PROPERTIES_IN_KEYWORD_ORDER``)."""
    return map_schemas(node, _pattern_keys_first, {})


def _pattern_keys_first(node: dict) -> dict:
    keys = list(node)
    first = next((i for i, k in enumerate(keys) if k in APPLICATORS_READ_IN_ORDER), len(keys))
    late = [k for k in keys[first:] if k in READ_BEFORE_APPLICATORS]
    if not late:
        return node
    order = keys[:first] + late + [k for k in keys[first:] if k not in READ_BEFORE_APPLICATORS]
    return {k: node[k] for k in order}
