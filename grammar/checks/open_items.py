"""Items that can always be written as one not yet held: ``uniqueItems`` beyond strings.

An array whose items must not repeat is checked by the matcher (``value_scan``): a token that
would finish an item equal to one the array holds is refused. That is exact only where refusing
never leaves a dead end: every prefix of an item that the backend allows must still be finishable
as infinitely many values, or be settled at once and checked there. :func:`open_kinds` proves it
from the analysed item schema, type by type:

* an object that takes further keys (``additionalProperties`` absent or true, no
  ``maxProperties`` or ``propertyNames``, patterns only of one key each, as ``schema_order``
  writes declared keys): before its ``}`` another key can always be added;
* a closed object (:class:`Closed`): settled once its last open member is finished, after
  which only members of a few listed values may follow, each way of writing them checked;
* an array with no ``maxItems`` (nor ``prefixItems``, ``contains``) whose item schema plainly has
  an instance: before its ``]`` another item can always be added;
* a string as ``Modes.open_string`` reads one (at most a ``minLength`` and a ``pattern`` that
  never runs out);
* a number bounded at most from below, by 0 or more: digits can always be appended;
* ``true``, ``false``, ``null``: settled by their first letter, and checked there.

Numbers are the one place where text and value part: ``1``, ``1.0`` and ``1e0`` are one value to
the judge (``jsonschema`` reads numbers as Python floats and ints). An item that is a number is
therefore written in plain decimal, without an exponent and, with a point, with at most
:data:`MAX_DIGITS` significant digits and :data:`MAX_PLACES` places, where distinct decimals are
distinct floats; ``-`` is refused where no item may be negative, and a number begun is refused
as soon as every way to finish it is a value the array holds (``0`` as an integer, say). That
is a narrowing of the numbers such an item may be spelt as, never of the values it may take.

``anyOf`` is the union of its branches, ``allOf`` the intersection where at most one part
constrains each type (two patterns, say, may share only finitely many strings).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, NamedTuple

from jsonschema import Draft202012Validator

from corral.grammar.regex.algebra import RegexAlgebra
from corral.grammar.schema.facts import ANNOTATIONS, finite_values

#: Most significant digits of a number item with a point (distinct decimals, distinct floats),
#: and most places after the point (far from the floats' underflow).
MAX_DIGITS, MAX_PLACES = 15, 20
_KINDS = ("null", "boolean", "object", "array", "string", "integer", "fraction")
_OWN = {
    "object": frozenset(
        ("properties", "patternProperties", "required", "additionalProperties", "minProperties")
    ),
    "array": frozenset(("items", "minItems", "x-corral-unique")),
    "string": frozenset(("minLength", "pattern")),
    "number": frozenset(("minimum", "exclusiveMinimum")),
}
_KNOWN = frozenset(("type", "allOf", "anyOf", "$ref")).union(*_OWN.values())
#: keywords that may leave a schema without the plain instance of its type
_DEMANDING = frozenset(
    "enum const required minProperties minItems contains prefixItems pattern minLength format "
    "allOf anyOf oneOf not if $ref minimum maximum exclusiveMinimum exclusiveMaximum multipleOf "
    "dependentRequired dependentSchemas propertyNames".split()
)


class OpenItems(NamedTuple):
    """How the matcher reads items there: whether a number item may be a fraction, and whether
    none may be negative; for an item that is a closed object (:class:`Closed`), its last open
    member."""

    fraction: bool
    nonneg: bool
    closed: Closed | None = None


class Closed(NamedTuple):
    """A closed object item (``additionalProperties: false``) is settled once its last open
    member ``last`` (a string, number, array or open object, written in declared order) is
    finished: only the members declared after it remain, each one of a few listed values.
    ``tail``: every text that can follow ``last``'s value, compact, up to the closing ``}``;
    ``value``: how ``last``'s value is read when it is a number."""

    last: str
    tail: tuple[str, ...]
    value: OpenItems


class Kinds(NamedTuple):
    """The types an item schema admits, each "free" (unconstrained), "open" (constrained, still
    open) or "closed" (a closed object, ``closed``), and whether its numbers are bounded below by
    0 or more."""

    types: dict[str, str]
    nonneg: bool
    closed: Closed | None = None

    def summary(self) -> OpenItems:
        return OpenItems("fraction" in self.types, self.nonneg, self.closed)


_ANY = Kinds(dict.fromkeys(_KINDS, "free"), False)
#: a pattern that names one key (``schema_order`` writes an open object's declared keys so)
LITERAL_KEY = re.compile(r"\^((?:[A-Za-z0-9]|\\x\{[0-9a-f]+\})*)\$")
#: the most texts a closed object's members after its last open one may be written as
MAX_TAIL = 64


def open_kinds(
    node: Any, target: Callable[[str], Any], depth: int = 0, algebra: RegexAlgebra | None = None
) -> Kinds | None:
    """The :class:`Kinds` of ``node`` when every value it admits is open (above); else None.
    ``target`` resolves a ``$ref``; a reference deeper than 16 is not followed (None).
    ``algebra``: the caller's regex memos (a fresh one, for this call only, when None)."""
    algebra = algebra or RegexAlgebra()
    if node is True or node == {}:
        return _ANY
    if not isinstance(node, dict) or depth >= 16 or set(node) - _KNOWN - ANNOTATIONS:
        return None
    own = _own(node, target, depth, algebra)
    parts = [own] + [open_kinds(sub, target, depth + 1, algebra) for sub in node.get("allOf", ())]
    if "anyOf" in node:
        parts.append(union([open_kinds(sub, target, depth + 1, algebra) for sub in node["anyOf"]]))
    if "$ref" in node:
        parts.append(open_kinds(target(node["$ref"]), target, depth + 1, algebra))
    return intersect(parts)


def union(parts: list[Kinds | None]) -> Kinds | None:
    """Either part may describe the value."""
    if not parts or None in parts:
        return None
    types: dict[str, str] = {}
    for p in parts:
        for k, v in p.types.items():  # type: ignore[union-attr]
            if "closed" in (v, types.get(k)) and k in types:
                return None  # a closed object beside another: it may not be settled there
            types[k] = v if k not in types or v == "free" else types[k]
    numbered = [p.nonneg for p in parts if {"integer", "fraction"} & set(p.types)]  # type: ignore[union-attr]
    closed = next((p.closed for p in parts if p.closed is not None), None)  # type: ignore[union-attr]
    return Kinds(types, bool(numbered) and all(numbered), closed)


def intersect(parts: list[Kinds | None]) -> Kinds | None:
    """Every part applies to the value; None where two parts constrain one type (other than a
    number's lower bounds, which meet in the larger)."""
    if None in parts:
        return None
    out = _ANY
    for p in parts:
        types = {}
        for k in set(out.types) & set(p.types):  # type: ignore[union-attr]
            a, b = out.types[k], p.types[k]  # type: ignore[union-attr]
            if "free" not in (a, b) and k not in ("integer", "fraction"):
                return None
            types[k] = b if a == "free" else a
        closed = out.closed if types.get("object") == out.types.get("object") else p.closed  # type: ignore[union-attr]
        out = Kinds(
            types, out.nonneg or p.nonneg, closed if types.get("object") == "closed" else None
        )  # type: ignore[union-attr]
    return out


def _own(
    node: dict, target: Callable[[str], Any], depth: int, algebra: RegexAlgebra
) -> Kinds | None:
    """The kinds ``node``'s own keywords admit (``type`` and the keywords of each type)."""
    named = node.get("type", ["null", "boolean", "object", "array", "string", "number"])
    named = [named] if isinstance(named, str) else named
    types: dict[str, str] = {}
    closed = None
    for t in named:
        kind = "number" if t == "integer" else t
        used = _OWN.get(kind, frozenset()) & set(node)
        if kind == "object" and node.get("additionalProperties", True) is False:
            closed = None if "patternProperties" in node else _closed(node, target, depth, algebra)
            if closed is None:
                return None
            types["object"] = "closed"
            continue
        if used and not _open_of(kind, node, target, depth, algebra):
            return None
        state = "open" if used else "free"
        for k in (
            ("integer", "fraction") if t == "number" else ("integer",) if t == "integer" else (t,)
        ):
            types[k] = state
    nonneg = any(k in node for k in _OWN["number"])
    return Kinds(types, nonneg, closed)


def _closed(
    node: dict, target: Callable[[str], Any], depth: int, algebra: RegexAlgebra
) -> Closed | None:
    """The :class:`Closed` reading of a closed object: its last member whose value is open and
    no closed object itself (neither ``true``, ``false`` nor ``null``), and what may follow it.
    None where there is none, where members follow an optional one, or where they could be
    written in more than :data:`MAX_TAIL` ways (or under ``minProperties``)."""
    props = node.get("properties", {})
    names = list(props)
    required = set(node.get("required", ()))
    for k in range(len(names) - 1, -1, -1):
        inner = open_kinds(props[names[k]], target, depth + 1, algebra)
        if inner is not None and set(inner.types) <= {"string", "integer", "fraction", "array"} | (
            {"object"} if inner.types.get("object") != "closed" else set()
        ):
            break
    else:
        return None
    after = names[k + 1 :]
    if after and (names[k] not in required or "minProperties" in node):
        return None
    tails = [""]
    for name in after:
        values = _listed(props[name], target)
        if values is None:
            return None
        texts = [json.dumps(x) for x in (name, *values)]
        if any("\\" in t or not t.isascii() for t in texts):
            return None  # one spelling only: the backend may write other characters escaped
        key = texts[0] + ":"
        grown = [t + "," + key + v for t in tails for v in texts[1:]]
        tails = grown + ([] if name in required else tails)
        if len(tails) > MAX_TAIL:
            return None
    return Closed(names[k], tuple(t + "}" for t in tails), inner.summary())


def _listed(node: Any, target: Callable[[str], Any]) -> list | None:
    """The values a member declared after the last open one may take: a literal type or a list
    of plain values (``enum``/``const`` of strings, integers and literals, with at most a
    ``type``), each valid there."""
    if isinstance(node, dict) and set(node) == {"$ref"}:
        node = target(node["$ref"])
    if node is False:
        return []
    if not isinstance(node, dict) or set(node) - {"type", "enum", "const"} - ANNOTATIONS:
        return None
    values = finite_values(node)
    if values is None:
        named = node.get("type")
        named = [named] if isinstance(named, str) else named or []
        if not named or set(named) - {"boolean", "null"}:
            return None
        values = [v for t in named for v in ((True, False) if t == "boolean" else (None,))]
    if any(isinstance(v, dict | list | float) for v in values):
        return None  # one spelling only: quirks.LISTED_NUMBERS_SPELT_PLAIN (1.0 as 1)
    judge = Draft202012Validator(node)
    return [v for v in values if judge.is_valid(v)]


def _open_of(
    kind: str, node: dict, target: Callable[[str], Any], depth: int, algebra: RegexAlgebra
) -> bool:
    if kind == "object":  # patterns of one key each (declared keys, in any order) leave the rest
        keys = node.get("patternProperties", {})
        return node.get("additionalProperties", True) in (True, {}) and all(
            LITERAL_KEY.fullmatch(k) for k in keys
        )
    if kind == "array":
        items = node.get("items", True)
        if "x-corral-unique" in node:  # items that must not repeat: open ones only
            return open_kinds(items, target, depth + 1, algebra) is not None
        return inhabited(items, target, depth + 1)
    if kind == "string":
        pattern = node.get("pattern")
        return pattern is None or algebra.backend_never_runs_out(pattern) is True
    bounds = [node[k] for k in _OWN["number"] if k in node]
    return all(isinstance(b, int | float) and not isinstance(b, bool) and b >= 0 for b in bounds)


def inhabited(node: Any, target: Callable[[str], Any], depth: int = 0) -> bool:
    """Whether ``node`` plainly has an instance: it is true, or open (an instance of every type
    it admits can be grown), or it lacks every keyword that could refuse the plain instance
    (``null``, ``true``, ``{}``, ``[]``, ``""``) of some type it admits."""
    if node is True or node == {}:
        return True
    if not isinstance(node, dict) or depth >= 16:
        return False
    if set(node) & _DEMANDING:
        return False
    named = node.get("type", ["null"])
    named = [named] if isinstance(named, str) else named
    return bool(set(named) & {"null", "boolean", "object", "array", "string"})


# -- the values the matcher compares -------------------------------------------------------------


def canonical(text: bytes) -> str:
    """One spelling per value as the judge compares them: keys sorted, numbers as decimals
    (``1``, ``1.0`` and ``1.00`` alike; ``true`` is not ``1``)."""
    return json.dumps(_canon(json.loads(text)), sort_keys=True, separators=(",", ":"))


def _canon(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _canon(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_canon(x) for x in v]
    if isinstance(v, float):
        return int(v) if v.is_integer() else v
    return v


def number_text_ok(text: str, opens: OpenItems) -> bool:
    """Whether a number item begun with ``text`` is spelt as such an item may be (above): no
    exponent, no ``-`` where none may be negative, and with a point at most
    :data:`MAX_DIGITS` significant digits and :data:`MAX_PLACES` places, with room for one."""
    if any(c in text for c in "eE+") or (opens.nonneg and text.startswith("-")):
        return False
    whole, point, part = text.lstrip("-").partition(".")
    digits = len((whole + part).lstrip("0"))
    if not point:
        return True
    return digits <= MAX_DIGITS and len(part) <= MAX_PLACES and (part or digits < MAX_DIGITS)


def number_alive(text: str, opens: OpenItems, taken: Callable[[str], bool], held: int) -> bool:
    """Whether a number begun with ``text`` (spelt as :func:`number_text_ok` allows) can still
    be finished as one that is not ``taken`` (by an item of the ``held`` its array holds).
    Without a point, digits can always be appended (except after an integer ``0``); with one,
    the finished numbers are searched shortest first until one is not taken (at most
    ``held + 1`` distinct values are looked at)."""
    if "." not in text:
        return not (text.lstrip("-") == "0" and not opens.fraction) or not taken(text)
    frontier, seen = [text], set()
    while frontier:
        grown = []
        for t in frontier:
            if not t.endswith("."):
                if not taken(t):
                    return True
                seen.add(canonical(t.encode()))
            grown += [t + d for d in "0123456789" if number_text_ok(t + d, opens)]
        if len(seen) > held:
            return True
        frontier = grown
    return False


def tail_alive(head: bytes, typed: bytes, closed: Closed, held: frozenset[str]) -> bool:
    """Whether a closed object item whose text up to its last open member's value is ``head``,
    followed by ``typed``, can still be finished as a value ``held`` lacks."""
    typed = _compact(typed)
    return any(
        t.encode().startswith(typed) and canonical(head + t.encode()) not in held
        for t in closed.tail
    )


def _compact(text: bytes) -> bytes:
    """JSON text without the whitespace outside its strings."""
    out, inside, escaped = bytearray(), False, False
    for b in text:
        if inside:
            escaped, inside = (not escaped and b == 0x5C), inside and (escaped or b != 0x22)
        elif b == 0x22:
            inside = True
        elif b in b" \t\r\n":
            continue
        out.append(b)
    return bytes(out)
