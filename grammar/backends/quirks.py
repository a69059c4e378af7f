"""Every version quirk of the grammar backends that Corral works around, each stated once.

A quirk is something llguidance or xgrammar does, as measured on one release, that Corral's
code depends on or works around: a bug (a class that lets ``"`` through), a gap (keywords it
does not implement), or a choice upstream may change (the order it lays properties out in).
Each is a :class:`Quirk` record here: what the backend does, the version it was seen on, and
which Corral code deals with it. Where the workaround computes with the fact (a class rule, a
keyword list, a number spelling, a replacement definition), that fact is defined next to the
record, and the analysis reads it from here instead of restating it.

Every record has a test in ``tests/grammar/test_backend_quirks.py``, named after the backend,
the version and the record (``test_llguidance_1_9_1_<name>``), that drives the real backend
and fails when it no longer behaves this way. After a backend upgrade, a failing quirk test
names the workaround to drop or revise; a passing one means ``seen_on`` may be moved on.

This module imports nothing from the rest of Corral, so any layer of ``corral.grammar`` may
read it.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

LLGUIDANCE = "llguidance"
XGRAMMAR = "xgrammar"


@dataclass(frozen=True)
class Quirk:
    """A backend behaviour Corral works around, as seen on one release of that backend."""

    backend: str
    #: The backend release the behaviour was measured on.
    seen_on: str
    #: What the backend does.
    behaviour: str
    #: Where Corral works around it, and how.
    workaround: str

    def installed(self) -> str:
        """The installed release of the backend."""
        return importlib.metadata.version(self.backend)

    def note(self) -> str:
        """What an assertion says when the behaviour is gone."""
        return (
            f"{self.backend} {self.installed()} no longer behaves as recorded on "
            f"{self.backend} {self.seen_on} ({self.behaviour}); revisit: {self.workaround}"
        )


# -- regexes inside JSON strings ----------------------------------------------------------------

CONTROL_CLASS_LETS_QUOTES_THROUGH = Quirk(
    LLGUIDANCE,
    "1.9.1",
    "inside a JSON string, a character class that holds every control character (U+0000 to "
    'U+001F) lets `"` and `\\` through, whether or not the class holds them: the pattern '
    '`^[^"]*$` accepted `a"b`',
    "json_safe (below) leaves NUL out of such a class, a narrowing: regex/translate.py and "
    "regex/algebra.py print every class through it, schema/negate.py's 'every other string' "
    "regex leaves NUL out the same way (negation_lets_quotes_through), and schema/patterns.py "
    "refuses a key pattern that needed it (rewrite_log.PATTERN_NUL records the narrowing)",
)

#: The control characters (first, last) whose presence, all together in one class, lets quotes
#: through (:data:`CONTROL_CLASS_LETS_QUOTES_THROUGH`).
JSON_CONTROLS = (0x00, 0x1F)
#: The code point :func:`json_safe` leaves out of such a class.
LEFT_OUT = 0x00
_QUOTE, _BACKSLASH = ord('"'), ord("\\")


def lets_quotes_through(ranges: list[tuple[int, int]]) -> bool:
    """Whether a class of these code-point ranges (sorted, disjoint, inclusive) lets `"` and
    `\\` through where it should not: it holds every control character but not both of them."""
    lo, hi = JSON_CONTROLS
    covers = any(a <= lo and b >= hi for a, b in ranges)
    whole = all(any(a <= c <= b for a, b in ranges) for c in (_QUOTE, _BACKSLASH))
    return covers and not whole


def json_safe(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``ranges`` for a class inside a JSON string pattern: where they hold every control
    character but not both `"` and `\\` (:func:`lets_quotes_through`), NUL is left out (a
    narrowing: a class missing one control character is quoted right by the backend)."""
    if not lets_quotes_through(ranges):
        return ranges
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        if a <= LEFT_OUT <= b:
            if b > LEFT_OUT:
                out.append((LEFT_OUT + 1, b))
        else:
            out.append((a, b))
    return out


def negation_lets_quotes_through(excluded: Iterable[str]) -> bool:
    """Whether the negated class ``[^excluded]`` (single characters) lets quotes through: it
    excludes `"` or `\\` but no control character. Leave :data:`LEFT_OUT` out of it too."""
    chars = set(excluded)
    return bool({'"', "\\"} & chars) and not any(ord(c) <= JSON_CONTROLS[1] for c in chars)


ONE_CLASS_ALTERNATIVES_MERGED = Quirk(
    LLGUIDANCE,
    "1.9.1",
    "alternatives that are each one character class are merged into one class before the "
    'JSON quoting above applies: `(?:[\\x00-\\x0f]|[\\x10-\\x1f]|a)*` lets `"` through, though '
    "neither class holds every control character",
    "regex/translate.py (a BRANCH) and regex/algebra.py (_print) merge one-class alternatives "
    "themselves before json_safe sees the class",
)

# -- numbers ------------------------------------------------------------------------------------

LISTED_NUMBERS_SPELT_PLAIN = Quirk(
    LLGUIDANCE,
    "1.9.1",
    "a number listed in `enum`/`const` is written in plain decimal, in the fewest digits that "
    "read back as the same float, and an integral float as an integer: 1.0 as `1` (`1.0` is "
    "refused), 1e20 as `100000000000000000000`, 1.5e-7 as `0.00000015`",
    "checks/open_items.py (_listed) lists no floats after an object's last open member (one "
    "spelling per value is needed there); closing/partial_values.py (_listed_numbers) finishes "
    "a listed number as listed_number_text spells it",
)


def listed_number_text(value: int | float) -> str:
    """The only text the backend accepts for ``value`` listed in an ``enum``/``const``
    (:data:`LISTED_NUMBERS_SPELT_PLAIN`)."""
    if isinstance(value, int):
        return str(value)
    text = format(Decimal(repr(value)), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


# -- object layout ------------------------------------------------------------------------------

DECLARED_PROPERTIES_IN_ORDER = Quirk(
    LLGUIDANCE,
    "1.9.1",
    "an object's declared `properties` are laid out in the order the schema lists them, and "
    "before its free-form keys (`patternProperties`, `additionalProperties`), which come in any "
    'order: with `a` and `b` declared, `{"b":2,"a":1}` is refused although it is valid',
    "schema/order.py (free_order) turns the optional properties of open objects into pattern "
    "properties `^p$`, together with the repeated-key check (checks/distinct_keys.py); objects "
    "with a required key declared after an optional one keep their declared order",
)

MERGED_PROPERTIES_IN_KEYWORD_ORDER = Quirk(
    LLGUIDANCE,
    "1.9.1",
    "the object keywords of `allOf` parts, of `anyOf` branches and of a `$ref` target are "
    "merged with those of the schema that holds them into one object, whose properties are laid "
    "out in the order the keywords are written: `properties` before `anyOf` lays the holder's "
    "own properties out first, `anyOf` before `properties` the branch's",
    "schema/order.py leaves merged nodes and the definitions they reach as they are "
    "(schema/backend_merges.py: merged_definitions); core/spec.py's canonical form keeps the "
    "written order of LAYOUT_KEYWORDS (its _LAYOUT_KEYWORDS, checked equal by the test)",
)

#: The keywords whose properties are merged into one layout in the order they are written
#: (:data:`MERGED_PROPERTIES_IN_KEYWORD_ORDER`; `oneOf`, `if`, `not` and dependencies are
#: rewritten into conjuncts placed after all of these).
LAYOUT_KEYWORDS = frozenset(("properties", "allOf", "anyOf", "$ref"))

PATTERN_KEYS_READ_BEFORE_APPLICATORS = Quirk(
    LLGUIDANCE,
    "1.9.1",
    "an `allOf`/`anyOf`/`oneOf` is merged with the sibling keywords read before it, and "
    "`patternProperties` or `additionalProperties` written after it are lost to the merge: "
    '`{"additionalProperties": false, "allOf": [{"required": ["a"]}], "patternProperties": '
    '{"^a$": ...}}` is refused as unsatisfiable, and compiles with the pattern keys first',
    "schema/backend_merges.py (pattern_keys_first, applied by backends/llg.py to every schema) "
    "moves READ_BEFORE_APPLICATORS ahead of the first of APPLICATORS_READ_IN_ORDER",
)

#: The keywords llguidance merges with the sibling keywords it has read so far.
APPLICATORS_READ_IN_ORDER = frozenset(("allOf", "anyOf", "oneOf"))
#: The siblings such a merge loses when they are written after it.
READ_BEFORE_APPLICATORS = ("patternProperties", "additionalProperties")

PATTERN_KEYS_DISJOINT = Quirk(
    LLGUIDANCE,
    "1.9.1",
    "`patternProperties` regexes of one object, its own and those merged from `allOf`/`anyOf`/"
    "`$ref`, must be disjoint: `^p$` beside `^p` is refused ('are not disjoint'), where JSON "
    "Schema applies both",
    "schema/order.py frees no optional property of an object with its own patternProperties, "
    "nor inside merged nodes (a freed `^p$` could overlap a pattern there)",
)

MIN_MAX_PROPERTIES_NEED_ALL_REQUIRED = Quirk(
    LLGUIDANCE,
    "1.9.1",
    "`minProperties`/`maxProperties` are refused ('only supported when all keys listed in "
    '"properties" are required\') on an object with optional declared properties and '
    "free-form keys; with every declared property required they are enforced over the "
    "pattern and additional keys",
    "schema/order.py's rewrite makes the optional properties pattern properties, so such "
    "objects compile",
)

REPEATED_KEYS_COUNT = Quirk(
    LLGUIDANCE,
    "1.9.1",
    "a free-form key (additional or pattern property) written twice counts twice towards "
    '`minProperties`: `{"p":1,"p":2}` meets `minProperties: 2`, though a JSON parser keeps one',
    "schema/analysis.py (_guard_min_properties) enforces such a bound only together with the "
    "repeated-key check (checks/distinct_keys.py), and refuses it where that check could dead-end",
)

# -- keywords, formats, regex syntax ------------------------------------------------------------

REFUSED_KEYWORDS = Quirk(
    LLGUIDANCE,
    "1.9.1",
    "these JSON Schema keywords are refused ('Unimplemented keys', or for `oneOf` 'not "
    "supported' unless coerced to `anyOf`): NOT_IMPLEMENTED_KEYWORDS",
    "schema/rewrite.py rewrites them into keywords the backend implements exactly, or refuses "
    "them with Corral's own message (`contains`, `minContains`, `maxContains`)",
)

#: The keywords of :data:`REFUSED_KEYWORDS`.
NOT_IMPLEMENTED_KEYWORDS = frozenset(
    "oneOf not if dependentRequired dependentSchemas propertyNames uniqueItems "
    "unevaluatedProperties unevaluatedItems contains minContains maxContains".split()
)

LOOSE_FORMATS = Quirk(
    LLGUIDANCE,
    "1.9.1",
    "its own regexes for `format` accept strings the judge (jsonschema's format checker) "
    "refuses: `date` accepts 2023-02-29, `date-time` and `time` a leap second (23:59:60), "
    "`hostname` a name over 253 characters",
    "schema/formats.py never hands `format` to the backend: a checked format becomes a pattern "
    "whose language is a subset of what the checker accepts, or is refused",
)

END_ANCHOR_ONLY_AT_END = Quirk(
    LLGUIDANCE,
    "1.9.1",
    "a regex may carry `$` only at its end: `a$b?` is refused ('lookarounds not supported')",
    "regex/translate.py (_end_inside) refuses such a regex constraint by name; a `pattern` is "
    "rewritten without it (regex/algebra.py: regular with narrow_ends)",
)

# -- limits and messages ------------------------------------------------------------------------

LIMITS_ONLY_AS_TEXT = Quirk(
    LLGUIDANCE,
    "1.9.1",
    "a runtime or grammar limit is reported only as message text, with no code: 'Current row "
    "has', 'Too many items', 'too many expressions constructed', 'too many states', 'initial "
    "lexer configuration', 'grammar size', 'too deeply nested', 'recursion limit exceeded'",
    "backends/llg_limits.py (_MESSAGES, classify) matches those fragments to name the limit "
    "in ConstraintError.limit and to advise the client",
)

JSON_READER_DEPTH = Quirk(
    LLGUIDANCE,
    "1.9.1",
    "its JSON reader stops at JSON_READER_LEVELS levels ('recursion limit exceeded'): "
    "`grammar_from_json_schema` raises ValueError for a schema 128 levels deep, and a schema of "
    "125 to 127 levels is refused when the matcher reads its grammar document, which wraps it "
    "in 3 more; 124 levels compile",
    "backends/llg.py (grammar_from_schema) turns the ValueError into a refusal, "
    "backends/llg_limits.py names the limit `recursion_depth`, core/input_checks.py refuses "
    "deeper schemas itself (its message names llguidance's 128), and api/config.py's "
    "max_schema_depth stays well below it",
)

#: The JSON depth at which llguidance's reader stops (:data:`JSON_READER_DEPTH`).
JSON_READER_LEVELS = 128

# -- grammars -----------------------------------------------------------------------------------

LARK_ESCAPED_STRING_TAKES_NEWLINE = Quirk(
    LLGUIDANCE,
    "1.9.1",
    "its built-in `common.ESCAPED_STRING` lets a raw newline into the string; Lark's own "
    "definition (the one a Lark grammar's author means) does not",
    "backends/llg.py (grammar_from_lark) replaces `%import common.ESCAPED_STRING` with "
    "LARK_ESCAPED_STRING",
)

#: Lark's own ``ESCAPED_STRING`` (:data:`LARK_ESCAPED_STRING_TAKES_NEWLINE`).
LARK_ESCAPED_STRING = 'ESCAPED_STRING: /"(\\\\[^\\n]|[^"\\\\\\n])*"/'

# -- matchers -----------------------------------------------------------------------------------

EOS_AFTER_STOP_UNRECORDED = Quirk(
    LLGUIDANCE,
    "1.9.1",
    "an EOS consumed once the matcher has stopped by itself (after a JSON root's closing "
    "brace) is accepted but not recorded: `rollback(1)` then undoes the token before it",
    "backends/llg.py (LLGuidanceMatcher: _eos_unrecorded) does not hand such an EOS to rollback",
)

ERROR_READS_AS_STOPPED = Quirk(
    LLGUIDANCE,
    "1.9.1",
    "a matcher in its error state (a runtime limit passed) reports `is_stopped()` true",
    "backends/llg.py (LLGuidanceMatcher.is_terminated, can_terminate) also ask `is_error()`",
)

TRY_CONSUME_HIDES_LEXER_LIMIT = Quirk(
    LLGUIDANCE,
    "1.9.1",
    "once the lexer automaton that copies of a matcher share has reached its state limit, "
    "`try_consume_tokens` refuses a token that needs a new state just as one the grammar "
    "forbids, and leaves the matcher healthy (`consume_token` of the same token enters the "
    "error state and says why)",
    "backends/llg.py (try_consume) tries a refused token once more on a copy, and takes the "
    "copy's error state when it failed on a limit",
)

FORCED_BYTES_MASK_ONE_SPELLING = Quirk(
    LLGUIDANCE,
    "1.9.1",
    "where the grammar forces bytes that tokenize into two or more tokens, the mask allows only "
    'the first token of their canonical tokenization (after `{"collector`: only `":{"`), '
    'while `consume_token` takes any spelling of them (`"`, `":`) and, in a flexible JSON '
    "layout, whitespace before them: a mask stricter than the grammar, a false reject",
    "backends/llg.py (LLGuidanceMatcher.accept) refuses, where bytes are forced, every token "
    "but the one the mask allows (llguidance's `compute_ff_tokens`): the mask keeps the "
    "canonical spelling a model is trained on, and accept agrees with it token for token",
)

RAISES_WHEN_TERMINATED = Quirk(
    XGRAMMAR,
    "0.2.9",
    "once a stop token is accepted, `fill_next_token_bitmask` and `find_jump_forward_string` "
    "raise (RuntimeError: 'Check failed: (!IsStopTokenAccepted())')",
    "backends/xgr.py (XGrammarMatcher.fill_mask, forced_continuation) answer for a terminated "
    "matcher without asking xgrammar: no token allowed, nothing forced",
)

#: Every quirk, by name.
QUIRKS: dict[str, Quirk] = {k: v for k, v in globals().items() if isinstance(v, Quirk)}
