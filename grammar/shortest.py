"""Shortest valid instances and completions under a JSON schema (budget closing).

`JsonCloser` holds a schema (the one the grammar enforces, after analysis) and answers two
questions: the shortest valid instance (`shortest`), and, through a `partial_json.PartialJson`
fed a prefix of an instance, the shortest text that completes it: open strings, numbers and
literals finished, missing required properties and `minItems` items filled with their own
shortest values, open arrays and objects closed. Text is compact, with the constraint's
separators; properties come in the order the grammar writes them (declared order). The answer is
a proposal the caller verifies against the real matcher (a schema shape this module does not
model yields None or a completion the matcher refuses, never a silent "valid"):
`engine.budget_close` runs it through the matcher before relying on it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import interegular

from corral.grammar.schema_merge import merge
from corral.grammar.value_sites import FRACTION, UNIQUE

if TYPE_CHECKING:
    from corral.grammar.partial_json import PartialJson

Schema = dict | bool
#: The longest run of filler a closing may need (characters a `minLength` asks for, items a
#: `minItems` asks for). A schema that asks for more (`minLength: 10**9` is valid) has no
#: closing here: budget closing stays off for it and says why, rather than build the filler.
MAX_FILL = 4096
_FORMATS = {
    "date": "2000-01-01",
    "time": "00:00:00Z",
    "date-time": "2000-01-01T00:00:00Z",
    "duration": "P0D",
    "email": "a@a.aa",
    "hostname": "a",
    "ipv4": "0.0.0.0",
    "ipv6": "::",
    "uuid": "00000000-0000-0000-0000-000000000000",
    "uri": "a:",
    "uri-reference": "",
}
_ANY: dict = {}  # the schema `true`: shared, never mutated
_APPLICATORS = frozenset(("allOf", "anyOf", "oneOf"))
#: The most alternatives one schema node is expanded into (`allOf` of `anyOf`s multiply).
MAX_BRANCHES = 64


class JsonCloser:
    """Shortest instances and completions for one schema. Immutable once built; share it."""

    def __init__(self, schema: Schema, item_separator: str = ",", key_separator: str = ":"):
        self.root = schema
        self.comma, self.colon = item_separator, key_separator
        self._memo: dict[int, str | None] = {}
        self._busy: set[int] = set()
        # id(node) -> (node, result): the node is kept alive, so its id is never reused and
        # every schema a frame holds stays one object (the closing cache keys on their ids)
        self._resolved: dict[int, tuple[Schema, Schema]] = {}
        self._branches: dict[int, tuple[Schema, list[Schema]]] = {}

    @classmethod
    def for_spec(cls, spec: Any) -> JsonCloser:
        """The closer of a json_schema / json_object `ConstraintSpec`, over the analysed schema
        that its grammar enforces."""
        from corral.grammar.schema_analysis import analyze_schema

        plan = analyze_schema(spec.schema(), lenient=not spec.strict, source=spec.source or None)
        fmt = spec.json_format  # regexes in Python's dialect: interegular reads those
        return cls(plan.judged_schema(), fmt.item_separator, fmt.key_separator)

    def start(self) -> PartialJson:
        """A parser for the instance text, before its first character."""
        from corral.grammar.partial_json import PartialJson

        return PartialJson.empty(self)

    # ---- schema navigation -------------------------------------------------------------------

    def resolve(self, node: Schema) -> Schema:
        """`node` with a local `$ref` followed (its siblings kept as an `allOf` beside it)."""
        if id(node) not in self._resolved:
            self._resolved[id(node)] = (node, self._resolve(node))
        return self._resolved[id(node)][1]

    def _resolve(self, node: Schema) -> Schema:
        for _ in range(64):
            if not isinstance(node, dict) or "$ref" not in node:
                break
            target: Any = self.root
            for part in node["$ref"].lstrip("#").split("/")[1:]:
                part = part.replace("~1", "/").replace("~0", "~")
                target = target[int(part)] if isinstance(target, list) else target.get(part, {})
            rest = {k: v for k, v in node.items() if k != "$ref"}
            node = {"allOf": [target, rest]} if isinstance(target, dict) and rest else target
        return node

    def branches(self, node: Schema) -> list[Schema]:
        """The alternatives `node` stands for, each a plain schema (no `allOf` / `anyOf` /
        `oneOf` at its top; true as {}): the disjunctive normal form, `allOf` parts merged."""
        if id(node) not in self._branches:
            self._branches[id(node)] = (node, self._flatten(node))
        return self._branches[id(node)][1]

    def _flatten(self, node: Schema) -> list[Schema]:
        node = self.resolve(node)
        if node is True:
            return [_ANY]
        values = _listed(node)
        if values is not None and any(isinstance(v, dict | list) for v in values):
            # objects and arrays in `enum`/`const`: one branch per value, spelt out as a schema
            rest = {k: v for k, v in node.items() if k not in ("enum", "const")}
            out = [merge(rest, _spelt(v)) for v in values]
            return [b for b in out if b is not False][:MAX_BRANCHES] or [False]
        if not isinstance(node, dict) or not node.keys() & _APPLICATORS:
            return [node]
        out: list[Schema] = [{k: v for k, v in node.items() if k not in _APPLICATORS}]
        factors = [self.branches(part) for part in node.get("allOf", ())]
        factors += [
            [b for alt in node[key] for b in self.branches(alt)]
            for key in ("anyOf", "oneOf")
            if node.get(key)
        ]
        for alts in factors:
            merged = (merge(a, b) for a in out for b in alts)
            # a bound on the product: a closing is looked for among these branches only
            out = [m for m in merged if m is not False][:MAX_BRANCHES]
        return out or [False]

    def child(self, node: Schema, key: str | int) -> Schema:
        """The schema of property `key` (str) or item `key` (int) of a value under `node`."""
        if not isinstance(node, dict):
            return node
        if isinstance(key, int):
            prefix = node.get("prefixItems", [])
            return prefix[key] if key < len(prefix) else node.get("items", True)
        props = node.get("properties", {})
        if key in props:
            return props[key]
        for pattern, sub in node.get("patternProperties", {}).items():
            if search_pattern(pattern, key):
                return sub
        return node.get("additionalProperties", True)

    # ---- shortest instances ------------------------------------------------------------------

    def shortest(self, node: Schema) -> str | None:
        """The shortest valid instance of `node` as compact text, or None (none found)."""
        key = id(node)
        if key in self._memo:
            return self._memo[key]
        if key in self._busy:
            return None  # a recursive reference: no finite instance along this path
        self._busy.add(key)
        try:
            alts = [self._shortest_one(b) for b in self.branches(node)]
        finally:
            self._busy.discard(key)
        best = min((a for a in alts if a is not None), key=len, default=None)
        self._memo[key] = best
        return best

    def _shortest_one(self, node: Schema) -> str | None:
        if node is True or node == {}:
            return "0"
        if node is False or not isinstance(node, dict):
            return None
        if "const" in node:
            return self.dumps(node["const"])
        if "enum" in node:
            return min((self.dumps(v) for v in node["enum"]), key=len, default=None)
        types = node.get("type") or implied_types(node)
        types = [types] if isinstance(types, str) else types
        made = (self._of_type(node, t) for t in types)
        return min((m for m in made if m is not None), key=len, default=None)

    def _of_type(self, node: dict, kind: str) -> str | None:
        if kind == "null":
            return "null"
        if kind == "boolean":
            return "true"
        if kind in ("integer", "number"):
            value = _smallest_number(node, kind == "integer")
            return None if value is None else json.dumps(value)
        if kind == "string":
            text = shortest_string(node)
            return None if text is None else self.dumps(text)
        if kind == "array":
            if node.get("minItems", 0) > MAX_FILL:
                return None
            items = [self.shortest(self.child(node, i)) for i in range(node.get("minItems", 0))]
            if None in items:
                return None
            if UNIQUE in node:  # open string items (``value_sites``): made distinct
                items = [
                    self.dumps(json.loads(t) + str(i) if i else json.loads(t))
                    for i, t in enumerate(items)
                ]  # type: ignore[arg-type]
            return "[" + self.comma.join(items) + "]"  # type: ignore[arg-type]
        if kind == "object":
            members = self.required_members(node, ())
            if members is None:
                return None
            return "{" + self.comma.join(self.dumps(k) + self.colon + v for k, v in members) + "}"
        return None

    def required_members(
        self, node: Schema, present: Iterable[str]
    ) -> list[tuple[str, str]] | None:
        """(name, shortest value text) of `node`'s required properties missing from `present`,
        in the order the grammar writes them; None when one has no instance."""
        if not isinstance(node, dict):
            return []
        out: list[tuple[str, str]] = []
        seen = set(present)
        # the grammar writes declared properties in their declared order, then the others
        order = {name: i for i, name in enumerate(node.get("properties", {}))}
        required = sorted(node.get("required", []), key=lambda n: order.get(n, len(order)))
        for name in required:
            if name in seen:
                continue
            seen.add(name)
            value = self.shortest(self.child(node, name))
            if value is None:
                return None
            out.append((name, value))
        return out

    def dumps(self, value: Any) -> str:
        return json.dumps(value, ensure_ascii=False, separators=(self.comma, self.colon))


def _listed(node: Schema) -> list | None:
    if not isinstance(node, dict):
        return None
    return [node["const"]] if "const" in node else node.get("enum")


def _spelt(value: Any) -> Schema:
    """The schema of exactly `value`, with an object's keys in its own order (the order the
    backend writes them)."""
    if isinstance(value, dict):
        return {
            "type": "object",
            "properties": {k: _spelt(v) for k, v in value.items()},
            "required": list(value),
            "additionalProperties": False,
        }
    if isinstance(value, list):
        n = len(value)
        return {
            "type": "array",
            "prefixItems": [_spelt(v) for v in value],
            "items": False,
            "minItems": n,
            "maxItems": n,
        }
    return {"const": value}


def complete_string(node: dict, text: str) -> str | None:
    """The shortest suffix making `text` a valid string under `node` (type string)."""
    need = max(0, node.get("minLength", 0) - len(text))
    if need > MAX_FILL:
        return None
    if "pattern" in node:
        return _regex_completion(node["pattern"], text, node.get("minLength", 0))
    if "format" in node:
        example = _FORMATS.get(node["format"])
        if example is None or not example.startswith(text) or len(example) < len(text) + need:
            return None
        return example[len(text) :]
    return "a" * need


def shortest_string(node: dict) -> str | None:
    """The shortest string valid under `node`'s string keywords."""
    return complete_string(node, "")


def _regex_completion(pattern: str, text: str, min_length: int) -> str | None:
    """Shortest suffix s with `text + s` fully matching `pattern` (anchors stripped) and at
    least `min_length` characters long; None where the regex cannot be analysed."""
    body = pattern[1:] if pattern.startswith("^") else pattern
    body = body[:-1] if body.endswith("$") and not body.endswith("\\$") else body
    try:
        dfa = _dfa(body)
    except Exception:  # interegular refuses some syntax: unknown, not wrong
        return None
    state = dfa.start
    for ch in text:
        state = dfa.step(state, ch)
        if state is None:
            return None
    return dfa.shortest_from(state, max(0, min_length - len(text)))


class _Dfa:
    """An interegular FSM with one printable character per transition class and memoized
    shortest suffixes (a string's completion is asked for at every step while it is open)."""

    def __init__(self, pattern: str) -> None:
        fsm = interegular.parse_pattern(pattern).to_fsm()
        self.fsm, self.start = fsm, fsm.initial
        chars: dict[Any, str] = {}
        for ch in "a0A_-. " + "".join(map(chr, range(0x21, 0x7F))):
            chars.setdefault(fsm.alphabet[ch], ch)
        self.edges = {
            state: [(chars[sym], nxt) for sym, nxt in moves.items() if sym in chars]
            for state, moves in fsm.map.items()
        }
        self._memo: dict[tuple[Any, int], str | None] = {}

    def step(self, state: Any, ch: str) -> Any:
        return self.fsm.map.get(state, {}).get(self.fsm.alphabet[ch])

    def shortest_from(self, state: Any, need: int) -> str | None:
        """Shortest suffix of at least `need` characters from `state` to a final state."""
        if (state, need) not in self._memo:
            paths = {(state, need): ""}
            queue, found = [(state, need)], None
            for at, left in queue:
                if at in self.fsm.finals and left == 0:
                    found = paths[(at, left)]
                    break
                for ch, nxt in self.edges.get(at, ()):
                    key = (nxt, max(0, left - 1))
                    if key not in paths:
                        paths[key] = paths[(at, left)] + ch
                        queue.append(key)
            self._memo[(state, need)] = found
        return self._memo[(state, need)]


_DFAS: dict[str, _Dfa] = {}
_MAX_DFAS = 512


def _dfa(pattern: str) -> _Dfa:
    if pattern not in _DFAS:
        if len(_DFAS) >= _MAX_DFAS:
            _DFAS.clear()  # a bound, not an LRU: rebuilding one costs milliseconds
        _DFAS[pattern] = _Dfa(pattern)
    return _DFAS[pattern]


def _smallest_number(node: dict, integer: bool) -> int | float | None:
    """The number of smallest magnitude within `node`'s bounds (and multipleOf), or None."""
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
                candidates.append(bound)
    for value in sorted(candidates, key=abs):
        if integer and value != int(value):
            continue
        value = int(value) if integer or value == int(value) else value
        if number_ok(node, value):
            return value
    return None


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


def search_pattern(pattern: str, text: str) -> bool:
    """Whether Python's `re` finds `pattern` in `text` (as `jsonschema` judges); False when it
    cannot read the pattern."""
    import re

    try:
        return re.search(pattern, text) is not None
    except re.error:
        return False
