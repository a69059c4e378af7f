"""One open value of a partial JSON instance (`partial_json`): its frame, and how it may finish.

`finish_leaf` writes the shortest rest of an open string or scalar that a branch allows;
`holds` says whether a finished value may be valid under a branch; `admits_type` whether a
branch may describe a value that starts as this one does. Strings are finished with their
escapes: a half-written escape becomes one character, a high surrogate gets a low one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from corral.grammar.backends.quirks import listed_number_text
from corral.grammar.checks.value_sites import FRACTION
from corral.grammar.closing.shortest import (
    JsonCloser,
    Schema,
    complete_string,
    fresh_suffix,
    implied_types,
    json_kind,
    listed_values,
    number_ok,
    search_pattern,
)
from corral.grammar.closing.strings import Patterns

LITERALS = ("true", "false", "null")
HIGH_SURROGATE = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}")  # the escape of a high surrogate


@dataclass
class Frame:
    """One open value. `kind`: top, object, array, string, key, scalar. `state` (containers):
    what comes next; `text`: a string's or scalar's characters so far; `keys`: properties
    present; `count`: items so far; `key`: the property whose value is being written;
    `parents[i]`: the indices of the enclosing frame's branches that `schemas[i]` came from."""

    kind: str
    schemas: list[Schema]
    pointer: str
    parents: list[frozenset[int]] = field(default_factory=list)
    state: str = "value"
    text: str = ""
    escape: str = ""  # an unfinished escape sequence inside a string
    keys: tuple[str, ...] = ()
    count: int = 0
    key: str = ""
    #: an array's string items so far (decoded) and its other items (``open_items.canonical``),
    #: which items that must not repeat avoid
    held: tuple[str, ...] = ()
    start: int = 0  # where the value begins in the text


def finish_leaf(
    f: Frame, node: Schema, closer: JsonCloser, held: tuple[str, ...] = ()
) -> str | None:
    """The rest of an open string (closing quote included) or scalar, valid under `node`; a
    string is not finished as one of `held` (an item its array already holds, where items
    must not repeat: such items are open strings, so appending keeps them valid)."""
    if f.kind == "string":
        finished = finish_string(f, node, closer.patterns, held)
        return None if finished is None else finished[0]
    if f.kind == "scalar":
        for lit in LITERALS:
            if lit.startswith(f.text):
                return lit[len(f.text) :] if number_ok(node, json.loads(lit)) else None
        listed = _listed_numbers(node, f.text)
        if listed is not None:
            return listed
        base = "0" if f.text[-1] in "-+eE." else ""
        grow = not any(ch in f.text for ch in ".eE")  # digits may still be appended
        rests = [base + "0" * k for k in range(4 if grow else 1)]
        if isinstance(node, dict) and FRACTION in node:  # an integer so far: add a decimal
            rests += [base + ".5", base + "5"]
        for rest in rests:
            try:
                value = json.loads(f.text + rest)
            except ValueError:
                continue
            if number_ok(node, value):
                return rest
        return None
    return None


def finish_string(
    f: Frame, node: Schema, patterns: Patterns, held: tuple[str, ...] = ()
) -> tuple[str, str] | None:
    """The rest of open string `f` (closing quote included) under `node` (its `pattern` read
    through the closer's `patterns`), and the string it makes (not one of `held`); None when
    there is none."""
    if isinstance(node, dict) and ("const" in node or "enum" in node):
        return _finish_listed(f, listed_values(node), held)  # type: ignore[arg-type]
    head, text = "", f.text
    if f.escape:
        head = finish_escape(f.escape)
        if head is None:
            return None
        text += json.loads('"' + f.escape + head + '"')
    if not isinstance(node, dict):
        return None if node is False else (head + '"', text)
    rest = complete_string(node, text, patterns)
    if rest is None:
        return None
    if text + rest in held:
        rest += fresh_suffix(text + rest, held)
    return head + json.dumps(rest, ensure_ascii=False)[1:], text + rest


def _listed_numbers(node: Schema, typed: str) -> str | None:
    """For a number `enum`/`const`: the shortest rest of a listed number spelt from `typed`, as
    the backend spells it (``quirks.listed_number_text``: 1.0 as 1, 1e20 in plain decimal);
    None when none is listed."""
    values = listed_values(node)
    if values is None:
        return None
    spellings = (
        listed_number_text(v)
        for v in values
        if isinstance(v, int | float) and not isinstance(v, bool)
    )
    rests = [s[len(typed) :] for s in spellings if s.startswith(typed)]
    return min(rests, key=len, default=None)


def _finish_listed(f: Frame, values: list, held: tuple[str, ...]) -> tuple[str, str] | None:
    """`finish_string` for a listed string: the shortest value not in `held` that the text so
    far spells, its half-written escape included, as the backend spells it."""
    best = None
    for v in values:
        if not isinstance(v, str) or v in held or not v.startswith(f.text):
            continue
        spelt = json.dumps(v[len(f.text) :], ensure_ascii=False)[1:]  # with the closing quote
        if spelt.startswith(f.escape) and (best is None or len(spelt) < len(best[0])):
            best = (spelt[len(f.escape) :], v)
    return best


def holds(f: Frame, node: Schema, patterns: Patterns) -> bool:
    """Whether the complete value of frame `f` may be valid under branch `node` (its type was
    checked when it opened; keywords not looked at here count as satisfied)."""
    if not isinstance(node, dict):
        return node is not False
    if f.kind == "scalar":
        try:
            return number_ok(node, json.loads(f.text))
        except ValueError:
            return False
    if f.kind == "string":
        if "const" in node or "enum" in node:
            return f.text in ([node["const"]] if "const" in node else node["enum"])
        if not node.get("minLength", 0) <= len(f.text) <= node.get("maxLength", len(f.text)):
            return False
        if "pattern" in node:  # the judge's own reading (the closer's schema is its dialect)
            return search_pattern(node["pattern"], f.text)
        return complete_string(node, f.text, patterns) in (None, "")
    n = len(f.keys) if f.kind == "object" else f.count
    if f.kind == "object" and not set(node.get("required", ())) <= set(f.keys):
        return False
    kind = "Properties" if f.kind == "object" else "Items"
    return node.get("min" + kind, 0) <= n <= node.get("max" + kind, n)


def admits_type(node: Schema, kind: str) -> bool:
    """Whether `node` may describe a value starting with a character of `kind`."""
    if not isinstance(node, dict):
        return node is True
    if "const" in node or "enum" in node:
        values = [node["const"]] if "const" in node else node["enum"]
        return any(json_kind(v) in (kind, "null" if kind != "string" else "") for v in values)
    types = node.get("type") or implied_types(node)
    types = {types} if isinstance(types, str) else set(types)
    if kind == "number":
        return bool(types & {"number", "integer", "null"})
    return kind in types or (kind == "boolean" and "null" in types)


def pointer_escape(key: str) -> str:
    """`key` as one JSON-pointer segment."""
    return key.replace("~", "~0").replace("/", "~1")


def finish_escape(e: str) -> str | None:
    """The shortest rest of the escape sequence `e` that makes it one character (a high
    surrogate gets a low one after it)."""
    if e == "\\":
        return "n"
    if len(e) < 6:
        head = "0" * (6 - len(e))
        return (
            head + "\\udc00"
            if HIGH_SURROGATE.fullmatch(e + head)
            else head
            if lone_char(e + head)
            else None
        )
    low = "\\udc00"
    head = low[len(e) - 6 :] if low.startswith(e[6:]) else "0" * (12 - len(e))
    return head if lone_char(e + head) else None


def lone_char(escape: str) -> bool:
    """Whether a complete escape sequence decodes to a character JSON text may hold alone."""
    try:
        ch = json.loads('"' + escape + '"')
    except ValueError:
        return False
    return not 0xD800 <= ord(ch) <= 0xDFFF
