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
  ``patternProperties``, ``unevaluatedProperties``, ``propertyNames``);
* every ``required`` name is declared, and ``minProperties`` (if any) does not exceed the
  declared count, so closing cannot make it unsatisfiable;
* it carries no applicator that constrains the same instance a second way (``allOf``, ``anyOf``,
  ``oneOf``, ``not``, ``if``/``then``/``else``, ``$ref``, ``dependentSchemas``,
  ``dependencies``, ``$dynamicRef``), and it is not reached through one of those either: inside
  ``oneOf`` or ``not`` a narrower branch could let an instance through that the original
  rejects, and inside ``allOf`` two closed branches would contradict each other.

The walk descends through ``properties``, ``items``, ``prefixItems`` and schema-valued
``additionalProperties`` of such plain nodes, and through the branches of a node that is only an
``anyOf`` (a union: narrowing a branch narrows the union). ``$defs`` are left as they are, since
a definition may be referenced from a conjunctive context.
"""

from __future__ import annotations

from typing import Any

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


def close_objects(schema: Any) -> Any:
    """`schema` with ``"additionalProperties": false`` added where that only narrows it.

    Returns a new schema (the input is not modified); anything that is not a plain object
    schema is returned as it is.
    """
    return _close(schema)


def _close(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    if set(node) & _CONJUNCTIVE:
        if set(node) - _UNION_NEIGHBOURS or not isinstance(node.get("anyOf"), list):
            return node
        return {**node, "anyOf": [_close(b) for b in node["anyOf"]]}
    out = dict(node)
    props = node.get("properties")
    if isinstance(props, dict):
        out["properties"] = {k: _close(v) for k, v in props.items()}
        if _closable(node, props):
            out["additionalProperties"] = False
    if isinstance(node.get("items"), dict):
        out["items"] = _close(node["items"])
    elif isinstance(node.get("items"), list):  # drafts before 2020-12: a tuple
        out["items"] = [_close(x) for x in node["items"]]
    if isinstance(node.get("prefixItems"), list):
        out["prefixItems"] = [_close(x) for x in node["prefixItems"]]
    if isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = _close(node["additionalProperties"])
    return out


#: What may stand next to an ``anyOf`` whose branches are closed: nothing that constrains
#: object members (a node-level ``required`` naming a key one branch does not declare would
#: make that branch unsatisfiable once closed).
_UNION_NEIGHBOURS = frozenset(
    (
        "anyOf",
        "type",
        "title",
        "description",
        "$comment",
        "default",
        "examples",
        "$schema",
        "$id",
        "deprecated",
        "readOnly",
        "writeOnly",
    )
)


def _closable(node: dict, props: dict) -> bool:
    """Closing `node` only removes instances; true when it also keeps one (see the module)."""
    if set(node) & (_EXTRA_KEY_KEYWORDS | {"enum", "const"}):
        return False  # an enum/const object may carry keys the properties do not list
    required = node.get("required", [])
    if not isinstance(required, list) or not all(r in props for r in required):
        return False
    dependent = node.get("dependentRequired", {})
    if not isinstance(dependent, dict) or not all(
        isinstance(names, list) and all(n in props for n in names) for names in dependent.values()
    ):
        return False
    low = node.get("minProperties", 0)
    return isinstance(low, int) and low <= len(props)
