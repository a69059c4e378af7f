"""No repeated object key: a check at value boundaries that a context-free grammar cannot make.

A free-form key (``additionalProperties``, ``patternProperties``) may repeat one the object
already holds: RFC 8259 discourages it, I-JSON forbids it, and a parser keeps only one of the
two, so ``minProperties`` counted by the grammar can come up short. :class:`DistinctKeysMatcher`
wraps a backend matcher, follows the JSON text token by token (:func:`scan`), and takes out of
the mask, out of ``accept`` and out of the forced continuation every token that would complete
a key its object already holds.

No dead end: a token that only continues a key is never taken out, so the wrapper is exact only
when every key prefix the grammar allows can still be completed to a key the object does not
hold. :func:`dead_end_risk` proves that per schema (free-form keys whose language is closed
under appending characters); where it cannot, the caller refuses what needed the check
(``minProperties``) or does without it (``schema_order``).

Cost: a mask is the backend's plus a test of the few tokens that could complete a held key
(those with enough quotes, or, inside a key, the tokens that finish exactly a held key's rest).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from corral.grammar.checks.scanning import ScanningMatcher
from corral.grammar.core.matcher import Matcher
from corral.grammar.core.tokenizer import TokenizerInfo
from corral.grammar.regex.algebra import RegexAlgebra

_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_VALUE, _KEY, _STRING = 0, 1, 2  # where the text is: between tokens of JSON, in a key, in a string


class Scan(NamedTuple):
    """Where the JSON text so far stands. Immutable: one per accepted token, for rollback.

    ``stack`` holds one entry per open container: the keys an object holds so far, or None for
    an array. ``raw`` is the current key's bytes as written (escapes undecoded)."""

    stack: tuple[frozenset[str] | None, ...] = ()
    mode: int = _VALUE
    escaped: bool = False
    raw: bytes = b""
    key_next: bool = False  # in an object, after `{` or `,`: the next string is a key


def scan(state: Scan, data: bytes) -> Scan | None:
    """``state`` after the bytes ``data``; None when they complete a key its object holds."""
    stack, mode, escaped, raw, key_next = state
    for i, b in enumerate(data):
        if mode != _VALUE:
            if escaped:
                escaped = False
            elif b == _BACKSLASH:
                escaped = True
            elif b == _QUOTE:
                if mode == _KEY:
                    key = decode_string(raw)
                    if key in stack[-1]:
                        return None
                    stack = (*stack[:-1], stack[-1] | {key})
                    raw = b""
                mode = _VALUE
                continue
            if mode == _KEY:
                raw += data[i : i + 1]
        elif b == _QUOTE:
            mode, key_next = (_KEY, False) if key_next else (_STRING, False)
        elif b == ord("{"):
            stack, key_next = (*stack, frozenset()), True
        elif b == ord("["):
            stack = (*stack, None)
        elif b in b"}]":
            stack, key_next = stack[:-1], False
        elif b == ord(","):
            key_next = bool(stack) and stack[-1] is not None
    return Scan(stack, mode, escaped, raw, key_next)


def decode_string(raw: bytes) -> str:
    """A string's value from its body's bytes; the grammar only lets valid bodies through."""
    if b"\\" not in raw:  # no escape: the body is the value
        return raw.decode("utf-8", "surrogateescape")
    try:
        return json.loads(b'"' + raw + b'"')
    except ValueError:  # never a valid body: keep the bytes as the key's identity
        return raw.decode("utf-8", "surrogateescape")


class Candidates(NamedTuple):
    """Token ids with, precomputed, the mask word and the bit each one sits at."""

    ids: np.ndarray
    at: np.ndarray
    bits: np.ndarray


def candidates(ids: np.ndarray) -> Candidates:
    """``ids`` with their mask words and bits."""
    ids = ids.astype(np.int64)
    return Candidates(ids, ids >> 5, (np.uint32(1) << (ids & 31).astype(np.uint32)))


class TokenIndex:
    """A vocabulary's token bytes, indexed for the few tokens that can complete a key."""

    def __init__(self, tok: TokenizerInfo) -> None:
        self.bytes = tok.token_bytes
        quotes = np.array([t.count(b'"') for t in self.bytes])
        #: inside a string (not after a backslash), the characters each token adds before the
        #: quote that closes the string -> those tokens; ``odd``: tokens whose bytes up to that
        #: quote are no complete string body on their own (checked by a full scan)
        self.closing: dict[str, list[int]] = {}
        odd = []
        for token in np.flatnonzero(quotes >= 1).tolist():
            closes, piece = _closing_piece(self.bytes[token])
            if piece is not None:
                self.closing.setdefault(piece, []).append(token)
            elif closes:
                odd.append(token)
        #: in a key, the tokens a held key does not name: odd ones, or 3+ quotes (another key)
        self.key_extra = candidates(
            np.union1d(np.array(odd, dtype=np.int64), np.flatnonzero(quotes >= 3))
        )
        #: tokens that may complete a key (one quote), open and complete one (two), or close a
        #: string and then open and complete a key (three)
        self.one = candidates(np.flatnonzero(quotes >= 1))
        self.two = candidates(np.flatnonzero(quotes >= 2))
        self.three = candidates(np.flatnonzero(quotes >= 3))


def token_index(tok: TokenizerInfo) -> TokenIndex:
    """Built once per tokenizer (about 0.3 s for 128k tokens) and kept by it."""
    return tok.derived(TokenIndex)


class DistinctKeysMatcher(ScanningMatcher):
    """A backend matcher whose outputs never repeat a key within one object (``scanning``)."""

    __slots__ = ("_index",)

    def __init__(self, inner: Matcher, index: TokenIndex, eos_token_ids: frozenset[int]) -> None:
        super().__init__(inner, eos_token_ids, index.bytes, Scan())
        self._index = index

    def _scan(self, state: Scan, data: bytes) -> Scan | None:
        return scan(state, data)

    def _candidates(self, state: Scan, words: np.ndarray) -> np.ndarray:
        """The tokens that could complete a key already in its object (a superset): a key is
        completed by a quote, so a token needs one quote per key boundary it crosses."""
        index = self._index
        if not any(state.stack):  # no key held yet: a repeat needs two keys in one token
            return index.three.ids
        if state.mode == _STRING:  # close the string, then open and close a key
            return index.three.ids
        if state.mode == _VALUE:  # open and close a key
            return index.two.ids
        held = decode_prefix(state.raw)
        if held is None:  # the key so far ends inside an escape: check every closing token
            return index.one.ids
        rests = [k[len(held) :] for k in state.stack[-1] if k.startswith(held)]
        if not rests:  # the key being written is none held: a repeat needs another key
            return index.three.ids
        hits = [np.asarray(index.closing.get(rest, ()), dtype=np.int64) for rest in rests]
        return np.concatenate([index.key_extra.ids, *hits])


def _closing_piece(token: bytes) -> tuple[bool, str | None]:
    """Whether ``token`` closes a string it continues (starting outside an escape), and the
    characters it adds before that quote (None when those bytes are no complete string body)."""
    escaped = False
    for i, b in enumerate(token):
        if escaped:
            escaped = False
        elif b == _BACKSLASH:
            escaped = True
        elif b == _QUOTE:
            return True, decode_prefix(token[:i])
    return False, None


def decode_prefix(raw: bytes) -> str | None:
    """The characters of a key begun with ``raw``; None when ``raw`` ends inside an escape or a
    UTF-8 sequence (then no prefix test is exact)."""
    if b"\\" not in raw:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
    try:
        return json.loads(b'"' + raw + b'"')
    except ValueError:
        return None


def dead_end_risk(
    schema: Any, sources: Mapping[str, str] | None = None, algebra: RegexAlgebra | None = None
) -> str | None:
    """Why refusing repeated keys could leave an object with no valid continuation, or None.

    Safe: every object either has only declared keys (the backend never repeats those) or free
    keys a begun key of which can always be finished as one the object does not hold:
    ``additionalProperties`` other than false, ``patternProperties`` searched without an end
    anchor or look-around, or a pattern whose automaton never runs out of continuations
    (``regex_algebra.never_runs_out``, on the Python source ``sources`` gives the backend
    regex: ``^[a-z_]+$``, but not ``^[a-f]$``). ``algebra``: the caller's regex memos (a fresh
    one, for this call only, when None)."""
    algebra = algebra or RegexAlgebra()
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        if "propertyNames" in node:
            return "'propertyNames' may bound the free-form keys"
        if node.get("additionalProperties") is False:
            for pattern in node.get("patternProperties", {}):
                source = (sources or {}).get(pattern)
                if not _extendable(pattern) and (
                    source is None or algebra.never_runs_out(source) is not True
                ):
                    return f"the keys of pattern {pattern!r} may not extend to a new key"
        stack.extend(node.values())
    return None


def _extendable(pattern: str) -> bool:
    """A search pattern with no end anchor and no look-around: any key it matches, extended by
    any characters, still matches."""
    unescaped = pattern.replace("\\\\", "")
    return (
        "$" not in unescaped.replace("\\$", "")
        and "(?" not in unescaped
        and ("\\z" not in unescaped and "\\Z" not in unescaped)
    )
