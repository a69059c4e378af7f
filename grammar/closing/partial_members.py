"""The members an open object of a partial JSON instance (`partial_json`) may still take.

The grammar writes declared properties first, in declared order, then the others; a key begun
under `patternProperties` finishes as the shortest name its pattern allows.
"""

from __future__ import annotations

from corral.grammar.closing.shortest import JsonCloser, Schema, complete_string
from corral.grammar.closing.strings import Patterns


def pattern_names(
    node: dict, typed: str, present: tuple[str, ...], patterns: Patterns
) -> list[str]:
    """Names a `patternProperties` key begun as `typed` may be finished as (the shortest for
    each pattern, read through the closer's `patterns`), where the object does not hold them
    yet."""
    out = []
    for pattern in node.get("patternProperties", {}):
        rest = complete_string({"type": "string", "pattern": pattern}, typed, patterns)
        if rest is not None and typed + rest not in present:
            out.append(typed + rest)
    return out


def next_names(node: dict, present: tuple[str, ...]) -> tuple[list[str], bool]:
    """The declared property names that may follow `present`, and whether an undeclared one
    may: the grammar writes declared properties first, in declared order, then the others."""
    order = {name: i for i, name in enumerate(node.get("properties", {}))}
    undeclared = node.get("additionalProperties", True) is not False
    if any(k not in order for k in present):
        return [], undeclared
    last = max((order[k] for k in present), default=-1)
    return [n for n, i in order.items() if i > last], undeclared


def in_order(node: dict, name: str, rest: list[tuple[str, str]]) -> bool:
    """Whether the missing required properties `rest` may still follow property `name`."""
    order = node.get("properties", {})
    if name not in order:
        return all(k not in order for k, _ in rest)
    names = list(order)
    return all(k not in order or names.index(k) > names.index(name) for k, _ in rest)


def cheapest_member(c: JsonCloser, node: Schema, present: tuple[str, ...]):
    """[(name, value)]: the shortest property `node` still allows, or None."""
    if not isinstance(node, dict):
        return None
    names, undeclared = next_names(node, present)
    if undeclared and "" not in present and "" not in node.get("properties", {}):
        names.append("")
    names += pattern_names(node, "", present, c.patterns)
    options = [(n, c.shortest(c.child(node, n))) for n in names]
    options = [(n, v) for n, v in options if v is not None]
    best = min(options, key=lambda o: len(c.dumps(o[0])) + len(o[1]), default=None)
    return None if best is None else [best]
