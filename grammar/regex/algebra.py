"""Exact algebra on Python regexes: do two patterns share a string, which strings match one.

`jsonschema` judges `pattern` with Python's `re.search`, so the language of a pattern here is the
set of strings in which `re.search` finds a match. The automata come from `regex_automata`
(Python's own parse of the pattern, exact classes); interegular's pattern parser is not used, as
its dialect differs from Python's (ASCII `\\d \\w \\s`, no `$` before a final newline, anchors
refused). interegular's product, complement, minimisation and emptiness answer the questions,
and a state elimination prints a language back as a plain anchored regex: the complement for
`not: {pattern}`, or a pattern with look-arounds written without them.

What the model leaves out (see `regex_automata`) and automata or printed regexes past the caps
answer None ("not decided"): the callers then keep their weaker answer or refuse; nothing is
guessed.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from interegular.fsm import FSM

from corral.grammar.backends.quirks import json_safe
from corral.grammar.regex.automata import SURROGATES, Languages, Outside, without_surrogates
from corral.grammar.regex.translate import (
    Ranges,
    class_regex,
    complement_ranges,
    merge_ranges,
)

_MAX_REGEX_CHARS = 16_000  # a printed regex, for the backend's lexer


@dataclass(frozen=True)
class Anchored:
    """A set of strings as a regex anchored at both ends: `backend` in the backend's dialect,
    `python` for the judge. `empty`: the set is empty (no regex)."""

    backend: str = ""
    python: str = ""
    empty: bool = False


#: how many answers of each kind one `RegexAlgebra` keeps (least recently used dropped first)
MEMO_SIZES: dict[str, int] = {
    "disjoint": 1024,
    "never_runs_out": 256,
    "languages": 256,
    "complement": 1024,
    "regular": 1024,
}
DEFAULT_MEMO_SIZE = 8192  # a kind not named above (`patterns.PatternTable`'s translations)


class RegexAlgebra:
    """The regex algebra with its memos: answers keyed by pattern text, each kind bounded
    (`MEMO_SIZES`), least recently used dropped first. Whoever holds one decides how long its
    answers live: a schema compile (`analysis.analyze_schema`, the checks it and the matcher's
    build run), or a closer (`closing.strings.Patterns`). Thread-safe: a lock guards the memos;
    an answer is computed outside it (a pure function of its key, so two threads racing on one
    key only compute it twice). `hits` counts the answers found in a memo, per kind."""

    def __init__(self, sizes: dict[str, int] | None = None) -> None:
        self._sizes = {**MEMO_SIZES, **(sizes or {})}
        self._lock = threading.Lock()
        self._memos: dict[str, OrderedDict] = {}
        self.hits: dict[str, int] = {}

    def cached(self, kind: str, key: Hashable, compute: Callable[[], Any]) -> Any:
        """The memoised ``compute()`` of ``key`` among answers of ``kind``."""
        with self._lock:
            memo = self._memos.setdefault(kind, OrderedDict())
            if key in memo:
                memo.move_to_end(key)
                self.hits[kind] = self.hits.get(kind, 0) + 1
                return memo[key]
        value = compute()
        with self._lock:
            memo[key] = value
            if len(memo) > self._sizes.get(kind, DEFAULT_MEMO_SIZE):
                memo.popitem(last=False)
        return value

    def disjoint(self, first: tuple[str, ...], second: tuple[str, ...]) -> bool | None:
        """True when no string matches all `first` patterns and all `second` ones (`re.search`),
        False when some string does, None when the model cannot decide."""
        return self.cached("disjoint", (first, second), lambda: _disjoint(first, second))

    def matches(self, pattern: str, text: str) -> bool | None:
        """Whether `re.search(pattern, text)` finds a match, decided on the pattern's automaton
        (no backtracking, so a hostile pattern costs no more than a plain one); None: not
        decided."""
        return _matches(self.languages(pattern), text)

    def never_runs_out(self, pattern: str) -> bool | None:
        """Whether every prefix of a string the backend's form of `pattern` matches extends to
        infinitely many such strings (None: not decided): a key begun under the pattern can
        then always be finished as one not yet written, however many are. True for `^[a-z]+$`
        or `^x_\\d+$`, False for `^[a-f]$` or `^(?:OUT1|OUT2)$`. The backend's `$` is the end
        of the text (Python's also matches before a final newline, which the backend never
        writes)."""
        return self.cached("never_runs_out", pattern, lambda: _never_runs_out(pattern))

    def backend_never_runs_out(self, regex: str) -> bool | None:
        """`never_runs_out` for a regex in the backend's dialect as `translate_regex` prints it
        (classes spelt as ranges, code points as ``\\x{..}``): read back as the Python pattern
        of the same language, so that a check can be decided from the backend's grammar
        alone."""
        return self.never_runs_out(python_of_backend(regex))

    def languages(self, pattern: str, end_newline: bool = True) -> Languages | None:
        """One pattern's automaton, or None (kept too: a refused pattern is not rebuilt per
        use)."""
        key = (pattern, end_newline)
        return self.cached("languages", key, lambda: _languages(pattern, end_newline))

    def complement(self, pattern: str) -> Anchored | None:
        """Anchored regexes for the strings `re.search(pattern, s)` finds no match in (None:
        not decided). Strings with lone surrogates are left out of them (the backend's regexes
        cannot spell those code points); leaving strings out only narrows."""
        return self.cached(
            "complement", pattern, lambda: _anchored(self.languages(pattern), negate=True)
        )

    def regular(self, pattern: str, narrow_ends: bool = False) -> Anchored | None:
        """Anchored regexes for the strings `re.search(pattern, s)` finds a match in: a pattern
        with look-arounds written without them (lone surrogates left out, as in `complement`).
        `narrow_ends`: every `$` is read as the end of the text (as the backend reads it), which
        leaves out the matches Python's `$` finds before a final newline: a narrowing, but one
        that writes a `$` inside the pattern (`(,|$)`) without it
        (``quirks.END_ANCHOR_ONLY_AT_END``)."""

        def build() -> Anchored | None:
            return _anchored(self.languages(pattern, not narrow_ends), negate=False)

        return self.cached("regular", (pattern, narrow_ends), build)


def _disjoint(first: tuple[str, ...], second: tuple[str, ...]) -> bool | None:
    try:
        fsms = Languages(first + second).fsms
    except Outside:
        return None
    a, b = FSM.intersection(*fsms[: len(first)]), FSM.intersection(*fsms[len(first) :])
    return a.isdisjoint(b)


def _matches(langs: Languages | None, text: str) -> bool | None:
    if langs is None:
        return None
    dfa, state = langs.fsms[0], langs.fsms[0].initial
    for ch in text:
        state = dfa.map.get(state, {}).get(langs.symbol(ord(ch)))
        if state is None:
            return False
    return state in dfa.finals


#: most DFA states `never_runs_out` builds (a one-off walk: an e-mail address's pattern, with
#: its counted label lengths, needs about 400)
_RUNS_OUT_STATES = 2_000


def _never_runs_out(pattern: str) -> bool | None:
    """Whether every prefix of a string the backend's form of `pattern` matches extends to
    infinitely many such strings (None: not decided): a key begun under the pattern can then
    always be finished as one not yet written, however many are. True for `^[a-z]+$` or
    `^x_\\d+$`, False for `^[a-f]$` or `^(?:OUT1|OUT2)$`. The backend's `$` is the end of
    the text (Python's also matches before a final newline, which the backend never writes)."""
    try:
        dfa = Languages((pattern,), end_newline=False, max_states=_RUNS_OUT_STATES).fsms[0]
    except Outside:
        return None
    live = {q for q in dfa.states if dfa.islive(q)}
    edges = {q: {t for t in dfa.map.get(q, {}).values() if t in live} for q in live}
    reach = {q: _reachable(q, edges) for q in live}  # states reachable in one or more steps
    cyclic = {q for q in live if q in reach[q]}
    if dfa.initial not in live:
        return True  # no string matches: no key is ever begun
    return all(q in cyclic or reach[q] & cyclic for q in {dfa.initial} | reach[dfa.initial])


def python_of_backend(regex: str) -> str:
    """The Python spelling of a printed backend regex: ``\\x{h}`` becomes ``\\U`` with eight
    digits; every other escape and construct is spelt alike in both dialects."""
    out, i = [], 0
    while i < len(regex):
        if regex.startswith("\\x{", i):
            end = regex.index("}", i)
            out.append(f"\\U{int(regex[i + 3 : end], 16):08x}")
            i = end + 1
        elif regex[i] == "\\":
            out.append(regex[i : i + 2])
            i += 2
        else:
            out.append(regex[i])
            i += 1
    return "".join(out)


def _reachable(start: object, edges: dict) -> set:
    seen: set = set()
    stack = list(edges[start])
    while stack:
        q = stack.pop()
        if q not in seen:
            seen.add(q)
            stack.extend(edges[q])
    return seen


def _languages(pattern: str, end_newline: bool = True) -> Languages | None:
    """One pattern's automaton, or None (kept too: a refused pattern is not rebuilt per use)."""
    try:
        return Languages((pattern,), end_newline=end_newline)
    except Outside:
        return None


def _anchored(langs: Languages | None, negate: bool) -> Anchored | None:
    if langs is None:
        return None
    try:
        dfa = langs.fsms[0]
        if negate:
            dfa = langs.renumbered(dfa.everythingbut(), dfa.alphabet)
        if dfa.empty():
            return Anchored(empty=True)
        node = _eliminate(langs.renumbered(dfa.reduce(), dfa.alphabet), langs.printable)
    except Outside:
        return None
    backend, python = _print(node, _backend_class), _print(node, _python_class)
    if len(backend) > _MAX_REGEX_CHARS:
        return None
    return Anchored(f"^(?:{backend})$", f"\\A(?:{python})\\Z")


# -- a DFA back to a regex (state elimination) --------------------------------------------------
_EPS = ("cat", ())


def _eliminate(dfa: FSM, printable: list[Ranges]) -> tuple:
    """One regex tree for the language of `dfa` (its dead states dropped first)."""
    live = {s for s in dfa.states if dfa.islive(s)}
    start, final = object(), object()
    edge: dict[tuple, tuple] = {(start, dfa.initial): _EPS}
    edge.update({(s, final): _EPS for s in dfa.finals if s in live})
    for s in live:
        labels: dict[object, Ranges] = {}
        for sym, t in dfa.map.get(s, {}).items():
            if t in live and printable[sym]:
                labels.setdefault(t, []).extend(printable[sym])
        for t, ranges in labels.items():
            edge[(s, t)] = ("cls", tuple(merge_ranges(ranges)))
    remaining = set(live)
    while remaining:
        k = min(remaining, key=lambda q: _degree(edge, q))
        remaining.discard(k)
        loop = edge.pop((k, k), None)
        ins = [(i, r) for (i, j), r in edge.items() if j is k]
        outs = [(j, r) for (i, j), r in edge.items() if i is k]
        for i, _ in ins:
            del edge[(i, k)]
        for j, _ in outs:
            del edge[(k, j)]
        middle = _EPS if loop is None else ("rep", 0, None, loop)
        for i, r_in in ins:
            for j, r_out in outs:
                path = _cat(r_in, middle, r_out)
                edge[(i, j)] = _alt(edge[(i, j)], path) if (i, j) in edge else path
        if sum(len(_print(r, _backend_class)) for r in edge.values()) > 2 * _MAX_REGEX_CHARS:
            raise Outside
    return edge.get((start, final), ("alt", ()))


def _degree(edge: dict, q: object) -> int:
    ins = sum(1 for i, j in edge if j is q and i is not q)
    outs = sum(1 for i, j in edge if i is q and j is not q)
    return ins * outs


def _cat(*parts: tuple) -> tuple:
    flat: list = []
    for p in parts:
        flat += p[1] if p[0] == "cat" else [p]
    return flat[0] if len(flat) == 1 else ("cat", tuple(flat))


def _alt(a: tuple, b: tuple) -> tuple:
    flat: list = []
    for p in (a, b):
        for q in p[1] if p[0] == "alt" else [p]:
            if q not in flat:
                flat.append(q)
    return flat[0] if len(flat) == 1 else ("alt", tuple(flat))


def _print(node: tuple, cls) -> str:
    kind = node[0]
    if kind == "cls":
        return cls(node[1])
    if kind == "cat":
        return "".join(_atom(c, cls) if c[0] == "alt" else _print(c, cls) for c in node[1])
    if kind == "alt":
        if not node[1]:
            return "[^\\s\\S]"  # matches nothing (never printed for a non-empty language)
        options = [c for c in node[1] if c != _EPS]
        classes = [c for c in options if c[0] == "cls"]
        if len(classes) > 1:  # merged first, as the backend does (ONE_CLASS_ALTERNATIVES_MERGED)
            joined = ("cls", tuple(merge_ranges([r for c in classes for r in c[1]])))
            options = [joined] + [c for c in options if c[0] != "cls"]
        body = "|".join(_print(c, cls) for c in options)
        return f"(?:{body})?" if len(options) < len(node[1]) else body
    return _atom(node[3], cls) + "*"


def _atom(node: tuple, cls) -> str:
    text = _print(node, cls)
    return text if node[0] == "cls" else f"(?:{text})"


def _backend_class(ranges: tuple) -> str:
    """A class in the backend's dialect, negated when that is shorter (the backend's classes
    hold Unicode scalar values only, so a negated class never admits a surrogate), made safe
    for the backend's quoting inside a JSON string (`quirks.json_safe`: a narrowing)."""
    ranges = tuple(json_safe(list(ranges)))
    rest = without_surrogates(complement_ranges(list(ranges)))
    if len(rest) < len(ranges):
        return "[^" + class_regex(rest)[1:] if rest else "[\\s\\S]"
    return class_regex(list(ranges))


def _python_class(ranges: tuple) -> str:
    """The same class for Python's `re` (a negated one also leaves out the surrogates)."""
    ranges = tuple(json_safe(list(ranges)))
    rest = without_surrogates(complement_ranges(list(ranges)))
    if len(rest) < len(ranges):
        return "[^" + _python_items(rest + [SURROGATES]) + "]"
    return "[" + _python_items(list(ranges)) + "]"


def _python_items(ranges: Ranges) -> str:
    def char(cp: int) -> str:
        ch = chr(cp)
        if ch.isascii() and ch.isalnum():
            return ch
        return f"\\u{cp:04x}" if cp <= 0xFFFF else f"\\U{cp:08x}"

    return "".join(char(lo) if lo == hi else f"{char(lo)}-{char(hi)}" for lo, hi in ranges)
