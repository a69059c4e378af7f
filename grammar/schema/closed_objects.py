"""Closed objects: generate only the properties a schema declares.

JSON Schema lets an object carry any property its schema does not mention unless the schema
says ``"additionalProperties": false``. Function and response schemas rarely say it, yet nobody
wants the model to invent keys: a small model given the freedom fills its output with made-up
members (``{"type": {"type": {...`` until ``max_tokens``). :func:`close_objects` narrows a
schema so that such objects get only their declared properties, the way OpenAI's strict mode
and xgrammar's default treat them.

The result is a *narrowing*: every instance it accepts is valid against the original schema
(``jsonschema`` still judges the output by the schema the client sent), and no object that could
be generated before becomes impossible. That is only true where nothing else constrains the same
instance, so an object is closed only when

* it declares ``properties`` and says nothing about extra keys (no ``additionalProperties``,
  ``patternProperties``, ``unevaluatedProperties``, ``propertyNames``), nor lists its instances
  (``enum``, ``const``);
* every ``required`` and ``dependentRequired`` name is declared (and not ``false``), and
  ``minProperties`` does not exceed the declared count, so closing cannot make it unsatisfiable;
* it carries no applicator that constrains the same instance a second way (``allOf``, ``anyOf``,
  ``oneOf``, ``not``, ``if``/``then``/``else``, ``$ref`` with siblings, ``dependentSchemas``,
  ``dependencies``, ``contains``, ``unevaluatedItems``), and it is not reached through one of
  those either: inside ``oneOf`` or ``not`` a narrower branch could let through an instance that
  the original rejects, and inside ``allOf`` two closed branches would contradict each other.

The walk descends through ``properties``, ``items``, ``prefixItems`` and schema-valued
``additionalProperties`` of such plain nodes, and through the branches of a node that is only an
``anyOf`` (a union: narrowing a branch narrows the union).

References: a node that is only ``{"$ref": "#/$defs/X"}`` (plus annotations, and at the root
the ``$defs`` themselves) stands for its target. A definition is closed (as a plain node) when every reference to it anywhere in the
document is such an alias in a plain position; one reference from a conjunctive context keeps it
as it is. A reference to anything but a ``$defs``/``definitions`` entry (``#``, another pointer,
an anchor, ``$dynamicRef``) could see a closed node from a ``not`` or a ``oneOf``, so such a
schema is returned unchanged.

Copies: the input is never changed; the result is new along the paths it closes and shares every
other subtree with the input (it is the input itself when nothing can be closed), so treat it as
read-only.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from corral.grammar.core.input_checks import check_document, nesting_error

_EXTRA_KEY_KEYWORDS = frozenset(
    ("additionalProperties", "patternProperties", "unevaluatedProperties", "propertyNames")
)
_CONJUNCTIVE = frozenset(
    (
        "allOf",
        "anyOf",
        "oneOf",
        "not",
        "if",
        "then",
        "else",
        "$ref",
        "$dynamicRef",
        "$recursiveRef",
        "dependentSchemas",
        "dependencies",
        "unevaluatedItems",
        "contains",
    )
)
_ANNOTATIONS = frozenset(
    ("title", "description", "$comment", "default", "examples", "deprecated", "readOnly",
     "writeOnly")
)  # fmt: skip
#: What may stand next to an ``anyOf`` whose branches are closed: nothing that constrains
#: object members (a node-level ``required`` naming a key one branch does not declare would
#: make that branch unsatisfiable once closed).
_UNION_NEIGHBOURS = _ANNOTATIONS | {"anyOf", "type", "$schema", "$id"}
#: Keys that leave a ``$ref`` node an alias of its target (the root's ``$defs`` are only a place).
_ALIAS_SIBLINGS = _ANNOTATIONS | {"$ref", "$defs", "definitions", "$schema", "$id"}
_DEF_REF = re.compile(r"#/(\$defs|definitions)/([^/]+)")


def close_objects(schema: Any) -> Any:
    """`schema` with ``"additionalProperties": false`` added where that only narrows it.

    Returns a new schema (the input is not modified); what cannot be closed is returned as it is.
    Raises ConstraintError for a schema nested too deeply to walk (``limit="nesting_depth"``) or
    holding a lone surrogate.
    """
    if not isinstance(schema, dict):
        return schema
    check_document(schema)
    try:
        return _close(schema)
    except RecursionError:
        raise nesting_error("schema") from None


def _close(schema: dict) -> dict:
    refs = _references(schema)
    if refs is None:
        return schema  # references that may not mean what a plain walk assumes: leave it all
    # One walk each for the root and every definition: the closed form, and the aliases met in
    # plain positions. A definition is closed when all its references come from the root or
    # from definitions that are closed themselves (a fixed point over those counts).
    root_uses: Counter = Counter()
    out = dict(_Closer(root_uses).close(schema))
    bodies, uses = {}, {}
    for r in refs:
        kind, name = _def_key(r)
        uses[r] = Counter()
        bodies[r] = _Closer(uses[r]).close(schema[kind][name])
    closable = set(refs)
    while True:
        plain = Counter(root_uses)  # (one update per definition: `sum` copies every time)
        for r in closable:
            plain.update(uses[r])
        keep = {r for r in closable if plain[r] == refs[r]}
        if keep == closable:
            break
        closable = keep
    for r in sorted(closable):
        kind, name = _def_key(r)
        if out[kind] is schema[kind]:
            out[kind] = dict(out[kind])  # copied once, not once per definition
        out[kind][name] = bodies[r]
    return out


class _Closer:
    """One walk: closes plain nodes and counts the aliases it meets in plain positions."""

    def __init__(self, plain_uses: Counter) -> None:
        self.plain_uses = plain_uses

    def close(self, node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        keys = set(node)
        if "$ref" in node and keys <= _ALIAS_SIBLINGS:
            self.plain_uses[node["$ref"]] += 1  # an alias: its target is closed, if at all
            return node
        if keys & _CONJUNCTIVE:
            if keys - _UNION_NEIGHBOURS or not isinstance(node.get("anyOf"), list):
                return node
            return {**node, "anyOf": [self.close(b) for b in node["anyOf"]]}
        out = dict(node)
        props = node.get("properties")
        if isinstance(props, dict):
            out["properties"] = {k: self.close(v) for k, v in props.items()}
            if _closable(node, props):
                out["additionalProperties"] = False
        items = node.get("items")
        if isinstance(items, dict):
            out["items"] = self.close(items)
        elif isinstance(items, list):  # drafts before 2020-12: a tuple
            out["items"] = [self.close(x) for x in items]
        if isinstance(node.get("prefixItems"), list):
            out["prefixItems"] = [self.close(x) for x in node["prefixItems"]]
        if isinstance(node.get("additionalProperties"), dict):
            out["additionalProperties"] = self.close(node["additionalProperties"])
        return out


def _closable(node: dict, props: dict) -> bool:
    """Closing `node` only removes instances; true when it also keeps one (see the module)."""
    if set(node) & (_EXTRA_KEY_KEYWORDS | {"enum", "const"}):
        return False  # an enum/const object may carry keys the properties do not list
    allowed = {k for k, v in props.items() if v is not False}
    required = node.get("required", [])
    if not isinstance(required, list) or not all(r in allowed for r in required):
        return False
    dependent = node.get("dependentRequired", {})
    if not isinstance(dependent, dict) or not all(
        isinstance(names, list) and all(n in allowed for n in names) for names in dependent.values()
    ):
        return False
    low = node.get("minProperties", 0)
    return isinstance(low, int) and low <= len(allowed)


def _references(root: dict) -> Counter | None:
    """How often each definition is referenced in the document; None when some reference could
    resolve elsewhere: one that does not name a root ``$defs``/``definitions`` entry directly,
    ``$dynamicRef``/``$recursiveRef``, or an ``$id`` below the root (it moves the base URI)."""
    dialect = str(root.get("$schema", ""))
    draft4 = "draft-04" in dialect or "draft-03" in dialect
    refs: Counter = Counter()
    stack: list[Any] = [(root, True)]
    while stack:
        node, is_root = stack.pop()
        if isinstance(node, list):
            stack.extend((x, False) for x in node)
            continue
        if not isinstance(node, dict):
            continue
        for k, v in node.items():
            if k == "$ref":
                key = _def_key(v) if isinstance(v, str) else None
                if key is None or not isinstance(root.get(key[0]), dict):
                    return None
                if not isinstance(root[key[0]].get(key[1]), dict):
                    return None
                refs[v] += 1
            elif k in ("$dynamicRef", "$recursiveRef"):
                return None
            elif not is_root and isinstance(v, str) and (k == "$id" or (draft4 and k == "id")):
                return None
            else:
                stack.append((v, False))
    return refs


def _def_key(ref: str) -> tuple[str, str] | None:
    """(``$defs`` or ``definitions``, name) when `ref` names a definition directly."""
    m = _DEF_REF.fullmatch(ref)
    if m is None or "~" in m.group(2) or "%" in m.group(2):
        return None  # escaped names: left to the analysis, not closed
    return m.group(1), m.group(2)
