"""Translate a Python regex into the backends' dialect, never admitting what Python refuses.

Clients' regexes (the ``regex`` constraint, and JSON-Schema ``pattern`` as ``jsonschema`` checks
it) mean what Python's ``re`` says. The backends parse a Rust-like dialect where ``\\d``, ``\\w``,
``\\s`` and ``.`` differ at the edges (ASCII vs Unicode, which newlines ``.`` skips). So the
pattern is parsed with Python's own parser and printed back with every class spelt out as explicit
code-point ranges computed from Python's definitions (positive shorthands narrowed to ASCII, see
``set_ranges``), so the backend accepts a subset of what Python accepts — never more. Constructs
a token-level automaton cannot
enforce are refused with a :class:`ConstraintError` naming them.
"""

from __future__ import annotations

import re
import sys
from functools import cache
from re import _constants as C  # type: ignore[attr-defined]
from re import _parser as P  # type: ignore[attr-defined]

from corral.grammar.backends.quirks import json_safe
from corral.grammar.core.errors import ConstraintError

Ranges = list[tuple[int, int]]  # sorted, disjoint, inclusive code-point ranges

_REFUSED = {
    C.ASSERT: "look-ahead/look-behind assertions",
    C.ASSERT_NOT: "negative look-ahead/look-behind assertions",
    C.GROUPREF: "back-references",
    C.GROUPREF_EXISTS: "conditional groups",
    C.ATOMIC_GROUP: "atomic groups",
    C.POSSESSIVE_REPEAT: "possessive quantifiers",
}
_ANCHORS = {
    C.AT_BEGINNING: "^",
    C.AT_BEGINNING_STRING: "^",
    C.AT_END: "$",
    C.AT_END_STRING: "$",
}
_UNSUPPORTED_FLAGS = re.IGNORECASE | re.MULTILINE | re.VERBOSE | re.DOTALL | re.ASCII | re.LOCALE


def translate_regex(
    pattern: str,
    *,
    keyword: str = "regex",
    pointer: str = "",
    search: bool = False,
    guarded: list[str] | None = None,
) -> str:
    """The backend-dialect regex that matches exactly the strings Python's ``re`` matches.

    ``search``: the regex is only ever used to search (a JSON-Schema pattern), so repetitions at
    its unanchored ends are cut to their least count (:func:`_search_core`): the same strings
    contain a match, and the backend's lexer is spared a counted repetition it would have to
    track at every position (``\\w{1,16}`` over all of Unicode's word characters ran its lexer
    out of expressions).

    ``search`` also means the regex will match the inside of a JSON string: its classes then
    go through :func:`json_safe`, and ``guarded`` (when given) collects the pattern if one had
    to leave a character out."""
    try:
        parsed = P.parse(pattern)
    except (re.error, RecursionError, OverflowError) as e:
        raise ConstraintError(
            f"invalid regular expression {pattern!r}: {e}", pointer, keyword
        ) from e
    if parsed.state.flags & _UNSUPPORTED_FLAGS:
        raise ConstraintError(
            f"regex flags (?i) (?m) (?s) (?x) (?a) are not supported in {pattern!r}",
            pointer,
            keyword,
        )
    items = list(parsed)
    if _end_inside(items, last=True):
        raise ConstraintError(
            f"an end anchor inside {pattern!r} (only the pattern's end may be anchored) cannot "
            "be enforced token by token",
            pointer,
            keyword,
        )
    printer = _Printer(pattern, keyword, pointer, in_json=search)
    out = printer.seq(_search_core(items) if search else items)
    if printer.guarded and guarded is not None:
        guarded.append(pattern)
    return out


def _end_inside(items: list, last: bool) -> bool:
    """Whether an end anchor (`$`, `\\Z`) stands anywhere but at the end of the pattern (the
    last item of a sequence that ends it, through groups and alternatives): the backend
    refuses one anywhere else (``backends.quirks.END_ANCHOR_ONLY_AT_END``)."""
    for i, (op, arg) in enumerate(items):
        at_end = last and i == len(items) - 1
        if op is C.AT and arg in (C.AT_END, C.AT_END_STRING) and not at_end:
            return True
        if op is C.BRANCH and any(_end_inside(list(b), at_end) for b in arg[1]):
            return True
        if op is C.SUBPATTERN and _end_inside(list(arg[3]), at_end):
            return True
        if op in (C.MAX_REPEAT, C.MIN_REPEAT) and _end_inside(list(arg[2]), False):
            return True
    return False


def _search_core(items: list) -> list:
    """``items`` with the repetitions at both ends cut to their least count, ``X{m,n}`` to
    ``X{m}`` (dropped when ``m`` is 0); a pattern that is one alternation or one group is cut
    inside. A string contains a match of ``R X{m,n}`` exactly when it contains one of ``R X{m}``
    (the match's prefix), and likewise at the front; anchors and look-arounds inside are
    evaluated at the same positions. A pattern that would be cut to nothing is left whole."""
    if len(items) == 1 and items[0][0] is C.BRANCH:
        _, branches = items[0][1]
        return [(C.BRANCH, (None, [_search_core(list(b)) for b in branches]))]
    if len(items) == 1 and items[0][0] is C.SUBPATTERN and not any(items[0][1][1:3]):
        return _search_core(list(items[0][1][3]))
    out = _cut(_cut(list(items), front=True), front=False)
    return out or items


def _cut(items: list, *, front: bool) -> list:
    """``items`` with the repetitions at one end cut to their least count (in place)."""
    at = 0 if front else -1
    while items and items[at][0] in (C.MAX_REPEAT, C.MIN_REPEAT):
        lo, hi, sub = items[at][1]
        if lo == hi:
            break
        if lo > 1:
            items[at] = (C.MAX_REPEAT, (lo, lo, sub))
            break
        piece = list(sub) if lo == 1 else []
        if front:
            items[:1] = piece
        else:
            items[-1:] = piece
    return items


class _Printer:
    def __init__(
        self,
        pattern: str,
        keyword: str,
        pointer: str,
        *,
        narrow: bool = True,
        in_json: bool = False,
    ) -> None:
        self.pattern, self.keyword, self.pointer = pattern, keyword, pointer
        self.narrow, self.in_json, self.guarded = narrow, in_json, False

    def cls(self, ranges: Ranges) -> str:
        """A class; inside a JSON string, made safe for the backend's quoting (`json_safe`,
        ``quirks.CONTROL_CLASS_LETS_QUOTES_THROUGH``)."""
        if self.in_json:
            safe = json_safe(ranges)
            self.guarded = self.guarded or safe != ranges
            ranges = safe
        return class_regex(ranges)

    def single_class(self, branch: list) -> Ranges | None:
        """The ranges of a branch that is one character class (or one character), else None."""
        if len(branch) != 1:
            return None
        op, arg = branch[0]
        if op is C.LITERAL:
            return [(arg, arg)]
        if op is C.NOT_LITERAL:
            return complement_ranges([(arg, arg)])
        if op is C.IN:
            return self.set_ranges(arg)
        return None

    def refuse(self, what: str) -> ConstraintError:
        return ConstraintError(
            f"{what} in {self.pattern!r} cannot be enforced token by token",
            self.pointer,
            self.keyword,
        )

    def seq(self, items: list) -> str:
        return "".join(self.item(op, arg) for op, arg in items)

    def item(self, op, arg) -> str:
        if op in _REFUSED:
            raise self.refuse(_REFUSED[op])
        if op is C.LITERAL:
            return _char(arg)
        if op is C.NOT_LITERAL:
            return self.cls(complement_ranges([(arg, arg)]))
        if op is C.ANY:
            return "."  # both dialects: any character but \n (no DOTALL)
        if op is C.IN:
            return self.cls(self.set_ranges(arg))
        if op is C.AT:
            if arg not in _ANCHORS:
                raise self.refuse(f"the word-boundary assertion {arg}")
            return _ANCHORS[arg]
        if op is C.BRANCH:  # one-class branches merged first (ONE_CLASS_ALTERNATIVES_MERGED)
            singles = [self.single_class(list(b)) for b in arg[1]]
            merged = merge_ranges([r for one in singles if one is not None for r in one])
            rest = [
                self.seq(list(b)) for b, one in zip(arg[1], singles, strict=True) if one is None
            ]
            return "(?:" + "|".join(([self.cls(merged)] if merged else []) + rest) + ")"
        if op is C.SUBPATTERN:
            _group, add_flags, del_flags, sub = arg
            if add_flags or del_flags:
                raise self.refuse("a scoped flag group (?flags:...)")
            return "(?:" + self.seq(list(sub)) + ")"
        if op in (C.MAX_REPEAT, C.MIN_REPEAT):  # laziness does not change what fullmatch accepts
            lo, hi, sub = arg
            body = "(?:" + self.seq(list(sub)) + ")"
            if hi is C.MAXREPEAT:
                return body + ("*" if lo == 0 else "+" if lo == 1 else f"{{{lo},}}")
            return body + (f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}")
        raise self.refuse(f"the construct {op}")

    def set_ranges(self, items: list) -> Ranges:
        """A class as code-point ranges. Unless `narrow` is off, positive shorthands (\\d \\w
        \\s) in a positive class are narrowed to their ASCII members: sound, far smaller for the
        backend's lexer, and only non-ASCII digits/letters/spaces are given up. Everything under
        a negation is exact, so that the complement never lets in a character Python would
        refuse."""
        negate = bool(items) and items[0][0] is C.NEGATE
        ranges: Ranges = []
        for op, arg in items[1:] if negate else items:
            if op is C.LITERAL:
                ranges.append((arg, arg))
            elif op is C.RANGE:
                ranges.append(arg)
            elif op is C.CATEGORY:
                ranges.extend(_category(arg, ascii_only=self.narrow and not negate))
            else:
                raise self.refuse(f"the class item {op}")
        merged = merge_ranges(ranges)
        return complement_ranges(merged) if negate else merged


def merge_ranges(ranges: Ranges) -> Ranges:
    out: Ranges = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def complement_ranges(ranges: Ranges) -> Ranges:
    out: Ranges = []
    nxt = 0
    for lo, hi in merge_ranges(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= sys.maxunicode:
        out.append((nxt, sys.maxunicode))
    return out


@cache
def _all_chars() -> str:
    return "".join(map(chr, range(0xD800))) + "".join(map(chr, range(0xE000, sys.maxunicode + 1)))


@cache
def _table(name: str) -> tuple[tuple[int, int], ...]:
    """Code-point ranges of Python's \\d, \\s or \\w for str patterns (the C regex engine scans
    every code point once, in tens of milliseconds; the result is kept for the process)."""
    runs = re.finditer({"digit": r"\d+", "space": r"\s+", "word": r"\w+"}[name], _all_chars())
    return tuple(merge_ranges([(ord(m.group()[0]), ord(m.group()[-1])) for m in runs]))


_CATEGORIES = {
    C.CATEGORY_DIGIT: ("digit", False),
    C.CATEGORY_NOT_DIGIT: ("digit", True),
    C.CATEGORY_SPACE: ("space", False),
    C.CATEGORY_NOT_SPACE: ("space", True),
    C.CATEGORY_WORD: ("word", False),
    C.CATEGORY_NOT_WORD: ("word", True),
}


def _category(cat, *, ascii_only: bool) -> Ranges:
    name, negated = _CATEGORIES[cat]
    ranges = list(_table(name))
    if negated:
        return complement_ranges(ranges)
    return [(lo, min(hi, 0x7F)) for lo, hi in ranges if lo <= 0x7F] if ascii_only else ranges


def exact_class_ranges(pattern: str, items: list) -> Ranges:
    """The code points of the parsed class `items` (from `pattern`) exactly as Python reads
    them, shorthands not narrowed. Raises ConstraintError for a class item it cannot spell."""
    return _Printer(pattern, "pattern", "", narrow=False).set_ranges(items)


def literal_regex(text: str) -> str:
    """A backend-dialect regex matching exactly ``text``."""
    return "".join(_char(ord(ch)) for ch in text)


def _char(cp: int) -> str:
    ch = chr(cp)
    if ch.isascii() and ch.isalnum():
        return ch
    return f"\\x{{{cp:x}}}"


def class_regex(ranges: Ranges) -> str:
    if not ranges:
        raise ConstraintError("a character class that matches nothing", keyword="regex")
    parts = [_char(lo) if lo == hi else f"{_char(lo)}-{_char(hi)}" for lo, hi in ranges]
    return "[" + "".join(parts) + "]"
