"""The shortest-spelt numbers within a schema's bounds, for the closer (``shortest``).

``smallest_number`` picks, among the candidates a node's bounds and ``multipleOf`` allow, the
number with the shortest text (an integer where one fits, else a short decimal inside an open
range); ``number_ok`` says whether a value keeps every numeric keyword of a node;
``implied_types`` and ``json_kind`` name the JSON types a node implies and a value has.
"""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Any

from corral.grammar.checks.value_sites import FRACTION

Schema = dict | bool


def smallest_number(node: dict, integer: bool) -> int | float | None:
    """The number with the shortest text within `node`'s bounds (and multipleOf), or None."""
    lo, hi = node.get("minimum", -math.inf), node.get("maximum", math.inf)
    xlo, xhi = node.get("exclusiveMinimum"), node.get("exclusiveMaximum")
    step = node.get("multipleOf", 1 if integer else None)
    candidates: list[int | float] = [0, 0.5] if FRACTION in node else [0]
    for bound, strict, up in ((lo, xlo, True), (hi, xhi, False)):
        if strict is not None and not isinstance(strict, bool):
            bound = strict
        if math.isfinite(bound):
            if step:
                k = math.ceil(bound / step) if up else math.floor(bound / step)
                candidates += [k * step, (k + (1 if up else -1)) * step]
            else:
                candidates += [bound, *_decimals_inside(bound, up)]
    # the shortest text first (plain decimals before exponents), then the smallest magnitude
    for value in sorted(candidates, key=lambda v: (_spelling_cost(v), abs(v))):
        if integer and value != int(value):
            continue
        value = int(value) if integer or value == int(value) else value
        if number_ok(node, value):
            return value
    return None


def _spelling_cost(value: float) -> tuple[bool, int]:
    """How long a number's text is (an exponent last): integral values are written as ints."""
    text = repr(int(value)) if math.isfinite(value) and value == int(value) else repr(value)
    return "e" in text, len(text)


def _decimals_inside(bound: float, up: bool) -> list[float]:
    """The decimals of 0 to 15 places nearest to `bound` on its inner side (above a lower bound,
    below an upper one): an exclusive bound, or a range with no integer in it, still has a
    short number (`exclusiveMinimum: 0, exclusiveMaximum: 1` -> 0.1)."""
    exact = Decimal(repr(float(bound)))
    out = []
    for places in range(16):
        unit = Decimal(1).scaleb(-places)
        near = (exact / unit).to_integral_value(ROUND_FLOOR if up else ROUND_CEILING) * unit
        out.append(float(near + unit if up else near - unit))
    return out


def number_ok(node: Schema, value: Any) -> bool:
    """Whether the scalar `value` (a number, true, false or null) is valid under `node`."""
    if not isinstance(node, dict):
        return node is not False
    if "const" in node or "enum" in node:
        allowed = [node["const"]] if "const" in node else node["enum"]
        return any(json_kind(a) == json_kind(value) and a == value for a in allowed)
    types = node.get("type") or implied_types(node)
    types = {types} if isinstance(types, str) else set(types)
    if isinstance(value, bool) or value is None:
        return ("boolean" if isinstance(value, bool) else "null") in types
    if not types & {"number", "integer"}:
        return False
    checks = [
        node.get("minimum", -math.inf) <= value <= node.get("maximum", math.inf),
        not _below(node.get("exclusiveMinimum"), value, lambda b, v: v > b),
        not _below(node.get("exclusiveMaximum"), value, lambda b, v: v < b),
        "multipleOf" not in node or (value / node["multipleOf"]).is_integer(),
        node.get("type") != "integer" or float(value).is_integer(),
        FRACTION not in node or not float(value).is_integer(),
    ]
    return all(checks)


def _below(bound: Any, value: Any, holds: Any) -> bool:
    return (
        isinstance(bound, int | float) and not isinstance(bound, bool) and not holds(bound, value)
    )


def implied_types(node: dict) -> list[str]:
    keys = set(node)
    if keys & {"properties", "required", "additionalProperties", "patternProperties"}:
        return ["object"]
    if keys & {"items", "prefixItems", "minItems", "maxItems"}:
        return ["array"]
    if keys & {"minLength", "maxLength", "pattern", "format"}:
        return ["string"]
    if keys & {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}:
        return ["number"]
    return ["integer", "null", "boolean", "string", "array", "object"]


def json_kind(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "boolean" if value is not None else "null"
    return {dict: "object", list: "array", str: "string"}.get(type(value), "number")
