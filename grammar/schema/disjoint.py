"""Proofs that two analysed schemas share no instance (so `oneOf` may become `anyOf`).

`disjoint(a, b)` is sound but incomplete: True means no JSON value satisfies both; False means
"not proven". The proofs used: disjoint type sets, disjoint `const`/`enum` values, a property one
side requires that the other forbids, a property both require with disjoint value schemas (the
usual discriminator), disjoint numeric ranges and item-count ranges, string values a pattern or
length rules out, patterns no string matches together (the exact regex algebra on the patterns'
Python sources, `regex_algebra`), and recursion through
`allOf` (a conjunct disjoint from the other side), `anyOf` (every branch disjoint) and `$ref`.

Copies: none; these helpers only read the schemas they are given.
"""

from __future__ import annotations

from collections.abc import Callable

from corral.grammar.regex.algebra import RegexAlgebra
from corral.grammar.schema.facts import (
    ALL_TYPES,
    finite_values,
    intersect_types,
    json_equal,
    types_of,
)

_MAX_DEPTH = 5
_NUMBER = frozenset(("number", "integer"))
#: keyword -> the instance types it constrains (it accepts every instance of other types)
_KEYWORD_TYPES: dict[str, frozenset[str]] = {
    **dict.fromkeys(
        "properties required additionalProperties patternProperties minProperties "
        "maxProperties".split(),
        frozenset(("object",)),
    ),
    **dict.fromkeys("items prefixItems minItems maxItems".split(), frozenset(("array",))),
    **dict.fromkeys("minLength maxLength pattern".split(), frozenset(("string",))),
    **dict.fromkeys(
        "minimum maximum exclusiveMinimum exclusiveMaximum multipleOf".split(), _NUMBER
    ),
}


class DisjointProver:
    """Decides provable disjointness; `lookup` maps a `$ref` to its analysed target; `algebra`:
    the regex memos of the analysis (a fresh one, the prover's own, when None)."""

    def __init__(
        self,
        lookup: Callable[[str], dict | bool | None],
        tick: Callable[[], None],
        pattern_source: Callable[[str], str | None],
        algebra: RegexAlgebra | None = None,
    ):
        self._lookup = lookup
        self._algebra = algebra or RegexAlgebra()
        self._tick = tick
        #: backend regex -> the Python pattern whose language the judge tests (None: unknown)
        self._source = pattern_source
        # (id(a), id(b)) -> verdict; analysed schemas live as long as the prover. A verdict
        # cached at a deeper level may miss a proof at a shallower one: incomplete, never unsound.
        # The pair is kept in the value so neither id can be reused while cached.
        self._memo: dict[tuple[int, int, frozenset[str]], tuple[bool, dict, dict]] = {}

    def disjoint(
        self, a: dict | bool, b: dict | bool, depth: int = 0, within: frozenset[str] = ALL_TYPES
    ) -> bool:
        """True only if no instance whose type is in `within` satisfies both `a` and `b`."""
        self._tick()
        if a is False or b is False or not within:
            return True
        if a is True or b is True or depth > _MAX_DEPTH:
            return False
        key = (id(a), id(b), within)
        if key not in self._memo:
            self._memo[key] = (self._disjoint(a, b, depth, within), a, b)
        return self._memo[key][0]

    def _disjoint(self, a: dict, b: dict, depth: int, within: frozenset[str]) -> bool:
        common = intersect_types(intersect_types(types_of(a), types_of(b)), within)
        if not common:
            return True
        if self._values_disjoint(a, b) or self._values_disjoint(b, a):
            return True
        # every type left in common needs its own proof
        if common & {"number", "integer"} and _ranges_disjoint(a, b):
            common -= {"number", "integer"}
        if "string" in common and self._patterns_disjoint(a, b):
            common -= {"string"}
        if "object" in common and self._objects_disjoint(a, b, depth):
            common -= {"object"}
        if "array" in common and self._arrays_disjoint(a, b, depth):
            common -= {"array"}
        if not common:
            return True
        return self._through_applicators(a, b, depth, common) or self._through_applicators(
            b, a, depth, common
        )

    def vacuous_types(self, s: dict | bool, depth: int = 0) -> frozenset[str]:
        """Types all of whose instances satisfy `s` (a subset: empty when unsure). A branch
        of only object keywords, say, accepts every string, number, array, boolean and null."""
        if s is True:
            return ALL_TYPES | {"integer"}
        if not isinstance(s, dict) or depth > _MAX_DEPTH:
            return frozenset()
        if set(s) == {"$ref"}:
            target = self._lookup(s["$ref"])
            return frozenset() if target is None else self.vacuous_types(target, depth + 1)
        constrained: set[str] = set()
        for key in s:
            types = _KEYWORD_TYPES.get(key)
            if types is None:
                return frozenset()
            constrained |= types
        return (ALL_TYPES | {"integer"}) - constrained

    def _through_applicators(self, a: dict, b: dict, depth: int, within: frozenset[str]) -> bool:
        for sub in a.get("allOf", ()):
            if self.disjoint(sub, b, depth + 1, within):
                return True
        if "anyOf" in a and all(self.disjoint(sub, b, depth + 1, within) for sub in a["anyOf"]):
            return True
        if "$ref" in a:
            target = self._lookup(a["$ref"])
            if target is not None and self.disjoint(target, b, depth + 1, within):
                return True
        return False

    def _values_disjoint(self, a: dict, b: dict) -> bool:
        values = finite_values(a)
        if values is None:
            return False
        return all(not self._value_may_match(v, b) for v in values)

    def _value_may_match(self, v: object, b: dict) -> bool:
        other = finite_values(b)
        if other is not None and not any(json_equal(v, w) for w in other):
            return False
        if isinstance(v, str) and not self._string_may_match(v, b):
            return False
        return bool(intersect_types(types_of({"const": v}), types_of(b)))

    def _string_may_match(self, v: str, b: dict) -> bool:
        if not b.get("minLength", 0) <= len(v) <= b.get("maxLength", len(v)):
            return False
        source = self._source(b["pattern"]) if "pattern" in b else None
        if source is None:
            return True
        return self._algebra.matches(source, v) is not False

    def _patterns_disjoint(self, a: dict, b: dict) -> bool:
        if "pattern" not in a or "pattern" not in b:
            return False
        first, second = self._source(a["pattern"]), self._source(b["pattern"])
        return (
            first is not None
            and second is not None
            and self._algebra.disjoint((first,), (second,)) is True
        )

    def _objects_disjoint(self, a: dict, b: dict, depth: int) -> bool:
        req_a, req_b = set(a.get("required", ())), set(b.get("required", ()))
        if _counts_apart(a, req_a, b) or _counts_apart(b, req_b, a):
            return True
        for key in req_a | req_b:
            pa, pb = _property_schema(a, key), _property_schema(b, key)
            if key in req_a and pb is False or key in req_b and pa is False:
                return True
            if key in req_a and key in req_b and self.disjoint(pa, pb, depth + 1):
                return True
        return False

    def _arrays_disjoint(self, a: dict, b: dict, depth: int) -> bool:
        lo_a, hi_a = a.get("minItems", 0), a.get("maxItems")
        lo_b, hi_b = b.get("minItems", 0), b.get("maxItems")
        if (hi_a is not None and hi_a < lo_b) or (hi_b is not None and hi_b < lo_a):
            return True
        pre_a, pre_b = a.get("prefixItems", ()), b.get("prefixItems", ())
        for i in range(min(len(pre_a), len(pre_b), lo_a, lo_b)):
            if self.disjoint(pre_a[i], pre_b[i], depth + 1):
                return True
        return False


def _counts_apart(a: dict, required: set, b: dict) -> bool:
    """Every object of `a` has more properties than any of `b` may: `a` requires distinct
    names, or a `minProperties`, past `b`'s `maxProperties` or the names a closed `b` lists."""
    fewest = max(len(required), _count(a.get("minProperties")) or 0)
    most = [_count(b.get("maxProperties"))]
    if b.get("additionalProperties") is False and not b.get("patternProperties"):
        most.append(sum(sub is not False for sub in b.get("properties", {}).values()))
    return any(m is not None and fewest > m for m in most)


def _count(bound: object) -> int | None:
    """A property-count bound as an int (JSON Schema allows 2.0), else None."""
    if isinstance(bound, bool) or not isinstance(bound, (int, float)) or bound != int(bound):
        return None
    return int(bound)


def _property_schema(s: dict, key: str) -> dict | bool:
    """A superset of what `s` allows as the value of property `key` (when present)."""
    props = s.get("properties", {})
    if key in props:
        return props[key]
    if s.get("patternProperties"):
        return True  # which patterns match is not decided here
    return s.get("additionalProperties", True)


def _ranges_disjoint(a: dict, b: dict) -> bool:
    """Disjoint numeric ranges (the caller checks that only numbers are in common)."""
    lo_a, lo_b, hi_a, hi_b = _lower(a), _lower(b), _upper(a), _upper(b)
    return _below(hi_a, lo_b) or _below(hi_b, lo_a)


def _lower(s: dict) -> tuple[float, bool] | None:
    cands = [(s["minimum"], False)] if "minimum" in s else []
    cands += [(s["exclusiveMinimum"], True)] if "exclusiveMinimum" in s else []
    return max(cands, key=lambda c: (c[0], c[1])) if cands else None


def _upper(s: dict) -> tuple[float, bool] | None:
    cands = [(s["maximum"], False)] if "maximum" in s else []
    cands += [(s["exclusiveMaximum"], True)] if "exclusiveMaximum" in s else []
    return min(cands, key=lambda c: (c[0], not c[1])) if cands else None


def _below(hi: tuple[float, bool] | None, lo: tuple[float, bool] | None) -> bool:
    """True when every number <= hi is below every number >= lo."""
    if hi is None or lo is None:
        return False
    (h, h_excl), (lo_v, lo_excl) = hi, lo
    return h < lo_v or (h == lo_v and (h_excl or lo_excl))
