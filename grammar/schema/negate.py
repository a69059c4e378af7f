"""Exact negation of analysed schemas: `not S` rewritten into positive keywords.

`negate(s, within)` returns a schema that accepts exactly the instances whose type is in
`within` and that `s` rejects. A schema is a conjunction of keywords, so its negation is a
disjunction: the types `s` excludes, plus, per keyword, the instances of that keyword's type
that break it (`minLength: n` becomes `maxLength: n-1`, `required: [a]` becomes
`properties: {a: false}`, `enum` over strings becomes a pattern matching every other string).
A `pattern` is negated through the exact regex algebra (`regex_algebra`, on the pattern's
Python source). Keywords whose negation is not expressible for the backend (`multipleOf`,
`items`, `additionalProperties` with a schema, a pattern beyond the algebra, ...) raise
`NotExpressible`; the caller refuses the
keyword (strict) or reports it (lenient). Nothing is ever approximated. A number that is not an
integer (what `not {type: integer}` leaves) is marked `FRACTION` for the matcher to check at
value boundaries (`value_sites`, `value_checks`).

Copies: the schema negated is only read; the negation is built from new objects but may share
subtrees with it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from corral.grammar.backends.quirks import LEFT_OUT, negation_lets_quotes_through
from corral.grammar.checks.value_sites import FRACTION
from corral.grammar.schema.deferred import Deferred
from corral.grammar.schema.facts import ALL_TYPES, closed_keys, normalize_types, types_of
from corral.grammar.schema.negate_context import NegationContext

#: Largest magnitude at which a JSON number still compares exactly as an f64 bound.
_EXACT_FLOAT = 2**53


class NotExpressible(Exception):
    """The negation of this keyword cannot be written as a backend-enforceable schema."""

    def __init__(self, keyword: str, reason: str) -> None:
        super().__init__(reason)
        self.keyword, self.reason = keyword, reason


class Negator:
    """Negates analysed schemas; `lookup` maps a `$ref` to its analysed target (or None)."""

    def __init__(
        self,
        lookup: Callable[[str], dict | bool | None],
        tick: Callable[[], None],
        complement: Callable[[str], str | None],
        deferred: Deferred | None = None,
    ):
        self._lookup = lookup
        self._tick = tick
        #: backend regex -> a backend regex of the strings it does not match (None: no string);
        #: raises NotExpressible when that cannot be built exactly
        self._complement = complement
        self._active_refs: set[str] = set()
        self._ctx = NegationContext(lookup)
        self._deferred = deferred if deferred is not None else Deferred()
        #: the pointer of the keyword being negated, named by the fractions it needs
        self.pointer = ""
        #: whether a negation left a number that must not be an integer (``value_sites``)
        self.made_fraction = False

    def negate(
        self,
        s: dict | bool,
        within: frozenset[str] = ALL_TYPES,
        keys: frozenset[str] | None = None,
        ctx: Any = True,
    ) -> dict | bool:
        """A schema for {x : type(x) in within and x does not satisfy s}.

        `keys`, when given, are the only property names objects can have in the context the
        negation is used in (a closed object next to it); it makes `additionalProperties`
        negatable: "some key outside `properties`" becomes "one of these keys is present".
        `ctx` is the schema the negation is conjoined with (`negate_context`): what it rules out
        at a member or item may be left out there.
        """
        self._tick()
        if s is True or s == {}:
            return False
        if s is False:
            return _of_types(within)
        if (held := self._deferred.reason(s)) is not None:  # a `not` left for a fold
            raise NotExpressible("not", held.split(": ", 1)[-1])
        parts = self._outside_types(s, within)
        inside = _inside_types(s, within)
        if inside:
            for key, value in s.items():
                parts.extend(self._negate_keyword(key, value, s, inside, keys, ctx))
        return _any_of(parts)

    def _outside_types(self, s: dict, within: frozenset[str]) -> list[dict]:
        if "type" not in s:
            return []
        own = types_of({"type": s["type"]})
        rest = [
            t
            for t in sorted(within)
            if t not in own
            and not (t == "integer" and "number" in own)
            and not (t == "number" and "integer" in own)  # the fractions, below
        ]
        out = [_of_types(frozenset(rest))] if rest else []
        if "number" in within and "integer" in own and "number" not in own:
            # the numbers an integer type leaves: checked at value boundaries (`value_checks`)
            self.made_fraction = True
            out.append({"type": "number", FRACTION: self.pointer})
        return out

    def _negate_keyword(
        self,
        key: str,
        value: object,
        s: dict,
        inside: frozenset[str],
        keys: frozenset[str] | None,
        ctx: Any,
    ) -> list:
        if key == "type":
            return []
        if key == FRACTION:  # a number that is not an integer: negated, the integers
            return [{"type": "integer"}] if inside & {"number", "integer"} else []
        if key in ("const", "enum"):
            return _not_values([value] if key == "const" else value, inside)
        if key == "allOf":  # same instance: the key context still holds
            return [self.negate(sub, inside, keys, ctx) for sub in value]
        if key == "anyOf":
            negs = [self.negate(sub, inside, keys, ctx) for sub in value]
            return [False] if any(n is False for n in negs) else [{"allOf": negs}]
        if key == "$ref":
            return [self._negate_ref(value, inside, keys, ctx)]
        if key == "pattern" and "string" in inside:
            other = self._complement(value)
            return [] if other is None else [{"type": "string", "pattern": other}]
        if key in _STRING_NEG and "string" in inside:
            return _STRING_NEG[key](value)
        if key in _NUMBER_NEG and inside & {"number", "integer"}:
            return _NUMBER_NEG[key](value, "number" if "number" in inside else "integer")
        if key in _ARRAY_KEYS and "array" in inside:
            return self._negate_array_keyword(key, value, s, ctx)
        if key in _OBJECT_KEYS and "object" in inside:
            return self._negate_object_keyword(key, value, s, keys, ctx)
        if key in _STRING_KEYS or key in _NUMBER_NEG or key in _ARRAY_KEYS or key in _OBJECT_KEYS:
            return []  # the keyword only constrains types this context excludes
        raise NotExpressible(key, f"negating '{key}' is not supported")

    def _negate_ref(
        self, ref: str, inside: frozenset[str], keys: frozenset[str] | None, ctx: Any
    ) -> dict | bool:
        target = self._lookup(ref)
        if target is None or ref in self._active_refs:
            raise NotExpressible("$ref", "negating a recursive $ref is not supported")
        self._active_refs.add(ref)
        try:
            return self.negate(target, inside, keys, ctx)
        finally:
            self._active_refs.discard(ref)

    def _in(self, sub: Any, ctx: Any) -> dict | bool:
        """`sub` negated at a member or item whose context is `ctx`."""
        types = self._ctx.types(ctx)
        if not types:
            return False  # the context allows nothing here: nothing to fail
        return self.negate(sub, types, closed_keys(ctx), ctx)

    def _negate_array_keyword(self, key: str, value: object, s: dict, ctx: Any) -> list:
        if key == "minItems":
            return [{"type": "array", "maxItems": value - 1}] if value > 0 else []
        if key == "maxItems":
            return [{"type": "array", "minItems": value + 1}]
        if key == "prefixItems":
            out = []
            for i, sub in enumerate(value):
                neg = self._in(sub, self._ctx.item(ctx, i))
                if neg is not False:
                    prefix = [True] * i + [neg]
                    out.append({"type": "array", "minItems": i + 1, "prefixItems": prefix})
            return out
        # items
        if value is True or value == {}:
            return []
        first = len(s.get("prefixItems", ()))
        if value is False:
            return [{"type": "array", "minItems": first + 1}]
        rest = self._ctx.item(ctx, first)
        if rest == self._ctx.item(ctx, first + 64):  # the same context for every later item
            types = self._ctx.types(rest)
            if not _inside_types(value, types):  # every item the context allows fails it
                return [{"type": "array", "minItems": first + 1}] if types else []
            if self.negate(value, types, closed_keys(rest), rest) is False:
                return []  # every item the context allows satisfies it
        raise NotExpressible("items", "negating 'items' needs 'contains', which is not supported")

    def _negate_object_keyword(
        self, key: str, value: object, s: dict, keys: frozenset[str] | None, ctx: Any
    ) -> list:
        if key == "required":
            return [{"type": "object", "properties": {name: False}} for name in value]
        if key == "properties":
            out = []
            for name, sub in value.items():
                neg = self._in(sub, self._ctx.member(ctx, name))
                if neg is not False:
                    out.append({"type": "object", "required": [name], "properties": {name: neg}})
            return out
        if key == "minProperties":
            return [{"type": "object", "maxProperties": value - 1}] if value > 0 else []
        if key == "maxProperties":
            return [{"type": "object", "minProperties": value + 1}]
        if key == "additionalProperties":
            if value is True or value == {}:
                return []
            if value is False and not s.get("properties") and not s.get("patternProperties"):
                return [{"type": "object", "minProperties": 1}]
            if keys is not None and not s.get("patternProperties"):
                extra = sorted(keys - set(s.get("properties", ())))
                if value is False:
                    return [{"type": "object", "required": [k]} for k in extra]
                negs = {k: self._in(value, self._ctx.member(ctx, k)) for k in extra}
                return [
                    {"type": "object", "required": [k], "properties": {k: neg}}
                    for k, neg in negs.items()
                    if neg is not False
                ]
        raise NotExpressible(key, f"negating '{key}' needs key-level 'contains'")


def _of_types(types: frozenset[str]) -> dict | bool:
    types = normalize_types(types)
    if not types:
        return False
    if types >= ALL_TYPES:
        return True
    return {"type": sorted(types)[0] if len(types) == 1 else sorted(types)}


def _inside_types(s: dict, within: frozenset[str]) -> frozenset[str]:
    if "type" not in s:
        return within
    own = types_of({"type": s["type"]})
    out = set()
    for t in within:
        if t in own or (t == "integer" and "number" in own):
            out.add(t)
        elif t == "number" and "integer" in own:
            out.add("integer")
    return frozenset(out)


def _any_of(parts: list) -> dict | bool:
    parts = [p for p in parts if p is not False]
    if any(p is True for p in parts):
        return True
    if not parts:
        return False
    return parts[0] if len(parts) == 1 else {"anyOf": parts}


def _not_values(values: list, inside: frozenset[str]) -> list:
    """Instances of the `inside` types not equal to any of `values`."""
    out: list = []
    for t in sorted(inside):
        same = [v for v in values if _same_kind(v, t)]
        if t == "null":
            out += [] if same else [{"type": "null"}]
        elif t == "boolean":
            rest = [b for b in (False, True) if b not in same]
            out += [{"type": "boolean", "enum": rest}] if rest else []
        elif t in ("number", "integer"):
            out += _numbers_except(same, t)
        elif t == "string":
            out += [
                {"type": "string", "pattern": regex_not_in(same)} if same else {"type": "string"}
            ]
        elif same:
            raise NotExpressible("enum", f"negating an {t} value in enum/const is not supported")
        else:
            out.append({"type": t})
    return out


def _same_kind(v: object, t: str) -> bool:
    if t == "null":
        return v is None
    if t == "boolean":
        return isinstance(v, bool)
    if t in ("number", "integer"):
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    return isinstance(v, {"string": str, "array": list, "object": dict}[t])


def _numbers_except(values: list, ntype: str) -> list[dict]:
    if any(abs(v) > _EXACT_FLOAT for v in values):
        raise NotExpressible("enum", "numbers this large cannot be excluded exactly")
    points = sorted(set(values))
    if not points:
        return [{"type": ntype}]
    out = [{"type": ntype, "exclusiveMaximum": points[0]}]
    out += [
        {"type": ntype, "exclusiveMinimum": a, "exclusiveMaximum": b}
        for a, b in itertools.pairwise(points)
    ]
    out.append({"type": ntype, "exclusiveMinimum": points[-1]})
    return out


def regex_escape(ch: str) -> str:
    """A character literal both Python `re` and Rust `regex` read the same way."""
    if ch.isascii() and ch.isalnum():
        return ch
    cp = ord(ch)
    return f"\\u{cp:04x}" if cp <= 0xFFFF else f"\\U{cp:08x}"


def regex_not_in(strings: list[str]) -> str:
    """An anchored regex matching every string except those listed (via a trie)."""
    trie: dict = {}
    for s in strings:
        node = trie
        for ch in s:
            node = node.setdefault(ch, {})
        node[""] = True
    return f"^(?:{_trie_complement(trie)})$"


def _trie_complement(node: dict) -> str:
    alts = [] if node.get("") else [""]
    chars = [c for c in node if c != ""]
    if chars:
        if negation_lets_quotes_through(chars):
            # leaving NUL out as well narrows (`quirks.CONTROL_CLASS_LETS_QUOTES_THROUGH`),
            # exactly as the judge's form of this regex does
            excluded = [*chars, chr(LEFT_OUT)]
        else:
            excluded = chars
        cls = "".join(regex_escape(c) for c in sorted(excluded))
        alts.append(f"[^{cls}][\\s\\S]*")
        alts += [f"{regex_escape(c)}(?:{_trie_complement(node[c])})" for c in sorted(chars)]
    else:
        alts.append("[\\s\\S]+")
    return "|".join(alts)


def _neg_min_length(n: int) -> list[dict]:
    return [{"type": "string", "maxLength": n - 1}] if n > 0 else []


_STRING_NEG = {
    "minLength": _neg_min_length,
    "maxLength": lambda n: [{"type": "string", "minLength": n + 1}],
}
_STRING_KEYS = frozenset((*_STRING_NEG, "pattern"))
_NUMBER_NEG = {
    "minimum": lambda v, t: [{"type": t, "exclusiveMaximum": v}],
    "exclusiveMinimum": lambda v, t: [{"type": t, "maximum": v}],
    "maximum": lambda v, t: [{"type": t, "exclusiveMinimum": v}],
    "exclusiveMaximum": lambda v, t: [{"type": t, "minimum": v}],
    "multipleOf": lambda v, t: _raise("multipleOf", "negating multipleOf is not supported"),
}
_ARRAY_KEYS = frozenset(("minItems", "maxItems", "prefixItems", "items"))
_OBJECT_KEYS = frozenset(
    (
        "required",
        "properties",
        "minProperties",
        "maxProperties",
        "additionalProperties",
        "patternProperties",
    )
)


def _raise(keyword: str, reason: str) -> list:
    raise NotExpressible(keyword, reason)
