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

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from corral.grammar.distinct_keys import TokenIndex, decode_prefix, decode_string, token_index
from corral.grammar.matcher import Matcher
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
    being written (-1 for an object), and for an array whose items must not repeat, the string
    items it holds (else None). ``site``: the state of the next value. ``text``: a key's bytes,
    a checked number's text, or a checked string item's bytes (``checked``)."""

    stack: tuple[tuple[int, int, frozenset[str] | None], ...] = ()
    mode: int = _VALUE
    escaped: bool = False
    text: bytes = b""
    site: int = 0
    key_next: bool = False
    checked: bool = False


def scan(sites: Sites, state: Scan, data: bytes) -> Scan | None:
    """``state`` after ``data``; None when they finish an integer where a fraction is due, leave
    a number there that cannot become one, or finish a string item its unique array holds."""
    stack, mode, escaped, text, site, key_next, checked = state
    for b in data:
        if mode == _NUMBER:
            if b in _NUMBER_BYTES:
                if checked:
                    text += bytes((b,))
                continue
            if checked and not is_fraction(text.decode()):
                return None
            mode, text = _VALUE, b""
        if mode in (_KEY, _STRING):
            if escaped:
                escaped = False
            elif b == _BACKSLASH:
                escaped = True
            elif b == _QUOTE:
                if mode == _KEY:
                    site = sites.key(stack[-1][0], decode_string(text))
                elif checked:  # an item of an array whose items must not repeat
                    at, i, held = stack[-1]
                    item = decode_string(text)
                    if item in held:  # type: ignore[operator]
                        return None
                    stack = (*stack[:-1], (at, i, held | {item}))  # type: ignore[operator]
                mode, text = _VALUE, b""
                continue
            if mode == _KEY or checked:
                text += bytes((b,))
                if checked and not _listed_alive(sites, stack[-1], text):
                    return None
            continue
        if b in _WHITESPACE or b == ord(":"):
            continue
        if b == _QUOTE:
            if key_next:
                mode, key_next = _KEY, False
            else:
                mode, checked = _STRING, bool(stack) and stack[-1][2] is not None
        elif b == ord("{"):
            stack, key_next = (*stack, (site, -1, None)), True
        elif b == ord("["):
            stack = (*stack, (site, 0, frozenset() if sites.unique[site] else None))
            site = sites.item(site, 0)
        elif b in b"}]":
            stack, key_next = stack[:-1], False
        elif b == ord(","):
            if stack and stack[-1][1] >= 0:
                at, i, held = stack[-1]
                if held is not None and not _listed_alive(sites, stack[-1], None):
                    return None  # every listed string is held: no further item can follow
                stack = (*stack[:-1], (at, i + 1, held))
                site = sites.item(at, i + 1)
            else:
                key_next = True
        elif b == ord("-") or 48 <= b <= 57:  # a number starts (letters: true, false, null)
            mode, checked = _NUMBER, sites.fraction[site]
            text = bytes((b,)) if checked else b""
    if mode == _NUMBER and checked and not alive(text.decode()):
        return None
    return Scan(stack, mode, escaped, text, site, key_next, checked)


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


@lru_cache(maxsize=4)
def _index(tok: TokenizerInfo) -> _Index:
    keys = token_index(tok)
    digit = np.array([any(48 <= c <= 57 for c in t) for t in keys.bytes])
    quote = np.array([b'"' in t for t in keys.bytes])
    comma = np.array([b"," in t for t in keys.bytes])
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
    )


class ValueChecksMatcher(ScanningMatcher):
    """A backend matcher whose numbers are never integers where fractions are due, and whose
    arrays never repeat a string item where items must be distinct (``scanning``)."""

    __slots__ = ("_sites", "_index", "_kinds")

    def __init__(self, inner: Matcher, sites: Sites, tok: TokenizerInfo, eos: frozenset[int]):
        index = _index(tok)
        super().__init__(inner, eos, index.bytes, Scan())
        self._sites, self._index = sites, index
        self._kinds = (any(sites.fraction), any(sites.unique))

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
        before it), or two quotes to open and close one."""
        if state.mode == _NUMBER and state.checked:
            allowed = np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))
            return allowed[allowed < len(self._index.bytes)]
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
        index, (at, _, held) = self._index, state.stack[-1]
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
