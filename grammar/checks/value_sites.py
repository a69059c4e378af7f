"""Where the matcher checks values the backend cannot: the sites of ``value_checks``.

Two things the backend has no keyword for are marked by the analysis and checked by the matcher
at value boundaries (:mod:`corral.grammar.checks.value_checks`):

* :data:`FRACTION`: a number that is not an integer (what negating ``type: integer`` leaves
  among numbers). It is not a regular language over JSON's number syntax either (``1000e-3`` is
  an integer, ``1000e-4`` is not). The backend enforces a plain number there.
* :data:`UNIQUE`: ``uniqueItems`` over open strings (``type: string``, at most a
  ``minLength`` and a ``pattern`` that never runs out), an infinite domain that enumerating arrangements cannot cover. The backend
  enforces the array without it; a string item can always grow into one not yet written, so
  refusing duplicates never leaves a dead end.

The matcher cannot ask the backend which branch of an ``anyOf`` it is in, so a site is a
position in the instance (keys and indices from the root), found the way the backend finds the
schemas that apply there: :func:`value_sites` follows ``properties``, ``patternProperties``,
``additionalProperties``, ``prefixItems``, ``items``, ``$ref`` and every branch of
``allOf``/``anyOf``/``oneOf``, over-approximating (every pattern's schema applies to every key).
A site is checked only where every schema that can describe its value agrees
(``value_modes``); elsewhere it raises :class:`SiteConflict`.

Positions are a finite automaton: a state is the set of schemas reached, a transition a key (one
per property name the state's schemas declare, plus one for every other key) or an index (one per
``prefixItems`` place, plus one for the rest).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from corral.grammar.checks.open_items import (
    LITERAL_KEY,
    Kinds,
    OpenItems,
    intersect,
    open_kinds,
    union,
)
from corral.grammar.checks.value_modes import (
    FRACTION,
    MARKS,
    UNIQUE,
    Listed,
    Modes,
    SiteConflict,
)
from corral.grammar.regex.algebra import RegexAlgebra

__all__ = [
    "FRACTION",
    "MARKS",
    "UNIQUE",
    "SiteConflict",
    "Sites",
    "has_marks",
    "marks",
    "strip_marks",
]

#: Most automaton states a schema may need (each is one position class of its instances).
MAX_STATES = 4096


@dataclass
class Sites:
    """The automaton: state 0 is the root. ``fraction[s]``: a number there must not be an
    integer; ``unique[s]``: an array there must not repeat an item; ``listed[s]``: for such an
    array whose items are listed strings, those strings (:class:`Listed`), else None;
    ``opens[s]``: for such an array whose items are open values other than open strings, how
    they are read (``open_items``), else None."""

    fraction: list[bool] = field(default_factory=list)
    unique: list[bool] = field(default_factory=list)
    listed: list[Listed | None] = field(default_factory=list)
    opens: list[OpenItems | None] = field(default_factory=list)
    #: whether any array has open items (else the scan keeps no item text)
    has_opens: bool = False
    keys: list[dict[str, int]] = field(default_factory=list)
    other: list[int] = field(default_factory=list)
    index: list[list[int]] = field(default_factory=list)
    rest: list[int] = field(default_factory=list)

    def key(self, state: int, name: str) -> int:
        return self.keys[state].get(name, self.other[state])

    def item(self, state: int, i: int) -> int:
        places = self.index[state]
        return places[i] if i < len(places) else self.rest[state]


def has_marks(schema: Any) -> bool:
    """Whether any schema in ``schema`` carries a mark."""
    return any(k in node for node in _dicts(schema) for k in MARKS)


def marks(schema: Any) -> list[str]:
    """The pointers the marks in ``schema`` name (the keywords that needed a check)."""
    found = (str(node[k]) for node in _dicts(schema) for k in MARKS if k in node)
    return list(dict.fromkeys(found))


def strip_marks(schema: Any) -> list[str]:
    """Drop every mark in place (lenient mode: not checked); the pointers they named."""
    found = marks(schema)
    for node in _dicts(schema):
        for k in MARKS:
            node.pop(k, None)
    return found


def value_sites(schema: Any) -> Sites:
    """The automaton of ``schema``'s positions; raises :class:`SiteConflict` where a check
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


Term = tuple  # ("node", id) | ("and", terms) | ("or", terms): the schemas at a position
_TRUE: Term = ("and", ())
_FALSE: Term = ("or", ())


class _Builder:
    """Positions as terms: the schemas that apply at a member or item, as the conjunctions
    (``allOf``, ``$ref``, a node's own keywords) and the branch alternatives (``anyOf``,
    ``oneOf`` of a container) they come from. A branch of the container decides the member only
    together with the container's other members, which the matcher does not follow, so at a
    position a mark must hold in every branch that admits the value (``or`` is strict), while
    a value's own ``anyOf`` is read as the union it is (``value_modes``)."""

    def __init__(self, schema: Any) -> None:
        self.root = schema
        self.defs = schema.get("$defs", {}) if isinstance(schema, dict) else {}
        self.regexes = RegexAlgebra()  # the regex memos of this build
        self.modes = Modes(self._target, self.regexes)
        self.sites = Sites()
        self.states: dict[Term, int] = {}
        self.terms: list[Term] = []
        self.marked: list[str | None] = []  # state -> the pointer of its unique mark
        self.nodes: dict[int, Any] = {}
        self.busy: set[tuple[int, tuple]] = set()

    def run(self) -> Sites:
        todo = [self._state(self._node(self.root))]
        done: set[int] = set()
        while todo:
            state = todo.pop()
            if state in done:
                continue
            done.add(state)
            todo.extend(self._expand(state))
        return self.sites

    def _state(self, term: Term) -> int:
        if term in self.states:
            return self.states[term]
        if len(self.states) >= MAX_STATES:
            raise SiteConflict("", "the schema has too many positions to check values at")
        state = self.states[term] = len(self.states)
        self.terms.append(term)
        s = self.sites
        s.fraction.append(self.modes.check(self._mode(term, "number"), "number"))
        unique = self._mode(term, "array")
        self.marked.append(unique[1] if self.modes.check(unique, "array") else None)
        s.unique.append(self.marked[-1] is not None)
        s.listed.append(None)
        s.opens.append(None)
        s.keys.append({})
        s.other.append(-1)
        s.index.append([])
        s.rest.append(-1)
        return state

    def _expand(self, state: int) -> list[int]:
        term, s = self.terms[state], self.sites
        names = sorted(self._names(term))
        s.keys[state] = {k: self._state(self._child(term, ("key", k))) for k in names}
        s.other[state] = self._state(self._child(term, ("key", None)))
        width = self._width(term)
        s.index[state] = [self._state(self._child(term, ("item", i))) for i in range(width)]
        s.rest[state] = self._state(self._child(term, ("item", None)))
        if s.unique[state]:
            self._check_items(state)
        return [*s.keys[state].values(), s.other[state], *s.index[state], s.rest[state]]

    def _check_items(self, state: int) -> None:
        """Every item of a unique array is an open string, so a duplicate can be avoided, or
        one of the same listed strings, so the matcher can steer clear of those it holds, or an
        open value (``open_items``), compared whole."""
        s = self.sites
        items = self.terms[s.rest[state]]
        if not s.index[state] and self._open(items) == "open":
            return
        listed = None if s.index[state] else self._listed(items)
        if listed:
            s.listed[state] = Listed.of(listed)
            return
        kinds = None if s.index[state] else self._open_kinds(items)
        if kinds is None:
            raise SiteConflict(
                self.marked[state] or "",
                "the items of an array that must not repeat one may be other than open values "
                "or one list of strings",
            )
        s.opens[state] = kinds.summary()
        s.has_opens = True

    def _open_kinds(self, term: Term) -> Kinds | None:
        """The kinds of the open values every item at a position is (``open_items``)."""
        what, parts = term
        if what == "node":
            return open_kinds(self.nodes[parts], self._target, algebra=self.regexes)
        found = [self._open_kinds(t) for t in parts]
        return intersect(found) if what == "and" else union(found)

    def _listed(self, term: Term) -> frozenset[str] | None:
        """The strings every item at a position is one of, when all its schemas list the
        same ones (a conjunction: those all list); None otherwise."""
        what, parts = term
        if what == "node":
            return self.modes.listed_strings(self.nodes[parts])
        found = [self._listed(t) for t in parts]
        if not found or None in found:
            return None
        if what == "and":
            return frozenset.intersection(*found)  # type: ignore[arg-type]
        return found[0] if len(set(found)) == 1 else None

    # -- terms -------------------------------------------------------------------------------
    def _node(self, node: Any) -> Term:
        if node is True or node == {}:
            return _TRUE
        if not isinstance(node, dict):
            return _FALSE
        self.nodes[id(node)] = node
        return ("node", id(node))

    def _child(self, term: Term, step: tuple) -> Term:
        kind, parts = term
        if kind == "node":
            return self._node_child(self.nodes[parts], step)
        children = [self._child(t, step) for t in parts]
        return _and(children) if kind == "and" else _or(children)

    def _node_child(self, node: dict, step: tuple) -> Term:
        container = "object" if step[0] == "key" else "array"
        busy = (id(node), step)
        if not _admits(node, container) or busy in self.busy:
            return _FALSE  # a reference back to the same position adds no instance
        self.busy.add(busy)
        try:
            return self._node_child_of(node, step)
        finally:
            self.busy.discard(busy)

    def _node_child_of(self, node: dict, step: tuple) -> Term:
        parts = [self._own_child(node, step)]
        parts += [self._child(self._node(sub), step) for sub in node.get("allOf", ())]
        if "$ref" in node:
            parts.append(self._child(self._node(self._target(node["$ref"])), step))
        for key in ("anyOf", "oneOf"):
            if key in node:
                parts.append(_or([self._child(self._node(sub), step) for sub in node[key]]))
        return _and(parts)

    def _own_child(self, node: dict, step: tuple) -> Term:
        """What ``node``'s own keywords say of a member or item. A pattern that names one key
        (``schema_order`` writes those) is read as that key's; any other pattern may apply to
        any key: as an alternative to ``additionalProperties``, and beside a declared one."""
        kind, at = step
        if kind == "item":
            prefix = node.get("prefixItems", ())
            fits = at is not None and at < len(prefix)
            return self._node(prefix[at] if fits else node.get("items", True))
        named, loose = _patterns(node)
        found = [node["properties"][at]] if at in node.get("properties", {}) else []
        found += [named[at]] if at in named else []
        general = [self._node(p) for p in loose]
        if found:
            own = _and([self._node(f) for f in found])
            return _and([own, _or([*general, _TRUE])]) if general else own
        return _or([self._node(node.get("additionalProperties", True)), *general])

    def _names(self, term: Term, seen: set[int] | None = None) -> set[str]:
        """The property names the schemas at a position declare."""
        seen = set() if seen is None else seen
        kind, parts = term
        if kind != "node":
            return set().union(*(self._names(t, seen) for t in parts)) if parts else set()
        node = self.nodes[parts]
        if id(node) in seen:
            return set()
        seen.add(id(node))
        subs = [*node.get("allOf", ()), *node.get("anyOf", ()), *node.get("oneOf", ())]
        if "$ref" in node:
            subs.append(self._target(node["$ref"]))
        names = set(node.get("properties", {})) | set(_patterns(node)[0])
        return names.union(*(self._names(self._node(sub), seen) for sub in subs))

    def _width(self, term: Term, seen: set[int] | None = None) -> int:
        """The most ``prefixItems`` places the schemas at a position declare."""
        seen = set() if seen is None else seen
        kind, parts = term
        if kind != "node":
            return max((self._width(t, seen) for t in parts), default=0)
        node = self.nodes[parts]
        if id(node) in seen:
            return 0
        seen.add(id(node))
        subs = [*node.get("allOf", ()), *node.get("anyOf", ()), *node.get("oneOf", ())]
        if "$ref" in node:
            subs.append(self._target(node["$ref"]))
        own = len(node.get("prefixItems", ()))
        return max([own, *(self._width(self._node(sub), seen) for sub in subs)])

    def _mode(self, term: Term, kind: str) -> tuple[int, str]:
        what, parts = term
        if what == "node":
            return self.modes.mode(self.nodes[parts], kind)
        modes = [self._mode(t, kind) for t in parts]
        if what == "and":
            return self.modes.conjoin(modes, kind)
        return self.modes.branches(modes, kind)  # raises where a mark is not in every branch

    def _open(self, term: Term) -> str:
        """ "open" (open strings only), "neutral" (no constraint) or "no"."""
        what, parts = term
        if what == "node":
            return "open" if self.modes.open_string(self.nodes[parts]) else "no"
        found = [self._open(t) for t in parts]
        if what == "and":
            if "no" in found:
                return "no"
            return "open" if "open" in found else "neutral"
        return "open" if found and all(f == "open" for f in found) else "no"

    def _target(self, ref: str) -> Any:
        if ref == "#":
            return self.root
        if ref.startswith("#/$defs/") and ref[8:] in self.defs:
            return self.defs[ref[8:]]
        return True  # a reference the analysis does not emit: anything, conservatively


def _patterns(node: dict) -> tuple[dict[str, Any], list[Any]]:
    """``node``'s pattern properties: those that match exactly one key (by that key), and the
    rest."""
    named: dict[str, Any] = {}
    loose: list[Any] = []
    for pattern, sub in node.get("patternProperties", {}).items():
        m = LITERAL_KEY.fullmatch(pattern)
        if m is None:
            loose.append(sub)
        else:
            key = re.sub(r"\\x\{([0-9a-f]+)\}", lambda e: chr(int(e.group(1), 16)), m.group(1))
            named[key] = sub
    return named, loose


def _and(parts: list[Term]) -> Term:
    flat: list[Term] = []
    for p in parts:
        if p == _FALSE:
            return _FALSE
        flat.extend(p[1] if p[0] == "and" else (() if p == _TRUE else (p,)))
    flat = sorted(set(flat))
    return flat[0] if len(flat) == 1 else ("and", tuple(flat))


def _or(parts: list[Term]) -> Term:
    flat = sorted({p for p in parts if p != _FALSE})
    return flat[0] if len(flat) == 1 else ("or", tuple(flat))


def _admits(node: dict, kind: str) -> bool:
    types = node.get("type")
    if types is None:
        return True
    return kind in ({types} if isinstance(types, str) else set(types))
