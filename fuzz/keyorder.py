"""Object keys in schema order: the order engines generate properties in.

JSON objects are unordered, but grammar engines emit the properties a schema lists in the order
it lists them, with any other keys after. Every engine tested refuses other orders, so a valid
instance is checked in schema order first (a refusal there is a real over-constraint) and in its
own order second (a refusal only there is reported as the milder ``key-order`` finding).

Schema copies: none; the schema is only read, and the value returned is a new object.
"""

from __future__ import annotations

from typing import Any

_MAX_DEPTH = 64


def schema_order(schema: Any, value: Any) -> Any:
    """``value`` with the keys of every object moved into the order its schema lists them."""
    return _order(schema, schema, value, 0)


def _resolve(root: Any, node: Any, depth: int) -> list[dict]:
    """``node`` plus the schemas it pulls in through local ``$ref`` and combinators."""
    if not isinstance(node, dict) or depth > _MAX_DEPTH:
        return []
    out = [node]
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            target = target.get(part) if isinstance(target, dict) else None
        out += _resolve(root, target, depth + 1)
    for key in ("allOf", "anyOf", "oneOf"):
        for branch in node.get(key) or []:
            out += _resolve(root, branch, depth + 1)
    return out


def _order(root: Any, node: Any, value: Any, depth: int) -> Any:
    schemas = _resolve(root, node, depth)
    if isinstance(value, dict):
        listed: dict[str, list[Any]] = {}
        for s in schemas:
            props = s.get("properties")
            if isinstance(props, dict):
                for name, sub in props.items():
                    listed.setdefault(name, []).append(sub)
        extra = [
            s["additionalProperties"]
            for s in schemas
            if isinstance(s.get("additionalProperties"), dict)
        ]
        keys = [k for k in listed if k in value] + [k for k in value if k not in listed]
        return {k: _order_any(root, listed.get(k) or extra, value[k], depth + 1) for k in keys}
    if isinstance(value, list):
        out = []
        for i, v in enumerate(value):
            subs = []
            for s in schemas:
                prefix = s.get("prefixItems")
                if isinstance(prefix, list) and i < len(prefix):
                    subs.append(prefix[i])
                elif isinstance(s.get("items"), dict):
                    subs.append(s["items"])
            out.append(_order_any(root, subs, v, depth + 1))
        return out
    return value


def _order_any(root: Any, subs: list[Any], value: Any, depth: int) -> Any:
    if not subs or depth > _MAX_DEPTH:
        return value
    return _order(root, {"allOf": subs}, value, depth)
