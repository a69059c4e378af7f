"""Where an instance's numbers must not be integers: the sites a fraction check watches.

"A number that is not an integer" (what negating ``type: integer`` leaves among numbers) is not
a keyword the backend has, and not a regular language over JSON's number syntax either
(``1000e-3`` is an integer, ``1000e-4`` is not). The analysis marks such a number with
:data:`FRACTION` (its value: the JSON pointer of the keyword that needed it); the backend
ignores the mark and enforces a plain number there, and :mod:`corral.grammar.fractions` refuses,
at value boundaries, every token that would finish an integer at such a site.

The matcher cannot ask the backend which branch of an ``anyOf`` it is in, so a site is a
position in the instance (keys and indices from the root), found the way the backend finds the
schemas that apply there: :func:`fraction_sites` follows ``properties``, ``patternProperties``,
``additionalProperties``, ``prefixItems``, ``items``, ``$ref`` and every branch of
``allOf``/``anyOf``/``oneOf``, over-approximating (every pattern's schema applies to every key).
It is exact only where every schema that can describe a number at a position requires a
fraction, or none does; elsewhere (a fraction in one branch and a plain number in another, or a
fraction with bounds the backend would enforce too) it raises :class:`FractionConflict`.

Positions are a finite automaton: a state is the set of schemas reached, a transition a key (one
per property name the state's schemas declare, plus one for every other key) or an index (one per
``prefixItems`` place, plus one for the rest).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

#: The mark the analysis puts on ``{"type": "number"}`` for "a number that is not an integer".
FRACTION = "x-corral-fraction"

# How a schema admits a number, at its own position (branches and conjuncts included).
_NONE, _FREE, _INT, _LIMITED, _FRACTION, _MIXED, _CONFLICT = range(7)
_NUMERIC = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
#: Most automaton states a schema may need (each is one position class of its instances).
MAX_STATES = 4096


class FractionConflict(Exception):
    """A fraction site the check cannot keep exact (``pointer``: the keyword that needed it)."""

    def __init__(self, pointer: str, reason: str) -> None:
        super().__init__(reason)
        self.pointer, self.reason = pointer, reason


@dataclass
class Sites:
    """The automaton: state 0 is the root; ``checked[s]``: a number there must be a fraction."""

    checked: list[bool] = field(default_factory=list)
    keys: list[dict[str, int]] = field(default_factory=list)
    other: list[int] = field(default_factory=list)
    index: list[list[int]] = field(default_factory=list)
    rest: list[int] = field(default_factory=list)

    def key(self, state: int, name: str) -> int:
        return self.keys[state].get(name, self.other[state])

    def item(self, state: int, i: int) -> int:
        places = self.index[state]
        return places[i] if i < len(places) else self.rest[state]


def has_fraction(schema: Any) -> bool:
    """Whether any schema in ``schema`` carries the mark."""
    return any(FRACTION in node for node in _dicts(schema))


def marks(schema: Any) -> list[str]:
    """The pointers every mark in ``schema`` names (the keywords that needed a fraction)."""
    return list(dict.fromkeys(str(node[FRACTION]) for node in _dicts(schema) if FRACTION in node))


def strip_fractions(schema: Any) -> list[str]:
    """Drop every mark in place (lenient mode: a plain number); the pointers they named."""
    found = marks(schema)
    for node in _dicts(schema):
        node.pop(FRACTION, None)
    return found


def fraction_sites(schema: Any) -> Sites:
    """The automaton of ``schema``'s positions; raises :class:`FractionConflict` where a site
    would not be exact."""
    return _Builder(schema).run()


_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_ONE = ("additionalProperties", "items", "not", "contains", "propertyNames", "if", "then", "else")


def _dicts(schema: Any) -> Iterator[dict]:
    """Every schema object in ``schema`` (not the maps of names that hold them, nor values)."""
    stack, seen = [schema], set()
    while stack:
        node = stack.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        for key, value in node.items():
            if key in _MAPS and isinstance(value, dict):
                stack.extend(value.values())
            elif key in _LISTS and isinstance(value, list):
                stack.extend(value)
            elif key in _ONE:
                stack.append(value)


class _Builder:
    def __init__(self, schema: Any) -> None:
        self.root = schema
        self.defs = schema.get("$defs", {}) if isinstance(schema, dict) else {}
        self.sites = Sites()
        self.states: dict[frozenset[int], int] = {}
        self.tops: list[frozenset[int]] = []  # state -> the schemas reached there
        self.nodes: dict[int, Any] = {}
        self.modes: dict[int, tuple[int, str]] = {}
        self.busy: set[int] = set()

    def run(self) -> Sites:
        todo = [self._state([self.root])]
        done: set[int] = set()
        while todo:
            state = todo.pop()
            if state in done:
                continue
            done.add(state)
            todo.extend(self._expand(state))
        return self.sites

    # -- states ------------------------------------------------------------------------------
    def _state(self, tops: list[Any]) -> int:
        key = frozenset(self._keep(n) for n in tops)
        if key in self.states:
            return self.states[key]
        if len(self.states) >= MAX_STATES:
            raise FractionConflict("", "the schema has too many positions to check fractions")
        state = self.states[key] = len(self.states)
        self.tops.append(key)
        s = self.sites
        s.checked.append(self._checked([self.nodes[i] for i in key]))
        s.keys.append({})
        s.other.append(-1)
        s.index.append([])
        s.rest.append(-1)
        return state

    def _keep(self, node: Any) -> int:
        self.nodes[id(node)] = node
        return id(node)

    def _expand(self, state: int) -> list[int]:
        tops = [self.nodes[i] for i in self.tops[state]]
        closure = list(self._closure(tops))
        objects = [n for n in closure if _admits(n, "object")]
        arrays = [n for n in closure if _admits(n, "array")]
        names = sorted({k for n in objects for k in n.get("properties", {})})
        s = self.sites
        s.keys[state] = {k: self._state(self._key_children(objects, k)) for k in names}
        s.other[state] = self._state(self._key_children(objects, None))
        width = max((len(n.get("prefixItems", ())) for n in arrays), default=0)
        s.index[state] = [self._state(self._item_children(arrays, i)) for i in range(width)]
        s.rest[state] = self._state(self._item_children(arrays, None))
        return [*s.keys[state].values(), s.other[state], *s.index[state], s.rest[state]]

    def _closure(self, tops: list[Any]) -> Iterator[Any]:
        """``tops`` and every schema that applies at the same position (branches, refs)."""
        stack, seen = list(tops), set()
        while stack:
            node = stack.pop()
            if id(node) in seen or not isinstance(node, dict):
                continue
            seen.add(id(node))
            yield node
            for key in ("allOf", "anyOf", "oneOf"):
                stack.extend(node.get(key, ()))
            if "$ref" in node:
                stack.append(self._target(node["$ref"]))

    def _target(self, ref: str) -> Any:
        if ref == "#":
            return self.root
        if ref.startswith("#/$defs/") and ref[8:] in self.defs:
            return self.defs[ref[8:]]
        return True  # a reference the analysis does not emit: anything, conservatively

    @staticmethod
    def _key_children(objects: list[dict], name: str | None) -> list[Any]:
        out: list[Any] = []
        for n in objects:
            declared = n.get("properties", {})
            if name is not None and name in declared:
                out.append(declared[name])
            else:
                out.append(n.get("additionalProperties", True))
            out.extend(n.get("patternProperties", {}).values())
        return out or [False]

    @staticmethod
    def _item_children(arrays: list[dict], i: int | None) -> list[Any]:
        out: list[Any] = []
        for n in arrays:
            prefix = n.get("prefixItems", ())
            out.append(prefix[i] if i is not None and i < len(prefix) else n.get("items", True))
        return out or [False]

    # -- how a position admits numbers -------------------------------------------------------
    def _checked(self, tops: list[Any]) -> bool:
        modes = [self._mode(n) for n in tops]
        marked = [m for m in modes if m[0] in (_FRACTION, _MIXED, _CONFLICT)]
        if not marked:
            return False
        for mode, pointer in modes:
            if mode in (_MIXED, _CONFLICT):
                raise FractionConflict(pointer, _WHY[mode])
        if any(m[0] not in (_NONE, _FRACTION) for m in modes):
            raise FractionConflict(marked[0][1], _WHY[_MIXED])
        return True

    def _mode(self, node: Any) -> tuple[int, str]:
        """How ``node`` admits a number, and the mark's pointer when one is involved."""
        if node is True:
            return _FREE, ""
        if not isinstance(node, dict):
            return _NONE, ""
        if id(node) in self.modes:
            return self.modes[id(node)]
        if id(node) in self.busy:  # a reference back to the same position
            return _CONFLICT, ""
        self.busy.add(id(node))
        try:
            mode = self._own(node)
            for sub in node.get("allOf", ()):
                mode = _both(mode, self._mode(sub))
            for key in ("anyOf", "oneOf"):
                if key in node:
                    alts = [self._mode(sub) for sub in node[key]]
                    either = (_NONE, "")
                    for alt in alts:
                        either = _either(either, alt)
                    mode = _both(mode, either)
            if "$ref" in node:
                mode = _both(mode, self._mode(self._target(node["$ref"])))
        finally:
            self.busy.discard(id(node))
        self.modes[id(node)] = mode
        return mode

    @staticmethod
    def _own(node: dict) -> tuple[int, str]:
        types = node.get("type")
        types = {types} if isinstance(types, str) else set(types or ())
        values = [node["const"]] if "const" in node else node.get("enum")
        if values is not None:
            numbers = any(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
            own = (_LIMITED, "") if numbers else (_NONE, "")
        elif types and not types & {"number", "integer"}:
            own = (_NONE, "")
        elif types and "number" not in types:
            own = (_LIMITED if any(k in node for k in _NUMERIC) else _INT, "")
        else:
            own = (_LIMITED if any(k in node for k in _NUMERIC) else _FREE, "")
        if FRACTION in node:
            mark = (_FRACTION, str(node[FRACTION]))
            return mark if own[0] == _FREE else _both(mark, own)
        return own


_WHY = {
    _MIXED: "a number here may be a fraction in one branch and an integer or a bounded number "
    "in another, which the matcher cannot tell apart",
    _CONFLICT: "a fraction here is also bounded, an integer or a recursive reference",
}


def _both(a: tuple[int, str], b: tuple[int, str]) -> tuple[int, str]:
    """Both schemas apply to the same number."""
    (x, px), (y, py) = sorted((a, b))
    pointer = px or py
    if x == _NONE:
        return _NONE, ""
    if x == _FREE:
        return y, py
    if y == _FRACTION and x == _FRACTION:
        return _FRACTION, pointer
    if y in (_FRACTION, _MIXED, _CONFLICT):
        return _CONFLICT, pointer
    return (_LIMITED, "") if _LIMITED in (x, y) else (_INT, "")


def _either(a: tuple[int, str], b: tuple[int, str]) -> tuple[int, str]:
    """Either schema may describe the number (branches of one value)."""
    (x, px), (y, py) = sorted((a, b))
    pointer = px or py
    if x == _NONE:
        return y, py
    if x == _FREE:
        return _FREE, ""
    if y == _CONFLICT or x == _CONFLICT:
        return _CONFLICT, pointer
    if x == y == _FRACTION:
        return _FRACTION, pointer
    if (x, y) == (_INT, _FRACTION):
        return _FREE, ""  # every number is an integer or a fraction
    if y in (_FRACTION, _MIXED):
        return _MIXED, pointer
    return (_LIMITED, "") if _LIMITED in (x, y) else (_INT, "")


def _admits(node: dict, kind: str) -> bool:
    types = node.get("type")
    if types is None:
        return True
    return kind in ({types} if isinstance(types, str) else set(types))
