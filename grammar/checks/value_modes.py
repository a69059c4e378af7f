"""How a schema admits a number or an array, for the checks at value boundaries (``value_sites``).

Each schema at a position gets a *mode*, folded through ``allOf`` (both apply: ``_both``),
``anyOf``/``oneOf`` (either may: ``_either``) and ``$ref``:

* numbers: none, free, integers only, limited (bounds, ``multipleOf``, listed values), a
  fraction (the mark :data:`FRACTION`), mixed (a fraction in one branch and not in another) or a
  conflict (a fraction that is also bounded, or an integer: the check could leave a dead end);
* arrays: none, plain, unique (the mark :data:`UNIQUE`) or mixed.

A position is checked only where every schema that can describe the value there agrees; the
checks are exact there, and :class:`SiteConflict` names the mark that could not be kept.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable
from typing import Any, NamedTuple

from corral.grammar.regex.algebra import RegexAlgebra

#: The mark the analysis puts on ``{"type": "number"}`` for "a number that is not an integer"
#: (its value: the JSON pointer of the keyword that needed it).
FRACTION = "x-corral-fraction"
#: The mark for ``uniqueItems`` over open strings, checked by the matcher (value: its pointer).
UNIQUE = "x-corral-unique"
MARKS = (FRACTION, UNIQUE)

_NONE, _FREE, _INT, _LIMITED, _FRACTION, _MIXED, _CONFLICT = range(7)
_PLAIN, _UNIQUE = 1, 2  # array modes, with _NONE and _MIXED
FRACTION_MODE, UNIQUE_MODE = _FRACTION, _UNIQUE
_NUMERIC = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
#: the keywords an open string item may have (it can always grow into a new string; a
#: ``pattern`` only where every prefix it allows extends to infinitely many strings)
_OPEN_STRING = frozenset(("type", "minLength", "pattern"))
#: the keywords of a listed string item (``Modes.listed_strings``)
_LISTED_KEYS = frozenset(("enum", "const"))
_LISTED = _LISTED_KEYS | {"type"}

Mode = tuple[int, str]


class Listed(NamedTuple):
    """The strings the items of a unique array are listed from: each one's bytes as the
    backend spells it (``spelling``), and those bytes sorted (``sorted``, for prefix ranges)."""

    spelling: dict[str, bytes]
    sorted: tuple[bytes, ...]

    @classmethod
    def of(cls, values: frozenset[str]) -> Listed:
        spelling = {v: json.dumps(v, ensure_ascii=False)[1:-1].encode() for v in values}
        return cls(spelling, tuple(sorted(spelling.values())))

    def any_left(self, held: frozenset[str], typed: bytes | None) -> bool:
        """Whether a string not in ``held`` is spelt from ``typed`` (None: any string)."""
        if typed is None:
            return len(self.spelling) > len(held)
        lo = bisect.bisect_left(self.sorted, typed)
        hi = bisect.bisect_left(self.sorted, typed + b"\xff")  # UTF-8 has no 0xff byte
        taken = sum(1 for h in held if self.spelling.get(h, b"").startswith(typed))
        return hi - lo > taken


class SiteConflict(Exception):
    """A mark the matcher cannot check exactly (``pointer``: the keyword that needed it)."""

    def __init__(self, pointer: str, reason: str) -> None:
        super().__init__(reason)
        self.pointer, self.reason = pointer, reason


class Modes:
    """Modes of the schemas of one analysed document; ``target`` resolves a ``$ref``;
    ``algebra``: the regex memos of its owner (the analysis, or the sites' build; a fresh one,
    this object's own, when None)."""

    def __init__(self, target: Callable[[str], Any], algebra: RegexAlgebra | None = None) -> None:
        self._target = target
        self._algebra = algebra or RegexAlgebra()
        self._memo: dict[tuple[int, str], Mode] = {}
        self._busy: set[tuple[int, str]] = set()

    def conjoin(self, modes: list[Mode], kind: str) -> Mode:
        """The mode of a value every one of ``modes`` applies to."""
        both = _both if kind == "number" else _both_array
        out: Mode = ((_FREE if kind == "number" else _PLAIN), "")
        for m in modes:
            out = both(out, m)
        return out

    def branches(self, modes: list[Mode], kind: str) -> Mode:
        """The mode at a position reached through any one of several branches of a container:
        a mark must hold in every branch that admits the value (raises where it does not)."""
        marks = (_FRACTION,) if kind == "number" else (_UNIQUE,)
        marked = [m for m in modes if m[0] in (*marks, _MIXED, _CONFLICT)]
        if not marked:
            either = _either if kind == "number" else _either_array
            out: Mode = (_NONE, "")
            for m in modes:
                out = either(out, m)
            return out
        if any(m[0] not in (_NONE, *marks) for m in modes):
            bad = (
                next(m for m in modes if m[0] in (_MIXED, _CONFLICT))
                if any(m[0] in (_MIXED, _CONFLICT) for m in modes)
                else (_MIXED, marked[0][1])
            )
            raise SiteConflict(bad[1] or marked[0][1], why(bad[0], kind))
        return marked[0]

    def check(self, mode: Mode, kind: str) -> bool:
        """Whether a position of ``mode`` is checked (raises where a check would not be exact)."""
        if mode[0] in (_MIXED, _CONFLICT):
            raise SiteConflict(mode[1], why(mode[0], kind))
        return mode[0] == (FRACTION_MODE if kind == "number" else UNIQUE_MODE)

    def open_string(self, node: Any, depth: int = 0) -> bool:
        """Whether ``node`` admits only strings, and every string prefix it allows can still be
        finished as infinitely many strings (so a duplicate can always be avoided): no bound
        but a ``minLength``, and a ``pattern`` (the backend's regex) only where its automaton
        never runs out of continuations (``regex_algebra.backend_never_runs_out``)."""
        if isinstance(node, dict) and "$ref" in node and depth < 16:
            rest = {k: v for k, v in node.items() if k != "$ref"}
            return self.open_string(self._target(node["$ref"]), depth + 1) and (
                not rest or self.open_string(rest, depth + 1)
            )
        if not isinstance(node, dict) or depth >= 16:
            return False
        if set(node) - _OPEN_STRING - {"allOf"} or node.get("type") != "string":
            return False
        if "pattern" in node and self._algebra.backend_never_runs_out(node["pattern"]) is not True:
            return False
        return all(
            _neutral(sub) or self.open_string(sub, depth + 1) for sub in node.get("allOf", ())
        )

    def listed_strings(self, node: Any, depth: int = 0) -> frozenset[str] | None:
        """The strings ``node`` lists when it admits exactly a finite set of them (``enum`` or
        ``const`` of strings, at most ``type: string`` beside), else None."""
        if isinstance(node, dict) and set(node) == {"$ref"} and depth < 16:
            return self.listed_strings(self._target(node["$ref"]), depth + 1)
        if isinstance(node, dict) and set(node) - {"type"} == {"anyOf"} and depth < 16:
            # one value's branches: it is one of the strings some branch lists
            found = [self.listed_strings({**b, **_typed(node)}, depth + 1) for b in node["anyOf"]]
            return None if None in found else frozenset().union(*found)  # type: ignore[arg-type]
        if not isinstance(node, dict) or set(node) - _LISTED or not _LISTED_KEYS & set(node):
            return None
        if node.get("type", "string") not in ("string", ["string"]):
            return None
        values = [node["const"]] if "const" in node else list(node["enum"])
        if "const" in node and "enum" in node:
            values = [v for v in values if v in node["enum"]]
        if not all(isinstance(v, str) for v in values):
            return None
        return frozenset(values)

    def mode(self, node: Any, kind: str) -> Mode:
        """How ``node`` admits a ``kind`` ("number" or "array") value."""
        if node is True:
            return (_FREE if kind == "number" else _PLAIN), ""
        if not isinstance(node, dict):
            return _NONE, ""
        key = (id(node), kind)
        if key in self._memo:
            return self._memo[key]
        if key in self._busy:  # a reference back to the same position: it adds no instance
            return _NONE, ""
        both, either = (_both, _either) if kind == "number" else (_both_array, _either_array)
        self._busy.add(key)
        try:
            mode = _own(node) if kind == "number" else _own_array(node)
            for sub in node.get("allOf", ()):
                mode = both(mode, self.mode(sub, kind))
            for k in ("anyOf", "oneOf"):
                if k in node:
                    alts: Mode = (_NONE, "")
                    for sub in node[k]:
                        alts = either(alts, self.mode(sub, kind))
                    mode = both(mode, alts)
            if "$ref" in node:
                mode = both(mode, self.mode(self._target(node["$ref"]), kind))
        finally:
            self._busy.discard(key)
        self._memo[key] = mode
        return mode


def _neutral(node: Any) -> bool:
    return node is True or node == {}


def _types(node: dict) -> set[str]:
    types = node.get("type")
    return {types} if isinstance(types, str) else set(types or ())


def _own(node: dict) -> Mode:
    types = _types(node)
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


def _own_array(node: dict) -> Mode:
    types = _types(node)
    values = [node["const"]] if "const" in node else node.get("enum")
    if (types and "array" not in types) or (
        values is not None and not any(isinstance(v, list) for v in values)
    ):
        return _NONE, ""
    return (_UNIQUE, str(node[UNIQUE])) if UNIQUE in node else (_PLAIN, "")


def why(mode: int, kind: str) -> str:
    if kind == "array":
        return (
            "an array here may need distinct items in one branch and not in another, which the "
            "matcher cannot tell apart"
        )
    if mode == _CONFLICT:
        return "a fraction here is also bounded, an integer or a recursive reference"
    return (
        "a number here may be a fraction in one branch and an integer or a bounded number in "
        "another, which the matcher cannot tell apart"
    )


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


def _typed(node: dict) -> dict:
    return {"type": node["type"]} if "type" in node else {}


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


def _both_array(a: Mode, b: Mode) -> Mode:
    """Both schemas apply to the same array."""
    (x, px), (y, py) = sorted((a, b))
    if x == _NONE:
        return _NONE, ""
    if _UNIQUE in (x, y):
        return _UNIQUE, px if x == _UNIQUE else py
    return (y, py) if y == _MIXED else (_PLAIN, "")


def _either_array(a: Mode, b: Mode) -> Mode:
    """Either schema may describe the array."""
    (x, px), (y, py) = sorted((a, b))
    if x == _NONE:
        return y, py
    if x == y and x != _MIXED:
        return x, px or py
    return _MIXED, px or py
