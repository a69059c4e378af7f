"""Required properties in any order: one backend layout per order of an object's required keys.

llguidance lays out an object's declared ``properties`` in the order the schema lists them, so
a valid instance that lists two required keys the other way round cannot be produced
(``schema_order`` frees the optional ones, never the required: a free key cannot be required).
An object node ``N`` with required keys ``r1..rk`` becomes ``anyOf`` over the ``k!`` copies of
``N`` whose ``properties`` list the required keys in each order (the optional ones after them,
in their declared order, or free where ``schema_order`` frees them; the declared order stays
one of the copies, so an optional key before a required one is still produced there only).
The order of ``properties`` means nothing to JSON Schema, so every copy accepts exactly the
instances ``N`` does and so does their union: the rewrite is exact by construction. It adds no
free key, so no key may repeat and no dead end appears (each copy's grammar is the backend's
own; a free key ``schema_order`` makes of an optional one comes with its repeated-key check).

Size: each layout copies the object's property schemas (the backend compiles every copy: it
refuses a definition it finds unsatisfiable where it silently drops such a property or branch
inline, so they are not shared through ``$defs``); ``k`` is at most ``MAX_REQUIRED``, a schema
gets at most ``MAX_LAYOUTS`` layouts, and one object's copies at most ``MAX_COPIED`` characters;
an object holding layouts somewhere below keeps its order (the innermost objects get theirs).

Where it is not made: nodes the backend merges with another (``allOf``, ``$ref`` next to other
keywords, ``anyOf``/``oneOf`` next to other keywords -- there the merge decides the layout), and
everything below or referenced from them; nodes with their own ``allOf``/``anyOf``/``oneOf``/
``$ref``, ``unevaluatedProperties`` or dependencies; required keys not all declared.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from typing import Any

#: The most required keys laid out in every order, and the most layouts in one schema. Each
#: layout is an object the backend compiles anew (its free-key lexemes included): on the
#: MaskBench sample these bounds cost llguidance's compile 1.3x at the median, at most 6x
#: (4 keys, or 96 layouts: 1.7x, at most 39x), and leave no gain out.
MAX_REQUIRED = 3
MAX_LAYOUTS = 12
#: The most characters of property schemas copied into the layouts of one object.
MAX_COPIED = 50_000

_DEFS = "#/$defs/"
_SCHEMA_MAPS = frozenset(("properties", "patternProperties", "$defs", "dependentSchemas"))
_SCHEMA_LISTS = frozenset(("allOf", "anyOf", "oneOf", "prefixItems"))
_SCHEMAS = frozenset(
    "items additionalProperties additionalItems contains not if then else propertyNames "
    "unevaluatedProperties unevaluatedItems".split()
)
#: Keywords that say nothing about the instance: the backend merges nothing over them.
_INERT = frozenset(("$defs", "$schema", "$id", "$comment", "title", "description"))
#: Keywords that keep a node out of the rewrite (merged by the backend, or order-sensitive).
_BLOCKING = frozenset(
    "allOf anyOf oneOf $ref unevaluatedProperties dependentRequired dependentSchemas "
    "dependencies if then else not".split()
)


def permute_required(schema: Any, copied: dict[int, dict] | None = None) -> Any:
    """``schema`` with the required keys of its free-standing objects allowed in any order;
    ``schema`` itself when nothing changes. ``copied`` collects, per layout made (by id), the
    object node of ``schema`` it copies."""
    if not isinstance(schema, dict):
        return schema
    defs = schema.get("$defs")
    defs = defs if isinstance(defs, dict) else {}
    merged = merged_definitions(schema, defs)
    rewriter = _Rewriter({} if copied is None else copied)
    out = rewriter.node(schema, "" in merged, root=True)
    new_defs = {name: rewriter.node(d, name in merged) for name, d in defs.items()}
    if not rewriter.changed:
        return schema
    return {**out, "$defs": new_defs} if defs else out


def _subschemas(node: dict):
    """The (keyword, subschema) pairs of a schema node, maps and lists flattened."""
    for key, value in node.items():
        if key in _SCHEMA_MAPS and isinstance(value, dict) and key != "$defs":
            for sub in value.values():
                yield key, sub
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            for sub in value:
                yield key, sub
        elif key in _SCHEMAS:
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
    survive that node turning into its layouts)."""
    return ref == "#" or (ref.startswith(_DEFS) and ref[len(_DEFS) :] in defs)


class _Rewriter:
    """Copy-on-write over the analysed schema (shared subtrees are rewritten once)."""

    def __init__(self, copied: dict[int, dict]) -> None:
        self.copied = copied
        self.memo: dict[tuple[int, bool], Any] = {}
        self.layouts = 0
        self.changed = False
        #: outputs holding layouts: an object around them keeps its order (no copies of copies)
        self.nested: set[int] = set()

    def node(self, node: Any, merged: bool, root: bool = False) -> Any:
        if isinstance(node, list):
            return [self.node(v, merged) for v in node]
        if not isinstance(node, dict):
            return node
        if (id(node), merged) in self.memo:
            return self.memo[id(node), merged]
        inner = merged or merges(node)
        out = dict(node)
        subs: list = []
        for key, value in node.items():
            if key == "$defs":
                continue
            if key in _SCHEMA_MAPS and isinstance(value, dict):
                out[key] = {k: self.node(v, inner) for k, v in value.items()}
                subs += out[key].values()
            elif key in _SCHEMA_LISTS or key in _SCHEMAS:
                out[key] = self.node(value, inner)
                subs += out[key] if isinstance(out[key], list) else [out[key]]
        nested = any(id(sub) in self.nested for sub in subs)
        if not inner and not nested and (layouts := self._layouts(out)) is not None:
            self.copied.update((id(layout), node) for layout in layouts)
            defs = out.pop("$defs", None) if root else None
            out = {"anyOf": layouts} if defs is None else {"$defs": defs, "anyOf": layouts}
            self.changed = nested = True
        elif all(out[k] is node[k] for k in node):
            out = node
        if nested:
            self.nested.add(id(out))
        self.memo[id(node), merged] = out
        return out

    def _layouts(self, node: dict) -> list[dict] | None:
        """The copies of object node ``node``, one per order of its required keys; None when
        the node is left as it is."""
        props, required = node.get("properties"), node.get("required")
        if not isinstance(props, dict) or not isinstance(required, list):
            return None
        names = list(dict.fromkeys(required))
        if not names or len(names) > MAX_REQUIRED or not set(names) <= set(props):
            return None
        if len(names) == 1 and list(props)[0] == names[0]:  # the declared order is free
            return None
        if not _BLOCKING.isdisjoint(node):
            return None
        count = math.factorial(len(names))
        if self.layouts + count > MAX_LAYOUTS:
            return None
        if len(json.dumps(props, default=str)) * count > MAX_COPIED:
            return None
        self.layouts += count
        optional = [name for name in props if name not in names]
        body = {k: v for k, v in node.items() if k != "$defs"}
        out = [{**body, "properties": props}]
        for order in itertools.permutations(names):
            layout = {name: props[name] for name in (*order, *optional)}
            if list(layout) != list(props):
                out.append({**body, "properties": layout})
        return out
