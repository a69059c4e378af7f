"""Schema regexes in the backend's dialect: `pattern`, `patternProperties` keys, format patterns.

JSON Schema patterns mean what the judge's regex engine (Python `re`) says, with search
semantics (unanchored unless the pattern anchors itself). llguidance also searches unless the
pattern carries `^`/`$`, and `translate_regex` keeps those anchors, so a translation keeps the
search semantics; what it changes is the character classes, spelt out from Python's tables, and
repetitions at unanchored ends, cut to their least count (`\\w{1,16}` searches as `\\w`).

Two strengths are needed:
* a `pattern` (or a `propertyNames` pattern turned into a closed key pattern) may be *narrowed*:
  the backend accepting fewer strings is sound. `translate_regex` narrows positive `\\d \\w \\s`
  to ASCII, which keeps the backend's lexer small.
* a `patternProperties` key must be *exact*: a key the pattern matches for Python but not for the
  backend would escape the pattern's schema and fall to `additionalProperties`, which may accept
  more. Positive shorthands are first rewritten as double negations (`\\d` -> `[^\\D]`), which
  `translate_regex` prints exactly (everything under a negation is exact).

A `pattern` with look-arounds that have an exact regular meaning (see `regex_algebra`) is
written without them, as an anchored regex of the same language.

Translations are memoised per pattern string by the `RegexAlgebra` the analysis is given (its
owner decides how long they live: one compile, or every compile that passes the same one); the
first shorthand class builds a Unicode table (a fraction of a second, once per process).

Copies: `key_patterns` and `python_dialect` build new maps; the analysed schema they read is not
changed.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from corral.grammar.checks.value_sites import FRACTION, UNIQUE
from corral.grammar.core.errors import ConstraintError
from corral.grammar.regex.algebra import RegexAlgebra
from corral.grammar.regex.translate import translate_regex
from corral.grammar.schema.facts import escape_pointer
from corral.grammar.schema.negate import NotExpressible
from corral.grammar.schema.rewrite_log import PATTERN_LOOKAROUND, PATTERN_NARROWED, PATTERN_NUL

_DOUBLE_NEGATION = {"d": r"[^\D]", "w": r"[^\W]", "s": r"[^\S]"}
#: The refusal of a key pattern that ``quirks.json_safe`` had to narrow (the backend's quoting:
#: ``quirks.CONTROL_CLASS_LETS_QUOTES_THROUGH``).
_NUL_KEY = (
    "pattern {!r} holds a class of every control character but not both '\"' and '\\', "
    "which the backend cannot enforce exactly on keys (it would also let '\"' and '\\' "
    "through); leave NUL or another control character out of the class"
)


@dataclass(frozen=True)
class Translation:
    """The backend regex of a pattern, or why there is none (`invalid`: not a regex at all);
    `rewrite` names what the translation changed beyond the dialect (`rewrite_log`)."""

    regex: str = ""
    refusal: str = ""
    invalid: bool = False
    rewrite: str = ""


def translate_pattern(
    pattern: str, exact: bool, nul_ok: bool = False, algebra: RegexAlgebra | None = None
) -> Translation:
    """The backend-dialect form of Python regex `pattern` (exact, or possibly narrowed).
    `nul_ok`: an exact key pattern may still leave NUL out of a class (`json_safe`), because a
    key it then misses is refused anyway (the only pattern of a closed object). Not memoised:
    `PatternTable.translate` keeps the answers in its `RegexAlgebra`; `algebra` answers the
    look-around rewrite (a fresh one, kept for this call only, when None)."""
    with warnings.catch_warnings():  # "possible nested set" and the like: Python's own advice
        warnings.simplefilter("ignore", FutureWarning)
        try:
            re.compile(pattern)
        except (re.error, RecursionError, OverflowError) as e:
            return Translation(refusal=f"invalid regular expression {pattern!r}: {e}", invalid=True)
        try:
            guarded: list[str] = []
            narrowed = translate_regex(pattern, search=True, guarded=guarded)
            if not exact:
                shorthands = exact_shorthands(pattern) != pattern
                rewrite = PATTERN_NUL if guarded else PATTERN_NARROWED if shorthands else ""
                return Translation(narrowed, rewrite=rewrite)
            source = exact_shorthands(pattern)
            exact_regex = (
                narrowed
                if source == pattern
                else translate_regex(source, search=True, guarded=guarded)
            )
            if guarded and not nul_ok:
                return Translation(refusal=_NUL_KEY.format(pattern))
            return Translation(exact_regex, rewrite=PATTERN_NUL if guarded else "")
        except ConstraintError as e:
            # a look-around with a regular meaning, printed without it; keys stay refused (the
            # printed form leaves out strings with lone surrogates: a narrowing)
            algebra = algebra or RegexAlgebra()
            regular = algebra.regular
            written = None if exact else regular(pattern) or regular(pattern, narrow_ends=True)
            if written is None or written.empty:
                return Translation(refusal=e.reason)
            return Translation(written.backend, rewrite=PATTERN_LOOKAROUND)


class PatternTable:
    """The backend regexes of one analysis and the Python patterns they were translated from."""

    def __init__(
        self,
        refuse: Callable[[str, str, str], None],
        record: Callable[[str, str, str], None],
        algebra: RegexAlgebra | None = None,
    ) -> None:
        self._refuse = refuse
        #: the memos of translations and of the regex algebra (the analysis's owner's)
        self.algebra = algebra or RegexAlgebra()
        self._record = record  # (pointer, keyword, rewrite) of a translation that changed more
        #: backend regex -> its Python source (to judge the output with `jsonschema`)
        self.python_source: dict[str, str] = {}
        #: exact backend regex -> its Python source (same language: to match keys in Python)
        self.key_source: dict[str, str] = {}
        #: backend regexes two different sources were narrowed to
        self._ambiguous: set[str] = set()
        #: complements written by `complement`: they leave out strings with lone surrogates,
        #: so their language is narrower than the negation they stand for
        self._derived: set[str] = set()

    def translate(
        self, pattern: str, where: str, keyword: str, exact: bool, nul_ok: bool = False
    ) -> str | None:
        """`pattern` in the backend's dialect; None after refusing it (lenient mode)."""
        algebra = self.algebra
        t = algebra.cached(
            "translate",
            (pattern, exact, nul_ok),
            lambda: translate_pattern(pattern, exact, nul_ok, algebra),
        )
        if t.invalid:
            raise ConstraintError(t.refusal, where, keyword)
        if t.refusal:
            self._refuse(where, keyword, t.refusal)
            return None
        if t.rewrite:
            self._record(where, keyword, t.rewrite)
        if self.python_source.setdefault(t.regex, pattern) != pattern:
            self._ambiguous.add(t.regex)
        if exact:
            self.key_source[t.regex] = pattern
        return t.regex

    def key_patterns(self, analysed: dict, where: str, closed: bool = False) -> dict:
        """`patternProperties` with exact backend keys; keys that translate alike are merged
        (an exact translation is the same language, so their schemas both apply). `closed`:
        the object's only pattern, with `additionalProperties: false` and no declared name
        holding NUL, so a key its backend regex misses is refused, as narrowing asks."""
        out: dict = {}
        for key, sub in analysed.items():
            pointer = f"{where}/{escape_pointer(key)}"
            regex = self.translate(key, pointer, "patternProperties", True, nul_ok=closed)
            if regex is not None:
                out[regex] = {"allOf": [out[regex], sub]} if regex in out else sub
        return out

    def judge_sources(self) -> dict[str, str] | None:
        """backend regex -> Python source; None when some regex has two different sources."""
        return None if self._ambiguous else self.python_source

    def source(self, regex: str) -> str | None:
        """The one Python pattern `regex` was translated from (None: unknown or ambiguous).
        Its language, not the possibly narrowed `regex`'s, is what the judge tests."""
        return None if regex in self._ambiguous else self.python_source.get(regex)

    def exact_source(self, regex: str) -> str | None:
        """`source`, but only for a regex whose source is exactly the language of the keyword
        it enforces (a client's pattern), as proofs of disjointness need."""
        return None if regex in self._derived else self.source(regex)

    def complement(self, regex: str) -> str | None:
        """A backend regex for the strings the source of `regex` does not match (None: no
        string), registered with its Python form for the judge. Raises
        NotExpressible when the exact regex algebra cannot build it."""
        src = self.source(regex)
        other = None if src is None else self.algebra.complement(src)
        if other is None:
            what = "an ambiguous narrowed pattern" if src is None else f"pattern {src!r}"
            raise NotExpressible(
                "pattern",
                f"negating {what} is beyond the exact regex algebra (look-arounds, "
                "back-references, word boundaries or anchors inside it, or too large an "
                "automaton)",
            )
        if other.empty:
            return None
        if self.python_source.setdefault(other.backend, other.python) != other.python:
            self._ambiguous.add(other.backend)
        self._derived.add(other.backend)
        return other.backend


def exact_shorthands(pattern: str) -> str:
    """`pattern` with every positive `\\d \\w \\s` outside a negated class written as a negated
    class of its negation, so that `translate_regex` keeps its full Unicode meaning.

    A positive class holding shorthands, `[a-f\\d]`, becomes `(?:[a-f]|[^\\D])`. The caller
    passes only patterns `re` compiles, so a shorthand never ends a range (`re` refuses that).
    """
    out: list[str] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            out.append(_DOUBLE_NEGATION.get(pattern[i + 1], pattern[i : i + 2]))
            i += 2
        elif ch == "[":
            end = _class_end(pattern, i)
            out.append(_exact_class(pattern[i:end]))
            i = end
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _class_end(pattern: str, start: int) -> int:
    """Index just past the `]` closing the class that opens at `start`."""
    i = start + 1
    if i < len(pattern) and pattern[i] == "^":
        i += 1
    if i < len(pattern) and pattern[i] == "]":  # a leading `]` is a literal
        i += 1
    while i < len(pattern) and pattern[i] != "]":
        i += 2 if pattern[i] == "\\" else 1
    return i + 1


def _exact_class(cls: str) -> str:
    if cls.startswith("[^"):
        return cls  # translate_regex prints negated classes exactly
    body, shorthands, i = [], [], 1
    while i < len(cls) - 1:
        if cls[i] == "\\" and cls[i + 1] in _DOUBLE_NEGATION:
            shorthands.append(_DOUBLE_NEGATION[cls[i + 1]])
            i += 2
        else:
            step = 2 if cls[i] == "\\" else 1
            body.append(cls[i : i + step])
            i += step
    if not shorthands:
        return cls
    rest = "".join(body)
    return "(?:" + "|".join(([f"[{rest}]"] if rest else []) + shorthands) + ")"


def python_dialect(schema: Any, sources: dict[str, str], memo: dict | None = None) -> Any:
    """An analysed schema with its backend regexes replaced by their Python sources."""
    memo = {} if memo is None else memo
    if not isinstance(schema, (dict, list)):
        return schema
    if id(schema) in memo:  # analysed schemas share subtrees; keep the copy linear
        return memo[id(schema)]
    if isinstance(schema, list):
        out: Any = [python_dialect(s, sources, memo) for s in schema]
    else:
        out = {}
        for key, value in schema.items():
            if key in ("enum", "const"):
                out[key] = value
            elif key == FRACTION:  # kept for the closers, and read by the judge as a `not`
                out[key], out["not"] = value, {"type": "integer"}  # never beside a `not`
            elif key == UNIQUE:  # the judge's reading of the mark
                out[key], out["uniqueItems"] = value, True
            elif key == "pattern":
                out[key] = sources.get(value, value)
            elif key in ("patternProperties", "properties", "$defs"):
                out[key] = {
                    sources.get(k, k) if key == "patternProperties" else k: python_dialect(
                        v, sources, memo
                    )
                    for k, v in value.items()
                }
            else:
                out[key] = python_dialect(value, sources, memo)
    memo[id(schema)] = out
    return out
