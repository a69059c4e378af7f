"""The checks at value boundaries as a matcher: the mask, at the sites ``value_sites`` finds.

:class:`ValueChecksMatcher` wraps a backend matcher, follows the JSON text token by token
(``value_scan.scan``, which knows the automaton state of every open value) and takes out of the
mask, out of ``accept`` and out of the forced continuation every token the scan refuses: an
integer where a fraction is due, an item its unique array holds (``value_scan`` says which).

Cost: only tokens that can finish a checked value are scanned: inside a checked number, those
the backend allows there; elsewhere, tokens with a digit (inside a string: a digit and a
quote), and for string items the tokens that would close one as an item held (``distinct_keys``'
index of tokens by the text before their quote), or open and close one; within an array of open
items, those that could finish or settle one (:meth:`ValueChecksMatcher._open_candidates`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from corral.grammar.checks.distinct_keys import TokenIndex, decode_prefix, token_index
from corral.grammar.checks.open_items import Closed
from corral.grammar.checks.scanning import ScanningMatcher
from corral.grammar.checks.value_scan import (
    KEY,
    NUMBER,
    NUMBER_END,
    PENDING,
    STRING,
    WHITESPACE,
    Scan,
    held_string,
    is_fraction,
    item_object,
    item_open,
    opens_here,
    scan,
    string_start,
)
from corral.grammar.checks.value_sites import Sites
from corral.grammar.core.matcher import Matcher
from corral.grammar.core.tokenizer import TokenizerInfo


class _Index(NamedTuple):
    bytes: tuple[bytes, ...]  # ``TokenizerInfo.token_bytes``
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


def _index(tok: TokenizerInfo) -> _Index:
    """Built once per tokenizer and kept by it (``TokenizerInfo.derived``)."""
    return tok.derived(_build_index)


def _build_index(tok: TokenizerInfo) -> _Index:
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
        self._opened = sites.has_opens

    def _scan(self, state: Scan, data: bytes) -> Scan | None:
        return scan(self._sites, state, data)

    def _finished(self, state: Scan) -> bool:
        """Whether the text may end here (a number at a site must be a fraction)."""
        return not (state.mode == NUMBER and state.checked and not is_fraction(state.text.decode()))

    def _candidates(self, state: Scan, words: np.ndarray) -> np.ndarray:
        """The tokens that could finish a checked value from ``state`` (a superset): inside a
        checked number, every token the backend allows; else a number needs a digit, and a
        string item the quote that closes it (to repeat one it holds, exactly that item's rest
        before it), or two quotes to open and close one; within an array of open items, those
        of :meth:`_open_candidates` too."""
        found = self._checked_candidates(state, words)
        if self._opened and any(
            opens_here(self._sites, state.stack[: d + 1]) for d in range(len(state.stack))
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
        closed = item_object(sites, stack)
        slot = stack[-1][3] if closed is not None else None
        settling = item_open(stack) or slot == PENDING
        if slot not in (None, PENDING):
            return self._allowed(words)
        if state.mode == NUMBER and settling:
            allowed = self._allowed(words)
            item = stack[-1][3] if closed is None else stack[-2][3]
            number = NUMBER_END.search(item).group()  # type: ignore[union-attr]
            if b"." in number:  # a digit may reach the most digits a number item may have
                return allowed
            safe = index.runs if number == b"-" else np.union1d(index.runs, index.zero_runs)
            return np.setdiff1d(allowed, safe, assume_unique=True)
        if state.mode == STRING and settling:
            return self._settling_closings(state, closed)
        if state.mode in (KEY, STRING):
            return index.exits
        parts = [index.closers]
        if opens_here(sites, stack) or slot == PENDING:
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
        typed = decode_prefix(item[string_start(item) + 1 :])
        if typed is None:  # inside an escape or a UTF-8 sequence: check every closing token
            return keys.one.ids
        strings = (held_string(h, closed) for h in held)
        rests = [v[len(typed) :] for v in strings if v is not None and v.startswith(typed)]
        hits = [np.asarray(keys.closing.get(r, ()), dtype=np.int64) for r in rests]
        return np.concatenate([keys.key_extra.ids, self._index.exits, *hits])

    def _allowed(self, words: np.ndarray) -> np.ndarray:
        allowed = np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))
        return allowed[allowed < len(self._index.bytes)]

    def _checked_candidates(self, state: Scan, words: np.ndarray) -> np.ndarray:
        if state.mode == NUMBER and state.checked:
            return self._allowed(words)
        if self._in_listed(state):
            ids = self._listed_candidates(state)
            ids = ids[(words[ids >> 5] & (np.uint32(1) << (ids & 31).astype(np.uint32))) != 0]
            return np.unique(ids)
        fraction, unique = self._kinds
        index, keys = self._index, self._index.keys
        in_string = state.mode in (KEY, STRING)
        parts = [index.quoted if in_string else index.digits] if fraction else []
        if unique:
            if state.mode == STRING and state.checked:
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
        inside = state.mode == STRING and state.checked
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
            heads.update(bytes((w,)) for w in WHITESPACE)
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
