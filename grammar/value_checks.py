"""Values checked at value boundaries, at the sites ``value_sites`` finds.

:class:`ValueChecksMatcher` wraps a backend matcher, follows the JSON text token by token
(:func:`scan`, which knows the automaton state of every open value) and takes out of the mask,
out of ``accept`` and out of the forced continuation every token that would

* finish an integer where a number must not be one, or leave a number there that no
  continuation can make a fraction;
* close a string item that its array, whose items must not repeat, already holds.

The judge reads numbers as Python floats (``jsonschema``: ``1.0000000000000001`` is the float
1.0, an integer), so a fraction here is written in plain decimal with at most
:data:`MAX_DIGITS` significant digits and at least one non-zero digit after the point: within
15 significant digits a decimal that is not an integer stays one as a float, and every such
decimal has that spelling. No dead end: a number is refused as soon as it has no room left for
a non-zero decimal (an integer part of 15 digits, or an exponent), and a site's number is never
bounded (``value_sites`` refuses that), so a digit or a point always continues it; a unique
array's items are open strings, so an item begun can always be finished as a new one.

Cost: only tokens that can finish a checked value are scanned: inside a checked number, those
the backend allows there; elsewhere, tokens with a digit (inside a string: a digit and a
quote), and for string items the tokens that would close one as an item held (``distinct_keys``'
index of tokens by the text before their quote), or open and close one.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from corral.grammar.distinct_keys import TokenIndex, decode_prefix, decode_string, token_index
from corral.grammar.matcher import Matcher
from corral.grammar.open_items import (
    Closed,
    canonical,
    number_alive,
    number_text_ok,
    tail_alive,
)
from corral.grammar.scanning import ScanningMatcher
from corral.grammar.tokenizer import TokenizerInfo
from corral.grammar.value_sites import Sites

#: Most significant digits of a fraction at a site (the float judge's exact range).
MAX_DIGITS = 15
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_VALUE, _KEY, _STRING, _NUMBER = range(4)
_NUMBER_BYTES = frozenset(b"0123456789.eE+-")
_WHITESPACE = frozenset(b" \t\r\n")


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
    holds (strings, or open items' canonical values; else None), and for an array of open
    items, the text of the item begun (bytes), True once it is finished, None before. ``site``: the state of the next value. ``text``: a key's bytes,
    a checked number's text, or a checked string item's bytes (``checked``)."""

    stack: tuple[tuple[int, int, frozenset[str] | None, bytes | bool | None], ...] = ()
    mode: int = _VALUE
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
        if mode == _NUMBER:
            if b in _NUMBER_BYTES:
                if checked:
                    text += bytes((b,))
            else:
                if checked and not is_fraction(text.decode()):
                    return None
                mode, text = _VALUE, b""
                stack = _ended(sites, stack)  # type: ignore[assignment]
                if stack is None:
                    return None
        if any(isinstance(e[3], bytes) for e in stack):
            stack = tuple(
                (at, i, held, item + bytes((b,)) if isinstance(item, bytes) else item)
                for at, i, held, item in stack
            )
        if mode == _NUMBER:
            continue
        if mode in (_KEY, _STRING):
            if escaped:
                escaped = False
            elif b == _BACKSLASH:
                escaped = True
            elif b == _QUOTE:
                if mode == _KEY:
                    name = decode_string(text)
                    site = sites.key(stack[-1][0], name)
                    closed = _item_object(sites, stack)
                    if closed is not None and name == closed.last:  # its value settles the item
                        stack = (*stack[:-1], (*stack[-1][:3], _PENDING))
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
                mode, text = _VALUE, b""
                continue
            if mode == _KEY or checked:
                text += bytes((b,))
                if checked and not _listed_alive(sites, stack[-1], text):
                    return None
            continue
        if b in _WHITESPACE or b == ord(":"):
            continue
        if _item_due(sites, stack, key_next) and b in _ITEM_STARTS:
            stack = (*stack[:-1], (*stack[-1][:3], bytes((b,))))
            if b in _LITERALS:  # true, false, null: settled by their first letter
                stack = _settle(stack, _LITERALS[b])
                if stack is None:
                    return None
        if b == _QUOTE:
            if key_next:
                mode, key_next = _KEY, False
            else:
                mode = _STRING
                checked = bool(stack) and stack[-1][2] is not None and not _opens(sites, stack)
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
            mode, checked = _NUMBER, sites.fraction[site]
            text = bytes((b,)) if checked else b""
    if mode == _NUMBER and checked and not alive(text.decode()):
        return None
    if not _open_alive(sites, stack, mode):
        return None
    return Scan(stack, mode, escaped, text, site, key_next, checked)


#: the first byte of an item, and the value a literal's first letter settles
_ITEM_STARTS = frozenset(b'"{[-0123456789tfn')
_LITERALS = {ord("t"): b"true", ord("f"): b"false", ord("n"): b"null"}


def _opens(sites: Sites, stack: tuple) -> bool:
    """Whether the innermost container is an array of open items that must not repeat."""
    return bool(stack) and stack[-1][2] is not None and sites.opens[stack[-1][0]] is not None


def _item_due(sites: Sites, stack: tuple, key_next: bool) -> bool:
    """Whether the next value begins an item of such an array (none begun since its last
    ``[`` or comma)."""
    return not key_next and _opens(sites, stack) and stack[-1][3] is None


def _item_open(stack: tuple) -> bool:
    """Whether the innermost container's item is begun and not finished (its text is kept)."""
    return bool(stack) and isinstance(stack[-1][3], bytes)


def _item_object(sites: Sites, stack: tuple) -> Closed | None:
    """When the innermost container is an item of an array of open items, and a closed object
    (``open_items.Closed``): how it is settled."""
    if len(stack) < 2 or stack[-1][1] != -1 or not _item_open(stack[:-1]):
        return None
    opens = sites.opens[stack[-2][0]]
    return None if opens is None else opens.closed


def _ended(sites: Sites, stack: tuple) -> tuple | None:
    """The stack once the value being written ends: an open item is settled (None: its array
    holds it), and the last open member of a closed object item leaves only its tail."""
    if _item_open(stack):
        return _settle(stack, stack[-1][3])
    closed = _item_object(sites, stack)
    if closed is None or stack[-1][3] != _PENDING:
        return stack
    at, i, held, item = stack[-2]
    if not tail_alive(item, b"", closed, held):
        return None
    return (*stack[:-1], (*stack[-1][:3], len(item)))


def _open_alive(sites: Sites, stack: tuple, mode: int) -> bool:
    """Whether the open item being written can still be finished as one its array lacks: a
    number item (or the number that is a closed object's last open member), or the tail of
    a closed object item."""
    if mode == _NUMBER and _item_open(stack):
        at, _, held, item = stack[-1]
        number, opens = item.decode(), sites.opens[at]
        return number_text_ok(number, opens) and number_alive(
            number, opens, lambda t: canonical(t.encode()) in held, len(held)
        )
    closed = _item_object(sites, stack)
    if closed is None or stack[-1][3] is None:
        return True
    _, _, held, item = stack[-2]
    slot = stack[-1][3]
    if slot != _PENDING:
        return tail_alive(item[:slot], item[slot:], closed, held)
    if mode != _NUMBER:
        return True
    found = _NUMBER_END.search(item)
    head, number = item[: found.start()], found.group().decode()  # type: ignore[union-attr]
    return number_text_ok(number, closed.value) and number_alive(
        number,
        closed.value,
        lambda t: not tail_alive(head + t.encode(), b"", closed, held),
        len(held),
    )


def _string_start(text: bytes) -> int:
    """Where the string ``text`` ends inside begins: its last quote that no backslash escapes."""
    i = len(text) - 1
    while True:
        i = text.rindex(b'"', 0, i + 1)
        slashes = len(text[:i]) - len(text[:i].rstrip(b"\\"))
        if slashes % 2 == 0:
            return i
        i -= 1


def _held_string(held: str, closed: Closed | None) -> str | None:
    """The string a held item (canonical text) has where a settling string is written: the
    item itself, or its closed object's last open member; None where it has none."""
    value = json.loads(held)
    if closed is not None:
        value = value.get(closed.last) if isinstance(value, dict) else None
    return value if isinstance(value, str) else None


#: an object's slot while its member that settles it is being written (else None, then the
#: offset in the item's text where that member's value ended)
_PENDING = -1
_NUMBER_END = re.compile(rb"[-+.eE0-9]+$")


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


class _Index(NamedTuple):
    bytes: list[bytes]
    digits: np.ndarray  # tokens with a digit
    quoted: np.ndarray  # tokens with a digit and a quote
    keys: TokenIndex  # tokens by the quotes they hold and the text before one (``distinct_keys``)
    starts: dict[bytes, np.ndarray]  # tokens by their first byte, and by their first two bytes
    commas: np.ndarray  # tokens with a comma
    quote_commas: np.ndarray  # tokens with a quote and a comma (they may end an item and go on)
    closers: np.ndarray  # tokens with a `}` or a `]`
    exits: np.ndarray  # tokens with a quote followed by a bracket, colon, comma or quote
    leads: np.ndarray  # tokens that may begin a number or a literal that could be settled
    runs: np.ndarray  # tokens of digits only, the first not 0 (they only grow an integer)
    zero_runs: np.ndarray  # tokens of digits only, the first 0


@lru_cache(maxsize=4)
def _index(tok: TokenizerInfo) -> _Index:
    keys = token_index(tok)
    digit = np.array([any(48 <= c <= 57 for c in t) for t in keys.bytes])
    quote = np.array([b'"' in t for t in keys.bytes])
    comma = np.array([b"," in t for t in keys.bytes])
    closer = np.array([b"}" in t or b"]" in t for t in keys.bytes])
    exit_ = np.array([_exits(t) for t in keys.bytes])
    lead = np.array([_lead(t.lstrip(b" \t\r\n")) for t in keys.bytes])
    run = np.array([t.isdigit() and t[:1] != b"0" for t in keys.bytes])
    zero_run = np.array([t.isdigit() and t[:1] == b"0" for t in keys.bytes])
    starts: dict[bytes, list[int]] = {}
    for i, t in enumerate(keys.bytes):
        for head in {t[:1], t[:2]} - {b""}:
            starts.setdefault(head, []).append(i)
    return _Index(
        keys.bytes,
        np.flatnonzero(digit),
        np.flatnonzero(digit & quote),
        keys,
        {k: np.asarray(v, dtype=np.int64) for k, v in starts.items()},
        np.flatnonzero(comma),
        np.flatnonzero(comma & quote),
        np.flatnonzero(closer),
        np.flatnonzero(exit_),
        np.flatnonzero(lead),
        np.flatnonzero(run),
        np.flatnonzero(zero_run),
    )


def _lead(token: bytes) -> bool:
    """Whether ``token`` (past whitespace) begins a literal or a number that it may settle: a
    number of digits only, begun with 1 to 9, can always grow into another integer."""
    return token[:1] in (b"-", b"0", b"t", b"f", b"n") or (
        token[:1].isdigit() and not token.isdigit()
    )


def _exits(token: bytes) -> bool:
    quote = token.find(b'"')
    return quote >= 0 and any(c in token[quote + 1 :] for c in b'}]:,"')


class ValueChecksMatcher(ScanningMatcher):
    """A backend matcher whose numbers are never integers where fractions are due, and whose
    arrays never repeat a string item where items must be distinct (``scanning``)."""

    __slots__ = ("_sites", "_index", "_kinds", "_opened")

    def __init__(self, inner: Matcher, sites: Sites, tok: TokenizerInfo, eos: frozenset[int]):
        index = _index(tok)
        super().__init__(inner, eos, index.bytes, Scan())
        self._sites, self._index = sites, index
        self._kinds = (any(sites.fraction), any(sites.unique))
        self._opened = any(o is not None for o in sites.opens)

    def _scan(self, state: Scan, data: bytes) -> Scan | None:
        return scan(self._sites, state, data)

    def _finished(self, state: Scan) -> bool:
        """Whether the text may end here (a number at a site must be a fraction)."""
        return not (
            state.mode == _NUMBER and state.checked and not is_fraction(state.text.decode())
        )

    def _candidates(self, state: Scan, words: np.ndarray) -> np.ndarray:
        """The tokens that could finish a checked value from ``state`` (a superset): inside a
        checked number, every token the backend allows; else a number needs a digit, and a
        string item the quote that closes it (to repeat one it holds, exactly that item's rest
        before it), or two quotes to open and close one; within an array of open items, those
        of :meth:`_open_candidates` too."""
        found = self._checked_candidates(state, words)
        if self._opened and any(
            _opens(self._sites, state.stack[: d + 1]) for d in range(len(state.stack))
        ):
            found = np.union1d(found, self._open_candidates(state, words))
        return found

    def _open_candidates(self, state: Scan, words: np.ndarray) -> np.ndarray:
        """Within an array of open items, the tokens that could finish or settle an item: in a
        number item, or a closed object item's settling number or tail, every token the backend
        allows; in a string item or a settling string, those that close it as a value held
        (:meth:`_settling_closings`, or go on past the quote); in another string, those that leave it and go on to a
        bracket, colon, comma or quote; else those that close a container, and where an item
        or a settling member may begin, those with a comma, those that begin a number or a
        literal and those with two quotes (which open and close a string)."""
        stack, sites, index = state.stack, self._sites, self._index
        closed = _item_object(sites, stack)
        slot = stack[-1][3] if closed is not None else None
        settling = _item_open(stack) or slot == _PENDING
        if slot not in (None, _PENDING):
            return self._allowed(words)
        if state.mode == _NUMBER and settling:
            allowed = self._allowed(words)
            item = stack[-1][3] if closed is None else stack[-2][3]
            number = _NUMBER_END.search(item).group()  # type: ignore[union-attr]
            if b"." in number:  # a digit may reach the most digits a number item may have
                return allowed
            safe = index.runs if number == b"-" else np.union1d(index.runs, index.zero_runs)
            return np.setdiff1d(allowed, safe, assume_unique=True)
        if state.mode == _STRING and settling:
            return self._settling_closings(state, closed)
        if state.mode in (_KEY, _STRING):
            return index.exits
        parts = [index.closers]
        if _opens(sites, stack) or slot == _PENDING:
            parts += [index.commas, index.leads, index.keys.two.ids]
        return np.concatenate(parts)

    def _settling_closings(self, state: Scan, closed: Closed | None) -> np.ndarray:
        """In a string that settles an item (the item, or a closed object item's last open
        member): the tokens that close it as a string some held item has there, and those whose
        bytes before their quote are no plain string body (``distinct_keys``' index)."""
        keys = self._index.keys
        if closed is None:
            held, item = state.stack[-1][2], state.stack[-1][3]
        else:
            held, item = state.stack[-2][2], state.stack[-2][3]
        typed = decode_prefix(item[_string_start(item) + 1 :])
        if typed is None:  # inside an escape or a UTF-8 sequence: check every closing token
            return keys.one.ids
        strings = (_held_string(h, closed) for h in held)
        rests = [v[len(typed) :] for v in strings if v is not None and v.startswith(typed)]
        hits = [np.asarray(keys.closing.get(r, ()), dtype=np.int64) for r in rests]
        return np.concatenate([keys.key_extra.ids, self._index.exits, *hits])

    def _allowed(self, words: np.ndarray) -> np.ndarray:
        allowed = np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))
        return allowed[allowed < len(self._index.bytes)]

    def _checked_candidates(self, state: Scan, words: np.ndarray) -> np.ndarray:
        if state.mode == _NUMBER and state.checked:
            return self._allowed(words)
        if self._in_listed(state):
            ids = self._listed_candidates(state)
            ids = ids[(words[ids >> 5] & (np.uint32(1) << (ids & 31).astype(np.uint32))) != 0]
            return np.unique(ids)
        fraction, unique = self._kinds
        index, keys = self._index, self._index.keys
        in_string = state.mode in (_KEY, _STRING)
        parts = [index.quoted if in_string else index.digits] if fraction else []
        if unique:
            if state.mode == _STRING and state.checked:
                parts.append(self._closing(state))
            else:
                parts.append(keys.three.ids if in_string else keys.two.ids)
        return np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)

    def _in_listed(self, state: Scan) -> bool:
        """Directly inside an array whose items are listed strings, or one of its items."""
        top = state.stack[-1] if state.stack else None
        return top is not None and top[2] is not None and self._sites.listed[top[0]] is not None

    def _listed_candidates(self, state: Scan) -> np.ndarray:
        """Inside an array of listed strings, the tokens that may spell toward only strings it
        holds, or add an item when it holds them all (a superset): those that go on toward a
        held string (its next byte, or the quote that ends it), that open an item, that end
        one and go on, that have a comma once at most one string is left, and those that
        begin or continue an escape (the backend also takes spellings such as `\\u000a`,
        which the check refuses: only the listed spellings lead to a listed string)."""
        index, (at, _, held, _) = self._index, state.stack[-1]
        listed = self._sites.listed[at]
        parts = [index.quote_commas]
        if len(held) + 1 >= len(listed.spelling):  # type: ignore[union-attr, arg-type]
            parts.append(index.commas)
        inside = state.mode == _STRING and state.checked
        if inside and b"\\" in state.text[-6:]:  # within an escape: the backend may take other
            return np.arange(len(index.bytes))  # spellings (`\\u000a`) than the listed ones
        heads = {b"\\"} if inside else {b'"\\'}  # an escape may be spelt otherwise
        for h in held:  # type: ignore[union-attr]
            spelt = listed.spelling[h] + b'"'  # type: ignore[union-attr]
            if not inside:  # an item opened by the token, then spelt toward `h`
                heads.add(b'"' + spelt[:1])
            elif spelt.startswith(state.text):
                heads.add(spelt[len(state.text) : len(state.text) + 1])
        if held and not inside:
            heads.update(bytes((w,)) for w in _WHITESPACE)
        empty = np.zeros(0, dtype=np.int64)
        parts += [index.starts.get(head, empty) for head in heads]
        return np.concatenate(parts)

    def _closing(self, state: Scan) -> np.ndarray:
        """Inside a string item: the tokens that close it as one its array holds, or that close
        it and write another item (three quotes, or bytes that are no plain string body)."""
        keys, held = self._index.keys, state.stack[-1][2] or ()
        typed = decode_prefix(state.text)
        if typed is None:  # inside an escape or a UTF-8 sequence: check every closing token
            return keys.one.ids
        rests = [h[len(typed) :] for h in held if h.startswith(typed)]
        hits = [np.asarray(keys.closing.get(r, ()), dtype=np.int64) for r in rests]
        return np.concatenate([keys.key_extra.ids, *hits])
