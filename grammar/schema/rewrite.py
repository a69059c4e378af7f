"""Rewrites of keywords llguidance does not implement (``backends.quirks.REFUSED_KEYWORDS``)
into equivalent ones it does.

Each rewrite is exact (same accepted instances as `jsonschema` judges them) or refuses:
* `not S`                 -> the exact negation of S (see `schema_negate`);
* `oneOf [A, B, ...]`     -> `anyOf` when the branches are provably disjoint, else
                             `anyOf [A and not B..., B and not A..., ...]` (negating only
                             the pairs not proven disjoint);
* `if I then T else E`    -> `anyOf [I and T, not I and E]` (`I or E` without `then`);
* `dependentRequired` / `dependencies` / `dependentSchemas`
                          -> `anyOf [{properties: {k: false}}, {required: [k, ...], ...}]`;
* `propertyNames`         -> closing the key set (`enum`/`const` names), a key
                             `patternProperties` (`pattern` names), where that is exact, or
                             `properties: {name: false}` per name of a negated list;
* `uniqueItems`           -> dropped when at most one item is allowed, else an `enum` of the
                             distinct arrangements of a small finite item domain;
* `unevaluatedProperties` / `unevaluatedItems` without applicators -> their `additional*` form.
Anything else (`contains`, `$dynamicRef`, ...) is refused; unknown keywords are annotations.

Copies: rewrites read the input node `s` and write only into the analysis's output node `out` and
its list of extra conjuncts; the input is never changed.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

from jsonschema import Draft202012Validator

from corral.grammar.checks.open_items import open_kinds
from corral.grammar.checks.value_modes import UNIQUE, Modes
from corral.grammar.core.errors import ConstraintError
from corral.grammar.schema import rewrite_log as log
from corral.grammar.schema.facts import (
    ALL_TYPES,
    ANNOTATIONS,
    TYPE_NAMES,
    escape_pointer,
    finite_values,
    intersect_types,
    json_equal,
    types_of,
)
from corral.grammar.schema.fold import finite_domain

_APPLICATORS = frozenset(
    "allOf anyOf oneOf not if $ref dependentSchemas dependencies $dynamicRef".split()
)
_MAX_ARRANGEMENTS = 256
_MAX_DOMAIN = 16  # more distinct items always exceed _MAX_ARRANGEMENTS unless maxItems is tiny
_REFUSED = {
    "contains": "'contains' is not supported by the backend",
    "minContains": "'minContains' is not supported by the backend",
    "maxContains": "'maxContains' is not supported by the backend",
    "$dynamicRef": "'$dynamicRef' is not supported",
    "$recursiveRef": "'$recursiveRef' is not supported",
}
_HANDLED_LATER = frozenset(
    "then else propertyNames uniqueItems unevaluatedProperties unevaluatedItems additionalItems".split()
)


class KeywordRewrites:
    """Keyword handlers for `_Analyzer`; `a` supplies node(), negate(), refuse() and the prover."""

    def __init__(self, analyzer: Any) -> None:
        self.a = analyzer

    def apply(
        self, key: str, value: Any, s: dict, where: str, scope: Any, out: dict, extra: list
    ) -> None:
        """Rewrite keyword `key` of node `s`; results go to `out` or, as conjuncts, to `extra`."""
        if key == "not" and isinstance(value, dict) and _only_key(value, "not"):
            extra.append(self.a.node(value["not"], f"{where}/not", scope))  # not not X == X
            self.a.record(where, key, log.NOT_NOT)
        elif key == "not":
            sub = self.a.node(value, where, scope)
            neg = self.a.negate(sub, where, "not", _within(s), _closed_context(s), hold=True)
            if isinstance(neg, dict) and self.a.deferred.reason(neg) is not None:
                extra.append(neg)  # a fold may still settle it (`schema_deferred`)
            elif neg is not None:
                self.a.record(where, key, log.NOT_FOLDED)
                if neg is not True:
                    extra.append(neg)
        elif key == "oneOf":
            self._one_of(value, s, where, scope, extra)
        elif key == "if":
            self._conditional(s, where, scope, extra)
        elif key in ("dependentRequired", "dependentSchemas", "dependencies"):
            self._dependencies(value, s, where, scope, extra)
        elif key in _REFUSED:
            self.a.refuse(where, key, _REFUSED[key])
        # everything else: handled in finish(), or an unknown keyword (an annotation)

    def finish(self, s: dict, pointer: str, out: dict, extra: list) -> None:
        """Rewrites that need the node's other keywords analysed first."""
        if "propertyNames" in s:
            self._property_names(s, f"{pointer}/propertyNames", out, extra)
        if s.get("uniqueItems") is True:
            self._unique_items(f"{pointer}/uniqueItems", out, extra)
        for key, partner in (
            ("unevaluatedProperties", "additionalProperties"),
            ("unevaluatedItems", "items"),
        ):
            if key in s and s[key] is not True and s[key] != {}:
                self._unevaluated(key, partner, s, f"{pointer}/{key}", out)

    # -- oneOf -----------------------------------------------------------------------------------
    def _one_of(self, value: Any, s: dict, where: str, scope: Any, extra: list) -> None:
        if not isinstance(value, list) or not value:
            raise ConstraintError("oneOf must be a non-empty array", where, "oneOf")
        branches = [self.a.node(sub, f"{where}/{i}", scope) for i, sub in enumerate(value)]
        live = [b for b in branches if b is not False]
        if len(live) <= 1:
            extra.append(live[0] if live else False)
            self.a.record(where, "oneOf", log.ONE_OF_SINGLE if live else log.ONE_OF_FALSE)
            return
        prover, within = self.a.prover, _within(s)
        # a type that two branches accept wholesale never satisfies exactly one branch
        vacuous = [prover.vacuous_types(b) for b in live]
        shared = frozenset(t for t in within if sum(t in v for v in vacuous) >= 2)
        types = frozenset(t for t in within - shared if not (t == "integer" and "number" in shared))
        if not types:
            extra.append(False)
            self.a.record(where, "oneOf", log.ONE_OF_FALSE)
            return
        overlaps = {
            (i, j)
            for i, j in itertools.combinations(range(len(live)), 2)
            if not prover.disjoint(live[i], live[j], within=types)
        }
        restrict = {"type": sorted(types)} if types != within else {}
        if not overlaps:
            extra.append({**restrict, "anyOf": live})
            self.a.record(where, "oneOf", log.ONE_OF_DISJOINT)
            return
        within = types
        options: list = []
        for i, branch in enumerate(live):
            conj = [branch]
            # a branch of listed values is settled value by value: a negation that cannot be
            # written is held for the fold below (`schema_deferred`)
            finite = isinstance(branch, dict) and finite_domain(branch, self.a.lookup) is not None
            for j, other in enumerate(live):
                if (min(i, j), max(i, j)) in overlaps and i != j:
                    scope_types = intersect_types(within, types_of(branch)) or within
                    neg = self.a.negate(other, where, "oneOf", scope_types, branch, hold=finite)
                    if neg is None:  # lenient: treated as anyOf, reported
                        extra.append({"anyOf": live})
                        return
                    conj.append(neg)
            option = {"allOf": conj}
            folded = self.a.fold(option) if finite else None
            if folded is not None:
                self.a.record(f"{where}/{i}", "oneOf", log.FOLDED_ENUM)
            options.append(option if folded is None else {"enum": folded} if folded else False)
        item = {**restrict, "anyOf": options}
        overlapping = len({k for pair in overlaps for k in pair})
        self.a.describe[id(item)] = f"oneOf with {overlapping} overlapping branches"
        extra.append(item)
        self.a.record(where, "oneOf", log.ONE_OF_NEGATED)

    # -- if / then / else ------------------------------------------------------------------------
    def _conditional(self, s: dict, where: str, scope: Any, extra: list) -> None:
        base = where[: -len("/if")]
        cond = self.a.node(s["if"], where, scope)
        then = self.a.node(s["then"], f"{base}/then", scope) if "then" in s else True
        other = self.a.node(s["else"], f"{base}/else", scope) if "else" in s else True
        if then is True and other is True:
            return
        if then is True:  # (I and True) or (not I and E)  ==  I or E
            extra.append({"anyOf": [cond, other]})
        elif (neg := self.a.negate(cond, where, "if")) is None:
            return
        elif other is True:
            extra.append({"anyOf": [neg, then]})
        else:
            extra.append({"anyOf": [{"allOf": [cond, then]}, {"allOf": [neg, other]}]})
        self.a.record(where, "if", log.IF_ANY_OF)

    # -- dependencies ----------------------------------------------------------------------------
    def _dependencies(self, value: Any, s: dict, where: str, scope: Any, extra: list) -> None:
        if not isinstance(value, dict):
            raise ConstraintError("must be an object", where, where.rsplit("/", 1)[-1])
        required = set(s.get("required", ())) if isinstance(s.get("required"), list) else set()
        before = len(extra)
        for name, dep in value.items():
            if isinstance(dep, list):
                if not all(isinstance(d, str) for d in dep):
                    raise ConstraintError(
                        "dependency lists must hold strings", where, "dependencies"
                    )
                then: Any = {"required": [d for d in dep if d != name]} if dep else True
            else:
                then = self.a.node(dep, f"{where}/{escape_pointer(name)}", scope)
            if then is True:
                continue
            if name in required:
                extra.append(then)
            else:
                present = {"required": [name], "allOf": [then]}
                extra.append({"anyOf": [{"properties": {name: False}}, present]})
        if len(extra) > before:
            self.a.record(where, where.rsplit("/", 1)[-1], log.DEPENDENCIES_ANY_OF)

    # -- propertyNames ---------------------------------------------------------------------------
    def _property_names(self, s: dict, where: str, out: dict, extra: list) -> None:
        names = s["propertyNames"]
        if names is True or names == {}:
            return
        simple = {"type", "enum", "const", "pattern", "minLength", "maxLength"}
        banned = _listed_names(names.get("not")) if isinstance(names, dict) else None
        if banned is not None and set(names) == {"not"}:
            # names outside a list: each listed name is a property that must be absent
            props = out.setdefault("properties", {})
            for name in banned:
                props[name] = False
            self.a.record(where, "propertyNames", log.PROPERTY_NAMES_KEYS)
            return
        if isinstance(names, dict) and not set(names) <= simple:
            self.a.refuse(
                where,
                "propertyNames",
                "only type/enum/const/pattern/length 'propertyNames' are supported",
            )
            return
        judge = Draft202012Validator(names) if not isinstance(names, bool) else None
        props = out.setdefault("properties", {})
        for key in list(props):
            if judge is None or not judge.is_valid(key):
                props[key] = False
        analysed = self.a.node(names, where, None)
        values = finite_values(analysed) if isinstance(analysed, dict) else None
        if names is False or "string" not in types_of(analysed):
            self._close_keys(out, [])
        elif values is not None:
            self._close_keys(out, [v for v in values if isinstance(v, str) and judge.is_valid(v)])
        elif set(analysed) <= {"type", "pattern"} and "pattern" in analysed and _open_map(out):
            out["patternProperties"] = {analysed["pattern"]: out.get("additionalProperties", True)}
            out["additionalProperties"] = False
        elif not (out.get("additionalProperties") is False and not out.get("patternProperties")):
            self.a.refuse(where, "propertyNames", "this 'propertyNames' cannot be enforced exactly")
            return
        self.a.record(where, "propertyNames", log.PROPERTY_NAMES_KEYS)

    def _close_keys(self, out: dict, allowed: list[str]) -> None:
        """Allow exactly the keys `allowed` (plus none other), keeping each key's value schema."""
        props = out.setdefault("properties", {})
        patterns = out.pop("patternProperties", {})
        additional = out.get("additionalProperties", True)
        for key in allowed:
            if key in props:
                continue
            source = self.a.patterns.key_source
            matching = [sub for pat, sub in patterns.items() if re.search(source[pat], key)]
            props[key] = {"allOf": matching} if matching else additional
        out["additionalProperties"] = False

    # -- uniqueItems -----------------------------------------------------------------------------
    def _unique_items(self, where: str, out: dict, extra: list) -> None:
        if out.get("maxItems", 2) <= 1:
            self.a.record(where, "uniqueItems", log.UNIQUE_ITEMS_DROPPED)
            return
        items = out.get("items", True)
        arrangements = None
        if (
            isinstance(items, dict)
            and set(items) <= {"enum", "const", "type"}
            and "prefixItems" not in out
        ):
            domain = finite_values(items)
            if domain is None and items.get("type") in ("boolean", "null"):
                domain = [False, True] if items["type"] == "boolean" else [None]
            if domain is not None and len(domain) <= _MAX_DOMAIN:
                judge = Draft202012Validator(items)
                domain = [v for v in domain if judge.is_valid(v)]
                distinct = [
                    v for i, v in enumerate(domain) if not any(json_equal(v, w) for w in domain[:i])
                ]
                arrangements = _arrangements(distinct, out.get("minItems", 0), out.get("maxItems"))
        target = lambda ref: self.a.lookup(ref) or False  # noqa: E731 - unknown: not open
        checkable = arrangements is None and "prefixItems" not in out and self.a.check_keys
        if checkable and Modes(target, self.a.algebra).open_string(items):
            # open string items: the matcher refuses a repeated one (``value_sites``)
            out[UNIQUE] = where
            self.a.record(where, "uniqueItems", log.UNIQUE_CHECK)
            return
        listed = Modes(target, self.a.algebra).listed_strings(items) if checkable else None
        if listed and out.get("minItems", 0) <= len(listed):
            # listed strings: the matcher steers clear of those the array holds, and ends the
            # array when none is left (``value_sites``)
            out[UNIQUE] = where
            self.a.record(where, "uniqueItems", log.UNIQUE_CHECK_LISTED)
            return
        if checkable and open_kinds(items, target, algebra=self.a.algebra) is not None:
            # open values: each can still be finished as one not held (``open_items``)
            out[UNIQUE] = where
            self.a.record(where, "uniqueItems", log.UNIQUE_CHECK_OPEN)
            return
        if arrangements is None:
            self.a.refuse(
                where,
                "uniqueItems",
                "'uniqueItems' can only be enforced over a small finite item domain, listed "
                "strings, or open items (checked by the matcher): strings with no bound but a "
                "'minLength' and a 'pattern' that never runs out of new strings, objects that "
                "take further keys, arrays with no 'maxItems', numbers with no upper bound, "
                "literals",
            )
            return
        others = sorted(ALL_TYPES - {"array"})
        extra.append({"anyOf": [{"type": others}, {"enum": arrangements}]})
        self.a.record(where, "uniqueItems", log.UNIQUE_ITEMS_ENUM)

    # -- unevaluated* ------------------------------------------------------------------------------
    def _unevaluated(self, key: str, partner: str, s: dict, where: str, out: dict) -> None:
        if _APPLICATORS.isdisjoint(s) and partner not in s:
            out[partner] = self.a.node(s[key], where, None)
            self.a.record(where, key, log.UNEVALUATED[key])
            return
        self.a.refuse(where, key, f"'{key}' next to applicators is not supported")


def _listed_names(node: Any) -> list[str] | None:
    """The strings an ``enum``/``const`` (beside at most ``type: string``) lists; None when the
    node lists anything else or is not such a list. Other values never name a key."""
    if not isinstance(node, dict) or not set(node) <= {"enum", "const", "type"}:
        return None
    if node.get("type", "string") != "string" or not {"enum", "const"} & set(node):
        return None
    values = finite_values(node)
    return None if values is None else [v for v in values if isinstance(v, str)]


def _within(s: dict) -> frozenset[str]:
    """The types a node's own `type` keyword allows (all types when absent or malformed)."""
    t = s.get("type")
    names = [t] if isinstance(t, str) else t
    if not isinstance(names, list) or not names or any(n not in TYPE_NAMES for n in names):
        return ALL_TYPES
    return types_of({"type": names})


def _closed_context(s: dict) -> dict | bool:
    """`s` as a key context when its own keywords close it (raw values, no rewrites needed)."""
    props = s.get("properties")
    if (
        s.get("additionalProperties") is False
        and isinstance(props, dict)
        and "patternProperties" not in s
    ):
        return {"additionalProperties": False, "properties": props}
    return True


def _only_key(s: dict, key: str) -> bool:
    """`s` has `key` and otherwise only annotations."""
    return key in s and all(k == key or k in ANNOTATIONS for k in s)


def _open_map(out: dict) -> bool:
    add = out.get("additionalProperties", True)
    return not out.get("patternProperties") and (add is True or add == {})


def _arrangements(values: list, lo: int, hi: int | None) -> list | None:
    hi = len(values) if hi is None else min(hi, len(values))
    total, out = 0, []
    for k in range(lo, hi + 1):
        for perm in itertools.permutations(values, k):
            total += 1
            if total > _MAX_ARRANGEMENTS:
                return None
            out.append(list(perm))
    return out
