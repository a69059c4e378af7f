"""Small facts about analysed schemas: which JSON types a schema admits, value equality.

"Analysed" schemas are the output of `schema_analysis`: no annotations, no `oneOf`, `not`,
`if`, `format`; every `$ref` points at a hoisted definition. These helpers never guess: when
in doubt they answer with the larger set of types.

Copies: none; these helpers only read the schemas they are given.
"""

from __future__ import annotations

from collections.abc import Iterable

#: Keywords without effect on validation (annotations, identifiers, containers of definitions).
ANNOTATIONS = frozenset(
    "title description default examples $comment deprecated readOnly writeOnly contentEncoding "
    "contentMediaType contentSchema $schema $id id $anchor $dynamicAnchor $vocabulary $defs "
    "definitions $recursiveAnchor".split()
)
#: The JSON types; "integer" is the subset of "number" with a zero fractional part.
ALL_TYPES: frozenset[str] = frozenset(("null", "boolean", "number", "string", "array", "object"))
TYPE_NAMES: frozenset[str] = ALL_TYPES | {"integer"}


def type_of_value(v: object) -> str:
    """The JSON type of a decoded JSON value ("integer" for integral numbers)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "integer" if v.is_integer() else "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def normalize_types(types: Iterable[str]) -> frozenset[str]:
    """Drop "integer" where "number" already covers it."""
    ts = frozenset(types)
    return ts - {"integer"} if "number" in ts else ts


def types_of(s: dict | bool) -> frozenset[str]:
    """Types a schema can admit, judged from `type`, `const` and `enum` only (a superset)."""
    if s is False:
        return frozenset()
    if s is True:
        return ALL_TYPES
    t = s.get("type")
    ts = ALL_TYPES if t is None else normalize_types([t] if isinstance(t, str) else t)
    for key in ("const", "enum"):
        if key in s:
            values = [s[key]] if key == "const" else s[key]
            ts = intersect_types(ts, normalize_types(type_of_value(v) for v in values))
    return ts


def intersect_types(a: frozenset[str], b: frozenset[str]) -> frozenset[str]:
    """Type-set intersection that knows integer is a subset of number."""
    out = set(a & b)
    if ("integer" in a and "number" in b) or ("number" in a and "integer" in b):
        out.add("integer")
    return normalize_types(out)


def json_equal(a: object, b: object) -> bool:
    """JSON equality as `jsonschema` judges it (1 == 1.0, but True != 1)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def finite_values(s: dict) -> list | None:
    """The values a schema's `const`/`enum` allow (None when neither is present)."""
    if "const" in s:
        vals = [s["const"]]
        if "enum" in s:
            vals = [v for v in vals if any(json_equal(v, e) for e in s["enum"])]
        return vals
    if "enum" in s:
        return list(s["enum"])
    return None


def escape_pointer(token: str) -> str:
    """One JSON-pointer reference token (RFC 6901)."""
    return token.replace("~", "~0").replace("/", "~1")


def closed_keys(s: dict | bool) -> frozenset[str] | None:
    """The only property names objects satisfying `s` can have (None when not closed)."""
    if not isinstance(s, dict) or s.get("additionalProperties") is not False:
        return None
    if s.get("patternProperties"):
        return None
    return frozenset(s.get("properties", ()))
