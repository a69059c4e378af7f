"""What the schema a negation is conjoined with says about each position (``schema_negate``).

A negation is only ever used beside the schema it was taken in (``not``'s siblings, the other
``oneOf`` branch), so an instance it describes also satisfies that context. The negation may
therefore leave out every instance the context rejects: where the context says a property is a
string, "the property fails ``items``" needs no ``contains`` (no string is an array), and where
every item the context allows fails a schema, "some item fails it" is "there is an item".

Only types are read, and only as a superset (``type``/``const``/``enum``, through ``$ref``,
``allOf`` and ``anyOf``/``oneOf``); an unknown context is ``True``, so a negation in it is the
plain one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from corral.grammar.schema.facts import ALL_TYPES, intersect_types, types_of

Schema = dict | bool
_DEPTH = 8


class NegationContext:
    """Reads context schemas; ``lookup`` maps an analysed ``$ref`` to its target (or None)."""

    def __init__(self, lookup: Callable[[str], Schema | None]) -> None:
        self._lookup = lookup

    def types(self, ctx: Any, depth: int = 0) -> frozenset[str]:
        """A superset of the types of the instances ``ctx`` accepts."""
        ctx = self._resolve(ctx)
        if ctx is False:
            return frozenset()
        if not isinstance(ctx, dict) or depth > _DEPTH:
            return ALL_TYPES
        out = types_of(ctx)
        for sub in ctx.get("allOf", ()):
            out = intersect_types(out, self.types(sub, depth + 1))
        for key in ("anyOf", "oneOf"):
            if isinstance(ctx.get(key), list):
                either: frozenset[str] = frozenset()
                for sub in ctx[key]:
                    either |= self.types(sub, depth + 1)
                out = intersect_types(out, either)
        if "$ref" in ctx:
            out = intersect_types(out, self.types({"$ref": ctx["$ref"]}, depth + 1))
        return out

    def member(self, ctx: Any, name: str, depth: int = 0) -> Schema:
        """The context of property ``name``'s value (``True``: nothing known)."""
        return self._child(ctx, depth, lambda c: _member(c, name))

    def item(self, ctx: Any, index: int, depth: int = 0) -> Schema:
        """The context of the item at ``index``."""
        return self._child(ctx, depth, lambda c: _item(c, index))

    def _child(self, ctx: Any, depth: int, own: Callable[[dict], Schema]) -> Schema:
        ctx = self._resolve(ctx)
        if not isinstance(ctx, dict) or depth > _DEPTH:
            return True
        parts = [own(ctx)]
        parts += [self._child(sub, depth + 1, own) for sub in ctx.get("allOf", ())]
        if "$ref" in ctx:
            parts.append(self._child({"$ref": ctx["$ref"]}, depth + 1, own))
        parts = [p for p in parts if p is not True]
        if not parts:
            return True
        return parts[0] if len(parts) == 1 else {"allOf": parts}

    def _resolve(self, ctx: Any) -> Any:
        if isinstance(ctx, dict) and set(ctx) == {"$ref"}:
            target = self._lookup(ctx["$ref"]) if isinstance(ctx["$ref"], str) else None
            return True if target is None else target
        return True if ctx is None else ctx


def _member(ctx: dict, name: str) -> Schema:
    if "object" not in types_of(ctx):
        return True  # the context has no objects: nothing to say about their members
    props = ctx.get("properties")
    if isinstance(props, dict) and name in props:
        return props[name]
    if ctx.get("patternProperties"):
        return True  # the name may match a pattern: unknown here
    extra = ctx.get("additionalProperties", True)
    return extra if isinstance(extra, dict | bool) else True


def _item(ctx: dict, index: int) -> Schema:
    if "array" not in types_of(ctx):
        return True
    prefix = ctx.get("prefixItems")
    if isinstance(prefix, list) and index < len(prefix):
        return prefix[index]
    items = ctx.get("items", True)
    return items if isinstance(items, dict | bool) else True
