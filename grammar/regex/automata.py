"""Python regexes as automata: the model behind `regex_algebra`.

A pattern is read with Python's own parser (`re._parser`, classes through
`regex_translate.exact_class_ranges`), so every construct means what `re` says, and its language
is the set of strings in which `re.search` finds a match. The subset construction here builds an
interegular `FSM` per pattern, with caps on the automaton positions (counted repeats are
unrolled) and on the DFA states.

Characters: the code points are split into the classes no pattern of one question tells apart
(cut at the edges of every character class involved), so a class as large as `[^"]` or Unicode
`\\w` costs one or a few automaton symbols; each symbol stands for its code-point ranges.

Look-arounds with an exact regular meaning are part of the model: look-aheads right after a
leading `^` (`^(?!N)R` is `^R` minus `^N`, `^(?=A)R` is `^R` and `^A`, by interegular's
difference and product), a positive look-ahead ending an unanchored pattern (`A(?=B)` finds a
match exactly where `AB` does) and a positive look-behind starting one (`(?<=B)A`, likewise
`BA`). An end anchor inside the pattern (`(,|$)`) is a move taken only at the end of the text:
exact for `\\Z`, and for `$` where the languages read `$` as the backend does (`end_newline`
off; Python's `$` inside, which may also match before a final newline, is not modelled).
Anything else -- other look-arounds, back-references, word boundaries, start anchors inside the
pattern, flags -- raises `Outside`, as does an automaton past a cap.
"""

from __future__ import annotations

import bisect
import re
import sys
from re import _constants as C  # type: ignore[attr-defined]
from re import _parser as P  # type: ignore[attr-defined]
from typing import NamedTuple

from interegular.fsm import FSM, Alphabet

from corral.grammar.core.errors import ConstraintError
from corral.grammar.regex.translate import (
    Ranges,
    complement_ranges,
    exact_class_ranges,
    merge_ranges,
)

_MAX_NFA_STATES = 4_000  # counted repeats are unrolled: `.{1,4000}` is refused, not built
_MAX_DFA_STATES = 200
_ALL: Ranges = [(0, sys.maxunicode)]
_NEWLINE: Ranges = [(10, 10)]
SURROGATES = (0xD800, 0xDFFF)
_STARTS = (C.AT_BEGINNING, C.AT_BEGINNING_STRING)
_ENDS = {C.AT_END: "$", C.AT_END_STRING: "\\Z"}


class Outside(Exception):
    """The pattern uses something the model does not cover, or an automaton grew past a cap."""


# -- patterns as trees of classes ----------------------------------------------------------------
# ("cls", ranges) | ("cat", (node, ...)) | ("alt", (node, ...)) | ("rep", lo, hi or None, node)


class _Branch(NamedTuple):
    """One top-level alternative: `core` anchored at the start or not, ending in `end` ("": the
    search goes on, "$" or "\\Z"), and the look-aheads at its start: (positive, tree)."""

    anchored: bool
    core: tuple
    end: str
    looks: tuple[tuple[bool, tuple], ...] = ()


def _branches(pattern: str) -> list[_Branch]:
    try:
        parsed = P.parse(pattern)
    except (re.error, RecursionError, OverflowError) as e:
        raise Outside from e
    if parsed.state.flags & (re.IGNORECASE | re.MULTILINE | re.DOTALL | re.ASCII | re.LOCALE):
        raise Outside
    return _top(list(parsed), pattern)


def _top(items: list, pattern: str) -> list[_Branch]:
    if len(items) == 1 and items[0][0] is C.BRANCH:
        return [b for branch in items[0][1][1] for b in _top(list(branch), pattern)]
    if len(items) == 1 and items[0][0] is C.SUBPATTERN and not any(items[0][1][1:3]):
        return _top(list(items[0][1][3]), pattern)
    start, looks = False, []
    while items and items[0][0] is C.AT and items[0][1] in _STARTS:
        start, items = True, items[1:]
    while start and items and items[0][0] in (C.ASSERT, C.ASSERT_NOT) and items[0][1][0] == 1:
        looks.append((items[0][0] is C.ASSERT, _seq(list(items[0][1][1]), pattern)))
        items = items[1:]
    end = ""
    if items and items[-1][0] is C.AT and items[-1][1] in _ENDS:
        end, items = _ENDS[items[-1][1]], items[:-1]
    items = _inline_edge_looks(items, start, end)
    return [_Branch(start, _seq(items, pattern), end, tuple(looks))]


def _inline_edge_looks(items: list, start: bool, end: str) -> list:
    """Under search semantics a positive look-behind opening an unanchored pattern, or a
    positive look-ahead closing one, only asks for its text next to the match: inline it."""
    if not start and items and items[0][0] is C.ASSERT and items[0][1][0] == -1:
        items = list(items[0][1][1]) + items[1:]
    if not end and items and items[-1][0] is C.ASSERT and items[-1][1][0] == 1:
        items = items[:-1] + list(items[-1][1][1])
    return items


def _seq(items: list, pattern: str) -> tuple:
    return ("cat", tuple(_item(op, arg, pattern) for op, arg in items))


def _item(op, arg, pattern: str) -> tuple:
    if op is C.LITERAL:
        return ("cls", ((arg, arg),))
    if op is C.NOT_LITERAL:
        return ("cls", tuple(complement_ranges([(arg, arg)])))
    if op is C.ANY:
        return ("cls", tuple(complement_ranges(_NEWLINE)))
    if op is C.IN:
        try:
            return ("cls", tuple(exact_class_ranges(pattern, arg)))
        except ConstraintError as e:
            raise Outside from e
    if op is C.BRANCH:
        return ("alt", tuple(_seq(list(b), pattern) for b in arg[1]))
    if op is C.SUBPATTERN and not any(arg[1:3]):
        return _seq(list(arg[3]), pattern)
    if op in (C.MAX_REPEAT, C.MIN_REPEAT):  # laziness does not change whether a match exists
        lo, hi, sub = arg
        return ("rep", lo, None if hi is C.MAXREPEAT else hi, _seq(list(sub), pattern))
    if op is C.AT and arg in _ENDS:  # an end anchor inside: see `_Nfa.fragment`
        return ("end", _ENDS[arg])
    raise Outside  # start anchors inside, look-arounds, back-references, word boundaries, ...


def _class_sets(node: tuple, out: set) -> None:
    if node[0] == "end":
        return
    if node[0] == "cls":
        out.add(node[1])
    elif node[0] == "rep":
        _class_sets(node[3], out)
    else:
        for child in node[1]:
            _class_sets(child, out)


# -- automata ------------------------------------------------------------------------------------
class Languages:
    """The search languages of some patterns as DFAs over one shared alphabet."""

    def __init__(
        self, patterns: tuple[str, ...], end_newline: bool = True, max_states: int = 0
    ) -> None:
        """`end_newline`: `$` also matches before a final newline, as in Python; False reads it
        as the backend's regexes do (`\\Z`). `max_states`: the most DFA states a pattern may
        need (0: the default, :data:`_MAX_DFA_STATES`)."""
        self._end_newline = end_newline
        self._max_states = max_states or _MAX_DFA_STATES
        parsed = [_branches(p) for p in patterns]
        sets = {tuple(_ALL), tuple(_NEWLINE)}
        for branches in parsed:
            for branch in branches:
                for node in (branch.core, *(tree for _, tree in branch.looks)):
                    _class_sets(node, sets)
        self.symbols_of, self.ranges = _partition(sorted(sets))
        #: symbol -> its code points minus lone surrogates (empty: never printed)
        self.printable = [without_surrogates(r) for r in self.ranges]
        alphabet = Alphabet({chr(r[0][0]): i for i, r in enumerate(self.ranges)})
        self._starts = sorted((lo, sym) for sym, r in enumerate(self.ranges) for lo, _ in r)
        self.fsms = [self._dfa(branches, alphabet) for branches in parsed]

    def symbol(self, cp: int) -> int:
        """The symbol code point `cp` belongs to (the symbols cover every code point)."""
        return self._starts[bisect.bisect_right(self._starts, (cp, len(self.ranges))) - 1][1]

    def _dfa(self, branches: list[_Branch], alphabet: Alphabet) -> FSM:
        """The search language of one pattern: its plain branches through one automaton, each
        branch with look-aheads cut down by interegular's product and difference."""
        plain = [b for b in branches if not b.looks]
        parts = [self._nfa_dfa(plain, alphabet)] if plain else []
        for b in branches:
            if b.looks:
                dfa = self._nfa_dfa([b._replace(looks=())], alphabet)
                for positive, tree in b.looks:
                    look = self._nfa_dfa([_Branch(True, tree, "")], alphabet)
                    dfa = self.renumbered(dfa & look if positive else dfa - look, alphabet)
                    if len(dfa.states) > self._max_states:
                        raise Outside
                parts.append(dfa)
        return parts[0] if len(parts) == 1 else self.renumbered(FSM.union(*parts), alphabet)

    def renumbered(self, fsm: FSM, alphabet: Alphabet) -> FSM:
        """`fsm` over this alphabet again: interegular's operations renumber the symbols."""
        to_ours = {key: self.symbol(ord(ch)) for ch, key in fsm.alphabet.items()}
        transitions = {s: {to_ours[k]: t for k, t in row.items()} for s, row in fsm.map.items()}
        return FSM(alphabet, set(fsm.states), fsm.initial, set(fsm.finals), transitions)

    def _nfa_dfa(self, branches: list[_Branch], alphabet: Alphabet) -> FSM:
        nfa = _Nfa(self.symbols_of, self._end_newline)
        start, every = nfa.new(), self.symbols_of[tuple(_ALL)]
        for anchored, core, end, _ in branches:
            head = nfa.new()
            nfa.eps[start].append(head)
            if not anchored:
                nfa.edges[head].append((every, head))
            tail = nfa.fragment(core, head)
            nfa.finals.add(tail)
            if end == "":
                nfa.edges[tail].append((every, tail))
            elif end == "$" and self._end_newline:  # Python's `$` also before a final newline
                after = nfa.new()
                nfa.edges[tail].append((self.symbols_of[tuple(_NEWLINE)], after))
                nfa.finals.add(after)
        return nfa.determinize(start, alphabet, self._max_states)


def _partition(sets: list[tuple]) -> tuple[dict[tuple, frozenset[int]], list[Ranges]]:
    """Symbols: maximal groups of code points every set in `sets` treats alike."""
    cuts = sorted({lo for s in sets for lo, _ in s} | {hi + 1 for s in sets for _, hi in s})
    starts = [[lo for lo, _ in s] for s in sets]
    by_signature: dict[tuple, int] = {}
    ranges: list[Ranges] = []
    members: dict[tuple, set[int]] = {s: set() for s in sets}
    for lo, nxt in zip(cuts, cuts[1:], strict=False):
        signature = tuple(i for i, s in enumerate(sets) if _covers(s, starts[i], lo))
        if not signature:
            continue
        sym = by_signature.setdefault(signature, len(ranges))
        if sym == len(ranges):
            ranges.append([])
            for i in signature:
                members[sets[i]].add(sym)
        ranges[sym].append((lo, nxt - 1))
    return {s: frozenset(m) for s, m in members.items()}, [merge_ranges(r) for r in ranges]


def _covers(ranges: tuple, starts: list[int], cp: int) -> bool:
    i = bisect.bisect_right(starts, cp) - 1
    return i >= 0 and ranges[i][1] >= cp


def without_surrogates(ranges: Ranges) -> Ranges:
    lo_s, hi_s = SURROGATES
    out: Ranges = []
    for lo, hi in ranges:
        if lo < lo_s:
            out.append((lo, min(hi, lo_s - 1)))
        if hi > hi_s:
            out.append((max(lo, hi_s + 1), hi))
    return out


class _Nfa:
    """Thompson construction over symbol sets, with epsilon moves and a state cap."""

    def __init__(self, symbols_of: dict[tuple, frozenset[int]], end_newline: bool) -> None:
        self.symbols_of = symbols_of
        self.end_newline = end_newline
        #: moves taken only at the end of the text (an end anchor inside the pattern)
        self.at_end: dict[int, list[int]] = {}
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[frozenset[int], int]]] = []
        self.finals: set[int] = set()

    def new(self) -> int:
        if len(self.eps) >= _MAX_NFA_STATES:
            raise Outside
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def fragment(self, node: tuple, start: int) -> int:
        """Add `node` from state `start`; the state its matches end in."""
        kind = node[0]
        if kind == "cls":
            end = self.new()
            self.edges[start].append((self.symbols_of[node[1]], end))
            return end
        if kind == "end":  # `\\Z`, or `$` read as the backend does; Python's `$` may also
            if node[1] == "$" and self.end_newline:  # match before a final newline: not here
                raise Outside
            end = self.new()
            self.at_end.setdefault(start, []).append(end)
            return end
        if kind == "cat":
            for child in node[1]:
                start = self.fragment(child, start)
            return start
        if kind == "alt":
            end = self.new()
            for child in node[1]:
                head = self.new()
                self.eps[start].append(head)
                self.eps[self.fragment(child, head)].append(end)
            return end
        _, lo, hi, sub = node
        for _ in range(lo):
            start = self.fragment(sub, start)
        if hi is None:
            loop = self.new()
            self.eps[start].append(loop)
            self.eps[self.fragment(sub, loop)].append(loop)
            return loop
        for _ in range(hi - lo):
            end = self.new()
            self.eps[start].append(end)
            self.eps[self.fragment(sub, start)].append(end)
            start = end
        return start

    def closure(self, states: frozenset[int]) -> frozenset[int]:
        seen, todo = set(states), list(states)
        while todo:
            for nxt in self.eps[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return frozenset(seen)

    def determinize(self, start: int, alphabet: Alphabet, max_states: int) -> FSM:
        first = self.closure(frozenset((start,)))
        index, todo = {first: 0}, [first]
        transitions: dict[int, dict[int, int]] = {}
        while todo:
            subset = todo.pop()
            moves: dict[int, set[int]] = {}
            for state in subset:
                for symbols, target in self.edges[state]:
                    for sym in symbols:
                        moves.setdefault(sym, set()).add(target)
            row = transitions[index[subset]] = {}
            for sym, targets in moves.items():
                nxt = self.closure(frozenset(targets))
                if nxt not in index:
                    if len(index) >= max_states:
                        raise Outside
                    index[nxt] = len(index)
                    todo.append(nxt)
                row[sym] = index[nxt]
        finals = {i for subset, i in index.items() if self.ends_in(subset) & self.finals}
        return FSM(alphabet, set(index.values()), 0, finals, transitions)

    def ends_in(self, states: frozenset[int]) -> frozenset[int]:
        """The states the text may end in from `states`: their closure through epsilon moves
        and the moves of end anchors (no character is read after an end anchor)."""
        if not self.at_end:
            return states
        seen, todo = set(states), list(states)
        while todo:
            state = todo.pop()
            for nxt in (*self.eps[state], *self.at_end.get(state, ())):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return frozenset(seen)
