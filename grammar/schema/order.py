"""Optional properties in any order: a rewrite of the analysed schema for the backend.

The backend lays out an object's declared ``properties`` in the order the schema lists them,
before its free-form keys (``patternProperties``, ``additionalProperties``), which come in any
order (``backends.quirks.DECLARED_PROPERTIES_IN_ORDER``), so an instance listing an optional
property earlier is valid but cannot be produced. So an optional property ``p`` with schema
``S`` becomes the pattern property ``^p$: S``: the same instances are valid (a key named ``p``
is checked against ``S`` either way, and ``additionalProperties`` still applies to exactly the
other keys), and ``p`` may now come anywhere after the required keys -- but, as a free-form key,
it could also come twice. The rewrite is therefore only made together with the check that no
object repeats a key (``distinct_keys``), and only on open objects (``additionalProperties`` not
false), whose keys can always be finished as a new key, so that check never leaves a dead end
(``distinct_keys.dead_end_risk``).

With every declared property required, the backend also enforces ``minProperties`` and
``maxProperties`` over the pattern keys (``quirks.MIN_MAX_PROPERTIES_NEED_ALL_REQUIRED``).

Where it is not made: objects with a required key declared after an optional one (the required
keys stay declared, so they would be laid out before the freed one and the declared order would
be lost) or not declared at all, with their own ``patternProperties`` (pattern keys must be
disjoint: ``quirks.PATTERN_KEYS_DISJOINT``) or ``unevaluatedProperties``; `anyOf`/`oneOf`
branches merged with their holder's object keywords, and the holder itself; anything inside an
``allOf`` or a ``$ref`` next to other keywords, or in a definition referenced from there
(``schema_merges``: the backend merges those, ``quirks.MERGED_PROPERTIES_IN_KEYWORD_ORDER``).
Nor anywhere when some object elsewhere could run out of new keys: the key check applies to the
whole output (``dead_end_risk``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from corral.grammar.checks.distinct_keys import dead_end_risk
from corral.grammar.regex.algebra import RegexAlgebra
from corral.grammar.regex.translate import literal_regex
from corral.grammar.schema.backend_merges import (
    SCHEMA_LISTS,
    SCHEMA_MAPS,
    SCHEMAS,
    merged_definitions,
)

#: The most properties freed in one object: llguidance's compile grows fast with the number of
#: pattern properties (Llama-3, one object of optional strings: 64 in 0.03 s, 128 in 3 s, 800
#: past a minute), so past this the declared order stays.
MAX_FREED = 64


def backend_layout(
    schema: Any,
    distinct_keys: bool,
    sources: Mapping[str, str] | None = None,
    algebra: RegexAlgebra | None = None,
) -> tuple[Any, bool, list[dict]]:
    """The analysed ``schema`` as handed to the backend, whether its matcher must refuse
    repeated keys: ``distinct_keys`` (the analysis needs it), or because optional properties
    were freed here (only where that check leaves no dead end), and the object nodes of
    ``schema`` whose optional properties were freed. ``sources``: the Python source of each
    backend regex (``dead_end_risk`` reads key patterns' automata, with ``algebra``'s memos)."""
    changed: list[tuple[dict, str]] = []
    freed = free_order(schema, changed)
    if freed is None or (not distinct_keys and dead_end_risk(schema, sources, algebra) is not None):
        return schema, distinct_keys, []
    return freed, True, list({id(node): node for node, _ in changed}.values())


def free_order(schema: Any, changed: list[tuple[dict, str]] | None = None) -> Any | None:
    """``schema`` with optional properties of open objects made pattern properties; None when
    nothing changes. ``changed`` collects (object node of ``schema``, property name) freed."""
    changed = [] if changed is None else changed
    frozen: set[str] = set()
    if isinstance(schema, dict):
        defs = schema.get("$defs")
        frozen = merged_definitions(schema, defs if isinstance(defs, dict) else {}, _merges)
    out = _rewrite(schema, changed, {}, frozen="" in frozen, frozen_defs=frozen)
    per_object = Counter(id(node) for node, _ in changed).values()
    return out if changed and max(per_object) <= MAX_FREED else None


def _subschemas(node: dict):
    """The (keyword, subschema-or-container) pairs of a schema node that hold schemas."""
    for key, value in node.items():
        if key in SCHEMA_MAPS or key in SCHEMA_LISTS or key in SCHEMAS:
            yield key, value


def _merges(node: dict) -> bool:
    """Whether the backend merges this node's subschemas with each other: ``allOf``, or
    ``$ref`` next to siblings."""
    return "allOf" in node or ("$ref" in node and len(node) > 1)


_OBJECT_KEYS = frozenset(
    "properties patternProperties additionalProperties required minProperties maxProperties "
    "unevaluatedProperties dependentRequired".split()
)


def _rewrite(
    node: Any,
    changed: list[tuple[dict, str]],
    memo: dict,
    merged: bool = False,
    frozen: bool = False,
    frozen_defs: frozenset[str] | set[str] = frozenset(),
) -> Any:
    """Copy-on-write: analysed schemas share subtrees, so each is rewritten once (``memo``).
    ``merged``: the node is an `anyOf` branch the backend merges with its holder's object
    keywords; it is left as it is (its keys may be declared next to it). ``frozen``: the node
    is inside an ``allOf`` or a ``$ref`` with siblings, or a definition one may reach
    (``frozen_defs``): nothing under it changes (the merge would meet ``^p$`` next to ``p``)."""
    if isinstance(node, list):
        return [_rewrite(v, changed, memo, merged, frozen, frozen_defs) for v in node]
    if not isinstance(node, dict):
        return node
    entry = (id(node), merged, frozen)
    if entry in memo:
        return memo[entry]
    out = dict(node)
    frozen = frozen or _merges(node)
    for key, value in _subschemas(node):
        if key == "$defs" and isinstance(value, dict):
            out[key] = {
                k: _rewrite(v, changed, memo, False, k in frozen_defs, frozen_defs)
                for k, v in value.items()
            }
        elif key in SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {
                k: _rewrite(v, changed, memo, False, frozen, frozen_defs) for k, v in value.items()
            }
        else:
            inner = key in ("anyOf", "oneOf") and not _OBJECT_KEYS.isdisjoint(node)
            out[key] = _rewrite(value, changed, memo, inner, frozen, frozen_defs)
    free = not merged and not frozen and "anyOf" not in out and "oneOf" not in out
    if free and _open_with_optional(out):
        required = set(out.get("required", ()))
        props = out["properties"]
        out["properties"] = {k: v for k, v in props.items() if k in required}
        patterns = {}
        for name, sub in props.items():
            if name not in required:
                patterns[f"^{literal_regex(name)}$"] = sub
                changed.append((node, name))
        out["patternProperties"] = patterns
    memo[entry] = out
    return out


def _open_with_optional(node: dict) -> bool:
    """An open object with optional properties, every required one declared before them (so
    the declared order stays a layout the rewrite allows)."""
    props = node.get("properties")
    if not isinstance(props, dict) or node.get("additionalProperties") is False:
        return False
    if node.get("patternProperties") or "unevaluatedProperties" in node:
        return False
    required = set(node.get("required", ()))
    if not required <= set(props):
        return False
    flags = [name in required for name in props]
    return not all(flags) and flags == sorted(flags, reverse=True)
