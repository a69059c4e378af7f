"""The conjunction of two JSON schemas, as far as budget closing needs it (`grammar.shortest`).

`JsonCloser.branches` expands `allOf` / `anyOf` / `oneOf` into plain alternatives; each is the
merge of the parts it takes. A merge that is looser than the true conjunction is safe here: a
closing built from it is run through the sequence's matcher before it is relied on.
"""

from __future__ import annotations

from typing import Any

Schema = dict | bool
_LOWER = ("minimum", "minLength", "minItems", "minProperties")
_UPPER = ("maximum", "maxLength", "maxItems", "maxProperties")


def merge(a: Schema, b: Schema) -> Schema:
    """The conjunction of two plain schemas, as far as closings need it: properties merged
    (a name in both gets both), `required` joined, `type` intersected, bounds tightened, other
    schema-valued keywords conjoined; another keyword in both keeps `a`'s (the closing is
    verified by the matcher, so a looser merge costs a fallback, never a wrong answer)."""
    if a is False or b is False:
        return False
    if b is True or b == {}:
        return a
    if a is True or a == {}:
        return b
    out = dict(a)
    for key, value in b.items():
        if key not in out or out[key] == value:
            out[key] = value
        elif key == "properties":
            mine = out[key]
            out[key] = {
                **mine,
                **{n: both(mine[n], s) if n in mine else s for n, s in value.items()},
            }
        elif key == "required":
            out[key] = [*out[key], *(r for r in value if r not in out[key])]
        elif key == "type":
            theirs = {value} if isinstance(value, str) else set(value)
            kept = [
                t for t in ([out[key]] if isinstance(out[key], str) else out[key]) if t in theirs
            ]
            if not kept:
                return False
            out[key] = kept
        elif key in _LOWER + _UPPER and _numbers(out[key], value):
            out[key] = max(out[key], value) if key in _LOWER else min(out[key], value)
        elif key in ("items", "additionalProperties", "contains", "propertyNames"):
            out[key] = both(out[key], value)
    return out


def both(a: Schema, b: Schema) -> Schema:
    """A schema for values valid under `a` and `b`."""
    if a is True or a == {} or a is b:
        return b
    if b is True or b == {}:
        return a
    return False if a is False or b is False else {"allOf": [a, b]}


def _numbers(*values: Any) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
