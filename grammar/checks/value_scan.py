"""The JSON text scan behind the checks at value boundaries (``value_checks``).

:func:`scan` follows the text byte by byte and knows, for every open value, its automaton state
(``value_sites``): it refuses the bytes that

* finish an integer where a number must not be one, or leave a number there that no
  continuation can make a fraction;
* close a string item that its array, whose items must not repeat, already holds (or leave a
  listed one only strings it holds);
* finish or settle an open item (``open_items``) as a value its array holds, or leave it only
  such values.

The judge reads numbers as Python floats (``jsonschema``: ``1.0000000000000001`` is the float
1.0, an integer), so a fraction here is written in plain decimal with at most
:data:`MAX_DIGITS` significant digits and at least one non-zero digit after the point: within
15 significant digits a decimal that is not an integer stays one as a float, and every such
decimal has that spelling. No dead end: a number is refused as soon as it has no room left for
a non-zero decimal (an integer part of 15 digits, or an exponent), and a site's number is never
bounded (``value_sites`` refuses that), so a digit or a point always continues it; a unique
array's items are open strings, listed strings or open items, so an item begun can always be
finished as a new one.
"""

from __future__ import annotations

import json
import re
from typing import NamedTuple

from corral.grammar.checks.distinct_keys import decode_string
from corral.grammar.checks.open_items import (
    Closed,
    canonical,
    number_alive,
    number_text_ok,
    tail_alive,
)
from corral.grammar.checks.value_sites import Sites

#: Most significant digits of a fraction at a site (the float judge's exact range).
MAX_DIGITS = 15
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
VALUE, KEY, STRING, NUMBER = range(4)
_NUMBER_BYTES = frozenset(b"0123456789.eE+-")
WHITESPACE = frozenset(b" \t\r\n")


def is_fraction(text: str) -> bool:
    """Whether a number's text, finished, is a fraction as a site wants one."""
    if any(c in text for c in "eE+"):
        return False
    whole, _, part = text.lstrip("-").partition(".")
    return _significant(whole, part) <= MAX_DIGITS and part.strip("0") != ""


def alive(text: str) -> bool:
    """Whether a number begun with ``text`` can still be finished as a fraction."""
    if any(c in text for c in "eE+"):
        return False
    whole, _, part = text.lstrip("-").partition(".")
    digits = _significant(whole, part)
    return digits <= MAX_DIGITS and (part.strip("0") != "" or digits < MAX_DIGITS)


def _significant(whole: str, part: str) -> int:
    return len((whole + part).lstrip("0"))


class Scan(NamedTuple):
    """Where the JSON text so far stands. Immutable: one per accepted token, for rollback.

    ``stack``: per open container, its automaton state, for an array the index of the item
    being written (-1 for an object), for an array whose items must not repeat, the items it
    holds (strings, or open items' canonical values; else None), and last, for an array of
    open items, the text of the item begun (bytes), True once it is finished, None before (for
    a closed object item, :data:`PENDING` or where its settling member's value ended).
    ``site``: the state of the next value. ``text``: a key's bytes, a checked number's text, or
    a checked string item's bytes (``checked``)."""

    stack: tuple[tuple[int, int, frozenset[str] | None, bytes | bool | None], ...] = ()
    mode: int = VALUE
    escaped: bool = False
    text: bytes = b""
    site: int = 0
    key_next: bool = False
    checked: bool = False


def scan(sites: Sites, state: Scan, data: bytes) -> Scan | None:
    """``state`` after ``data``; None when they finish an integer where a fraction is due, leave
    a number there that cannot become one, or finish an item its unique array holds (or leave
    one that can only be finished as such)."""
    stack, mode, escaped, text, site, key_next, checked = state
    for b in data:
        if mode == NUMBER:
            if b in _NUMBER_BYTES:
                if checked:
                    text += bytes((b,))
            else:
                if checked and not is_fraction(text.decode()):
                    return None
                mode, text = VALUE, b""
                stack = _ended(sites, stack)  # type: ignore[assignment]
                if stack is None:
                    return None
        if sites.has_opens and any(isinstance(e[3], bytes) for e in stack):
            stack = tuple(
                (at, i, held, item + bytes((b,)) if isinstance(item, bytes) else item)
                for at, i, held, item in stack
            )
        if mode == NUMBER:
            continue
        if mode in (KEY, STRING):
            if escaped:
                escaped = False
            elif b == _BACKSLASH:
                escaped = True
            elif b == _QUOTE:
                if mode == KEY:
                    name = decode_string(text)
                    site = sites.key(stack[-1][0], name)
                    closed = item_object(sites, stack)
                    if closed is not None and name == closed.last:  # its value settles the item
                        stack = (*stack[:-1], (*stack[-1][:3], PENDING))
                elif checked:  # a string item of an array whose items must not repeat
                    at, i, held, item = stack[-1]
                    value = decode_string(text)
                    if value in held:  # type: ignore[operator]
                        return None
                    stack = (*stack[:-1], (at, i, held | {value}, item))  # type: ignore[operator]
                else:
                    stack = _ended(sites, stack)  # type: ignore[assignment]
                    if stack is None:
                        return None
                mode, text = VALUE, b""
                continue
            if mode == KEY or checked:
                text += bytes((b,))
                if checked and not _listed_alive(sites, stack[-1], text):
                    return None
            continue
        if b in WHITESPACE or b == ord(":"):
            continue
        if _item_due(sites, stack, key_next) and b in _ITEM_STARTS:
            stack = (*stack[:-1], (*stack[-1][:3], bytes((b,))))
            if b in _LITERALS:  # true, false, null: settled by their first letter
                stack = _settle(stack, _LITERALS[b])
                if stack is None:
                    return None
        if b == _QUOTE:
            if key_next:
                mode, key_next = KEY, False
            else:
                mode = STRING
                checked = bool(stack) and stack[-1][2] is not None and not opens_here(sites, stack)
        elif b == ord("{"):
            stack, key_next = (*stack, (site, -1, None, None)), True
        elif b == ord("["):
            stack = (*stack, (site, 0, frozenset() if sites.unique[site] else None, None))
            site = sites.item(site, 0)
        elif b in b"}]":
            stack, key_next = stack[:-1], False
            stack = _ended(sites, stack)  # type: ignore[assignment]
            if stack is None:
                return None
        elif b == ord(","):
            if stack and stack[-1][1] >= 0:
                at, i, held, _ = stack[-1]
                if held is not None and not _listed_alive(sites, stack[-1], None):
                    return None  # every listed string is held: no further item can follow
                stack = (*stack[:-1], (at, i + 1, held, None))
                site = sites.item(at, i + 1)
            else:
                key_next = True
        elif b == ord("-") or 48 <= b <= 57:  # a number starts (letters: true, false, null)
            mode, checked = NUMBER, sites.fraction[site]
            text = bytes((b,)) if checked else b""
    if mode == NUMBER and checked and not alive(text.decode()):
        return None
    if sites.has_opens and not _open_alive(sites, stack, mode):
        return None
    return Scan(stack, mode, escaped, text, site, key_next, checked)


#: the first byte of an item, and the value a literal's first letter settles
_ITEM_STARTS = frozenset(b'"{[-0123456789tfn')
_LITERALS = {ord("t"): b"true", ord("f"): b"false", ord("n"): b"null"}


def opens_here(sites: Sites, stack: tuple) -> bool:
    """Whether the innermost container is an array of open items that must not repeat."""
    return bool(stack) and stack[-1][2] is not None and sites.opens[stack[-1][0]] is not None


def _item_due(sites: Sites, stack: tuple, key_next: bool) -> bool:
    """Whether the next value begins an item of such an array (none begun since its last
    ``[`` or comma)."""
    return not key_next and opens_here(sites, stack) and stack[-1][3] is None


def item_open(stack: tuple) -> bool:
    """Whether the innermost container's item is begun and not finished (its text is kept)."""
    return bool(stack) and isinstance(stack[-1][3], bytes)


def item_object(sites: Sites, stack: tuple) -> Closed | None:
    """When the innermost container is an item of an array of open items, and a closed object
    (``open_items.Closed``): how it is settled."""
    if len(stack) < 2 or stack[-1][1] != -1 or not item_open(stack[:-1]):
        return None
    opens = sites.opens[stack[-2][0]]
    return None if opens is None else opens.closed


def _ended(sites: Sites, stack: tuple) -> tuple | None:
    """The stack once the value being written ends: an open item is settled (None: its array
    holds it), and the last open member of a closed object item leaves only its tail."""
    if item_open(stack):
        return _settle(stack, stack[-1][3])
    closed = item_object(sites, stack)
    if closed is None or stack[-1][3] != PENDING:
        return stack
    at, i, held, item = stack[-2]
    if not tail_alive(item, b"", closed, held):
        return None
    return (*stack[:-1], (*stack[-1][:3], len(item)))


def _open_alive(sites: Sites, stack: tuple, mode: int) -> bool:
    """Whether the open item being written can still be finished as one its array lacks: a
    number item (or the number that is a closed object's last open member), or the tail of
    a closed object item."""
    if mode == NUMBER and item_open(stack):
        at, _, held, item = stack[-1]
        number, opens = item.decode(), sites.opens[at]
        return number_text_ok(number, opens) and number_alive(
            number, opens, lambda t: canonical(t.encode()) in held, len(held)
        )
    closed = item_object(sites, stack)
    if closed is None or stack[-1][3] is None:
        return True
    _, _, held, item = stack[-2]
    slot = stack[-1][3]
    if slot != PENDING:
        return tail_alive(item[:slot], item[slot:], closed, held)
    if mode != NUMBER:
        return True
    found = NUMBER_END.search(item)
    head, number = item[: found.start()], found.group().decode()  # type: ignore[union-attr]
    return number_text_ok(number, closed.value) and number_alive(
        number,
        closed.value,
        lambda t: not tail_alive(head + t.encode(), b"", closed, held),
        len(held),
    )


def string_start(text: bytes) -> int:
    """Where the string ``text`` ends inside begins: its last quote that no backslash escapes."""
    i = len(text) - 1
    while True:
        i = text.rindex(b'"', 0, i + 1)
        slashes = len(text[:i]) - len(text[:i].rstrip(b"\\"))
        if slashes % 2 == 0:
            return i
        i -= 1


def held_string(held: str, closed: Closed | None) -> str | None:
    """The string a held item (canonical text) has where a settling string is written: the
    item itself, or its closed object's last open member; None where it has none."""
    value = json.loads(held)
    if closed is not None:
        value = value.get(closed.last) if isinstance(value, dict) else None
    return value if isinstance(value, str) else None


#: an object's slot while its member that settles it is being written (else None, then the
#: offset in the item's text where that member's value ended)
PENDING = -1
NUMBER_END = re.compile(rb"[-+.eE0-9]+$")


def _settle(stack: tuple, item: bytes) -> tuple | None:
    """The stack with the innermost array's item finished as ``item``'s value; None when the
    array holds that value already."""
    at, i, held, _ = stack[-1]
    value = canonical(item)
    if value in held:
        return None
    return (*stack[:-1], (at, i, held | {value}, True))


def _listed_alive(sites: Sites, top: tuple, typed: bytes | None) -> bool:
    """For an array whose items are listed strings: whether one it does not hold is spelt
    from ``typed`` (the item's bytes so far; None: a new item). True for open strings."""
    listed = sites.listed[top[0]]
    return listed is None or listed.any_left(top[2], typed)
