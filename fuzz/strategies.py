"""Hypothesis strategies that draw Draft 2020-12 JSON schemas, and seeded drawing outside tests.

The schemas mix every keyword family engines struggle with: typed leaves with numeric and string
bounds, ``pattern`` and ``format``; nested objects and arrays with ``required``,
``additionalProperties``, ``prefixItems``, ``uniqueItems``, ``dependentRequired``; ``enum`` and
``const``; ``anyOf``/``oneOf``/``allOf``/``not``; and ``$defs``/``$ref``, recursive ones included.
Some drawn schemas are unsatisfiable on purpose: an engine should then allow nothing, not garbage.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

NAMES = st.sampled_from(["a", "b", "c", "id", "name", "value", "tags", "x_1", "é"])
PATTERNS = (
    "^[a-z]+$",
    "^[0-9]{3}-[0-9]{4}$",
    "^(foo|bar)[0-9]*$",
    "^[A-Z][a-z]{1,5}$",
    "a+b",
    "^\\d+(\\.\\d+)?$",
    "^[^\\s]*$",
    "^\\w{2,4}$",
)
FORMATS = (
    "date",
    "time",
    "date-time",
    "email",
    "uuid",
    "ipv4",
    "ipv6",
    "uri",
    "hostname",
    "duration",
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-100, 100),
    st.sampled_from([1.5, -0.25, 1e3]),
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6),
)
_DRAW_SETTINGS = dict(
    database=None,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
    deadline=None,
)


def _maybe(draw: Any, s: dict, key: str, value: Any, p: int = 2) -> None:
    if draw(st.integers(0, p - 1)) == 0:
        s[key] = value


@st.composite
def numeric_schemas(draw: Any) -> dict:
    integer = draw(st.booleans())
    s: dict[str, Any] = {"type": "integer" if integer else "number"}
    bound = (
        st.integers(-1000, 1000) if integer else st.integers(-10000, 10000).map(lambda x: x / 10)
    )
    lo, hi = sorted((draw(bound), draw(bound)))
    _maybe(draw, s, draw(st.sampled_from(["minimum", "exclusiveMinimum"])), lo)
    _maybe(draw, s, draw(st.sampled_from(["maximum", "exclusiveMaximum"])), hi)
    _maybe(draw, s, "multipleOf", draw(st.sampled_from([2, 3, 5, 10, 0.5])), p=5)
    return s


@st.composite
def string_schemas(draw: Any) -> dict:
    s: dict[str, Any] = {"type": "string"}
    lo, hi = sorted((draw(st.integers(0, 8)), draw(st.integers(0, 24))))
    _maybe(draw, s, "minLength", lo)
    _maybe(draw, s, "maxLength", hi)
    _maybe(draw, s, "pattern", draw(st.sampled_from(PATTERNS)), p=3)
    _maybe(draw, s, "format", draw(st.sampled_from(FORMATS)), p=4)
    return s


def leaf_schemas() -> st.SearchStrategy[Any]:
    return st.one_of(
        numeric_schemas(),
        string_schemas(),
        st.sampled_from([{"type": "boolean"}, {"type": "null"}, {}, True]),
        st.lists(SCALARS, min_size=1, max_size=4, unique_by=repr).map(lambda v: {"enum": v}),
        SCALARS.map(lambda v: {"const": v}),
        st.just({"type": ["string", "null"], "maxLength": 5}),
    )


@st.composite
def object_schemas(draw: Any, children: st.SearchStrategy[Any]) -> dict:
    props = draw(st.dictionaries(NAMES, children, max_size=4))
    s: dict[str, Any] = {"type": "object", "properties": props}
    names = sorted(props)
    _maybe(
        draw, s, "required", draw(st.lists(st.sampled_from(names), unique=True)) if names else []
    )
    _maybe(draw, s, "additionalProperties", draw(st.one_of(st.booleans(), children)))
    if len(names) >= 2:
        _maybe(draw, s, "dependentRequired", {names[0]: [names[1]]}, p=4)
    _maybe(draw, s, "patternProperties", {"^x_": draw(children)}, p=5)
    _maybe(draw, s, "minProperties", draw(st.integers(0, 2)), p=5)
    _maybe(draw, s, "maxProperties", draw(st.integers(1, 5)), p=5)
    return s


@st.composite
def array_schemas(draw: Any, children: st.SearchStrategy[Any]) -> dict:
    s: dict[str, Any] = {"type": "array"}
    if draw(st.integers(0, 3)) == 0:
        s["prefixItems"] = draw(st.lists(children, min_size=1, max_size=3))
        _maybe(draw, s, "items", draw(st.one_of(st.just(False), children)))
    else:
        s["items"] = draw(children)
    lo, hi = sorted((draw(st.integers(0, 3)), draw(st.integers(0, 6))))
    _maybe(draw, s, "minItems", lo)
    _maybe(draw, s, "maxItems", hi)
    _maybe(draw, s, "uniqueItems", True, p=3)
    _maybe(draw, s, "contains", draw(children), p=6)
    return s


def _combinators(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    branches = st.lists(children, min_size=1, max_size=3)
    negated = st.tuples(st.sampled_from([None, "string", "integer", "object"]), children).map(
        lambda tc: {"not": tc[1]} if tc[0] is None else {"type": tc[0], "not": tc[1]}
    )
    # one_of picks a branch uniformly: objects and arrays are listed twice to weigh them up.
    return st.one_of(
        object_schemas(children),
        object_schemas(children),
        array_schemas(children),
        array_schemas(children),
        branches.map(lambda b: {"anyOf": b}),
        branches.map(lambda b: {"oneOf": b}),
        branches.map(lambda b: {"allOf": b}),
        negated,
    )


def _plain() -> st.SearchStrategy[Any]:
    return st.recursive(leaf_schemas(), _combinators, max_leaves=8)


@st.composite
def _with_defs(draw: Any) -> dict:
    """A schema using ``$defs``: a shared definition, or a recursive list or tree."""
    kind = draw(st.sampled_from(["shared", "list", "tree"]))
    if kind == "shared":
        d = draw(_plain())
        return {
            "$defs": {"d": d},
            "type": "object",
            "properties": {
                "first": {"$ref": "#/$defs/d"},
                "rest": {"items": {"$ref": "#/$defs/d"}},
            },
            "required": ["first"],
        }
    node: dict[str, Any] = {"type": "object", "properties": {"value": draw(leaf_schemas())}}
    if kind == "list":
        node["properties"]["next"] = {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}
    else:
        more = {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}
        node["properties"]["children"] = more
    node["required"] = ["value"]
    _maybe(draw, node, "additionalProperties", False)
    return {"$defs": {"node": node}, "$ref": "#/$defs/node"}


def schemas() -> st.SearchStrategy[Any]:
    """Draft 2020-12 schemas (dicts, or occasionally ``true``), all valid against the metaschema."""
    return st.one_of(_plain(), _with_defs())


def draw_examples(strategy: st.SearchStrategy[Any], n: int, rng_seed: int) -> list[Any]:
    """Up to ``n`` examples of ``strategy``, the same ones for the same seed, outside any test.

    Runs Hypothesis's generate phase through ``@given`` (its public API) and collects what it
    draws; small examples come first, as Hypothesis grows them.
    """
    out: list[Any] = []

    @settings(max_examples=max(1, n), **_DRAW_SETTINGS)
    @seed(rng_seed)
    @given(strategy)
    def collect(x: Any) -> None:
        if len(out) < n:
            out.append(x)

    collect()
    return out
