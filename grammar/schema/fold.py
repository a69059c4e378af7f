"""Folding a conjunction over a finite domain into one `enum`.

When a node's own `enum`/`const`, or one of its `allOf` conjuncts (directly or through a
`$ref`), allows only finitely many values, the node accepts exactly those values that pass all
its other keywords. Asking the judge (`jsonschema`) about each value and keeping the survivors
gives a single `enum` the backend compiles instantly, where intersecting enums with ranges and
branches (`allOf [enum, enum, anyOf [...]]`) costs it a regex product per alternative.

Copies: reads the analysed node and its definitions (through `python_dialect`, which copies);
returns a new list of values taken from the node's own `enum`/`const`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jsonschema import Draft202012Validator

from corral.grammar.schema.facts import finite_values, json_equal
from corral.grammar.schema.patterns import python_dialect

#: Largest domain worth judging value by value (each costs one validation).
MAX_DOMAIN = 512


def fold_finite(
    out: dict,
    lookup: Callable[[str], dict | bool | None],
    defs: dict[str, Any],
    sources: dict[str, str] | None,
) -> list | None:
    """The values analysed node `out` accepts, when its conjuncts bound it to a small finite
    domain; None when they do not, when a reference is not analysed yet, or when `sources`
    (backend regex -> Python pattern) is None because a regex's source is ambiguous."""
    if sources is None:
        return None
    domain = finite_domain(out, lookup)
    if domain is None or len(domain) > MAX_DOMAIN:
        return None
    used: set[str] = set()
    if not _refs_ready(out, defs, used, set()):
        return None
    schema = python_dialect(out, sources)
    if used:
        schema = {"$defs": python_dialect({k: defs[k] for k in used}, sources), **schema}
    judge = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    return [v for v in domain if judge.is_valid(v)]


def finite_domain(out: dict, lookup: Callable[[str], dict | bool | None]) -> list | None:
    """Intersection of the finite value sets found on `out` and its direct conjuncts."""
    sets = []
    for part in [out, *out.get("allOf", ())]:
        if isinstance(part, dict) and "$ref" in part and len(part) == 1:
            part = lookup(part["$ref"])
        if isinstance(part, dict) and (values := finite_values(part)) is not None:
            sets.append(values)
    if not sets:
        return None
    first, *rest = sorted(sets, key=len)
    distinct = [v for i, v in enumerate(first) if not any(json_equal(v, w) for w in first[:i])]
    return [v for v in distinct if all(any(json_equal(v, w) for w in s) for s in rest)]


def _refs_ready(s: Any, defs: dict[str, Any], used: set[str], seen: set[int]) -> bool:
    """Every `$ref` reachable from `s` points at a finished definition; collects their names."""
    if isinstance(s, list):
        return all(_refs_ready(x, defs, used, seen) for x in s)
    if not isinstance(s, dict) or id(s) in seen:
        return True
    seen.add(id(s))
    ref = s.get("$ref")
    if isinstance(ref, str):  # "#" (the root) is never finished while its nodes are analysed
        name = ref[len("#/$defs/") :] if ref.startswith("#/$defs/") else ""
        if defs.get(name) is None or not _refs_ready(defs[name], defs, used, seen):
            return False
        used.add(name)
    return all(_refs_ready(v, defs, used, seen) for k, v in s.items() if k not in ("enum", "const"))
