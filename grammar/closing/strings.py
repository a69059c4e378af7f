"""Completing a JSON string under a schema's string keywords (``grammar.shortest``'s leaves).

The shortest suffix that makes a string valid under `minLength`, `pattern` (through an
interegular automaton of the Python pattern) or a checked `format` (by a fixed example), and
the judge's own test of a pattern.

The automata are state: a `Patterns` holds them, one per `JsonCloser` (which shares it with the
parsers that close under it), never a module global. It is guarded by its own lock, so the
closer may be shared by request threads and the engine's thread.
"""

from __future__ import annotations

import re
import threading
from typing import Any

import interegular

from corral.grammar.regex.algebra import RegexAlgebra

#: The longest run of filler a closing may need (characters a `minLength` asks for, items a
#: `minItems` asks for). A schema that asks for more (`minLength: 10**9` is valid) has no
#: closing here: budget closing stays off for it and says why, rather than build the filler.
MAX_FILL = 4096
#: The most pattern automata one closer keeps (a schema with more builds the rest per call).
MAX_DFAS = 512
_FORMATS = {
    "date": "2000-01-01",
    "time": "00:00:00Z",
    "date-time": "2000-01-01T00:00:00Z",
    "duration": "P0D",
    "email": "a@a.aa",
    "hostname": "a",
    "ipv4": "0.0.0.0",
    "ipv6": "::",
    "uuid": "00000000-0000-0000-0000-000000000000",
    "uri": "a:",
    "uri-reference": "",
}


def complete_string(node: dict, text: str, patterns: Patterns) -> str | None:
    """The shortest suffix making `text` a valid string under `node` (type string); a
    `pattern` is read through `patterns` (the closer's automata)."""
    need = max(0, node.get("minLength", 0) - len(text))
    if need > MAX_FILL:
        return None
    if "pattern" in node:
        return patterns.complete(node["pattern"], text, node.get("minLength", 0))
    if "format" in node:
        example = _FORMATS.get(node["format"])
        if example is None or not example.startswith(text) or len(example) < len(text) + need:
            return None
        return example[len(text) :]
    return "a" * need


def shortest_string(node: dict, patterns: Patterns) -> str | None:
    """The shortest string valid under `node`'s string keywords."""
    return complete_string(node, "", patterns)


class Patterns:
    """The automata of the patterns one closer completes strings under, each built on first
    use (milliseconds) and kept with its memo of shortest suffixes: at most `max_dfas` of
    them (past that, one is built for the call and not kept). Thread-safe: one lock around
    the table and every walk of an automaton (its memo grows as it is asked)."""

    def __init__(self, max_dfas: int = MAX_DFAS) -> None:
        self._max = max_dfas
        self._lock = threading.Lock()
        self._dfas: dict[str, _Dfa] = {}
        self._algebra = RegexAlgebra()  # look-around patterns written without them

    def complete(self, pattern: str, text: str, min_length: int) -> str | None:
        """Shortest suffix s with `text + s` matching `pattern` as `re.search` does (a side
        without its anchor takes any text there) and at least `min_length` characters long;
        None where the regex cannot be analysed."""
        with self._lock:
            return self._complete(pattern, text, min_length)

    def _complete(self, pattern: str, text: str, min_length: int) -> str | None:
        start = pattern.startswith("^")
        end = pattern.endswith("$") and not pattern.endswith("\\$")
        body = pattern[int(start) : len(pattern) - int(end)]
        body = body if start else f"(?:.|\\n)*(?:{body})"
        body = body if end else f"(?:{body})(?:.|\\n)*"
        try:
            dfa = self._dfa(_spelt_escapes(body))
        except Exception:  # interegular refuses some syntax (look-arounds, `$` inside): the
            regular = self._algebra.regular
            written = regular(pattern) or regular(pattern, narrow_ends=True)  # same language,
            if written is None or written.empty or written.python == pattern:  # or the
                return None  # backend's part of it
            plain = "^" + written.python.removeprefix("\\A").removesuffix("\\Z") + "$"
            return self._complete(plain, text, min_length)
        state = dfa.start
        for ch in text:
            state = dfa.step(state, ch)
            if state is None:
                return None
        return dfa.shortest_from(state, max(0, min_length - len(text)))

    def _dfa(self, pattern: str) -> _Dfa:
        found = self._dfas.get(pattern)
        if found is None:
            found = _Dfa(pattern)
            if len(self._dfas) < self._max:
                self._dfas[pattern] = found
        return found


_SPECIAL = frozenset("\\^$.|?*+()[]{}-/")


def _spelt_escapes(pattern: str) -> str:
    """`pattern` with each `\\uXXXX` escape (which interegular does not read) written as its
    character, escaped where the character is special in a regex."""

    def spell(m: re.Match) -> str:
        ch = chr(int(m.group(1), 16))
        return "\\" + ch if ch in _SPECIAL else ch

    return re.sub(r"(?<!\\)\\u([0-9a-fA-F]{4})", spell, pattern)


class _Dfa:
    """An interegular FSM with one printable character per transition class and memoized
    shortest suffixes (a string's completion is asked for at every step while it is open).
    Walked only under its `Patterns`' lock."""

    def __init__(self, pattern: str) -> None:
        fsm = interegular.parse_pattern(pattern).to_fsm()
        self.fsm, self.start = fsm, fsm.initial
        chars: dict[Any, str] = {}
        for ch in "a0A_-. " + "".join(map(chr, range(0x21, 0x7F))):
            chars.setdefault(fsm.alphabet[ch], ch)
        self.edges = {
            state: [(chars[sym], nxt) for sym, nxt in moves.items() if sym in chars]
            for state, moves in fsm.map.items()
        }
        self._memo: dict[tuple[Any, int], str | None] = {}

    def step(self, state: Any, ch: str) -> Any:
        return self.fsm.map.get(state, {}).get(self.fsm.alphabet[ch])

    def shortest_from(self, state: Any, need: int) -> str | None:
        """Shortest suffix of at least `need` characters from `state` to a final state."""
        if (state, need) not in self._memo:
            paths = {(state, need): ""}
            queue, found = [(state, need)], None
            for at, left in queue:
                if at in self.fsm.finals and left == 0:
                    found = paths[(at, left)]
                    break
                for ch, nxt in self.edges.get(at, ()):
                    key = (nxt, max(0, left - 1))
                    if key not in paths:
                        paths[key] = paths[(at, left)] + ch
                        queue.append(key)
            self._memo[(state, need)] = found
        return self._memo[(state, need)]


def search_pattern(pattern: str, text: str) -> bool:
    """Whether Python's `re` finds `pattern` in `text` (as `jsonschema` judges); False when it
    cannot read the pattern."""
    import re

    try:
        return re.search(pattern, text) is not None
    except re.error:
        return False


def fresh_suffix(text: str, taken: tuple[str, ...] | set[str]) -> str:
    """The shortest run of digits that makes `text` + it a string not in `taken`."""
    for n in range(1, len(taken) + 2):
        for k in range(10 ** (n - 1) if n > 1 else 0, 10**n):
            if text + str(k) not in taken:
                return str(k)
    raise AssertionError("unreachable: fewer strings are taken than tried")
