"""What the JSON-Schema analysis changed: one record per keyword rewrite it applied.

A receipt lists these beside lenient mode's unenforced keywords, so a client can see that the
grammar it was served is not its schema read literally but an equivalent (or, for a narrowed
pattern, a narrower) one. Only real rewrites are recorded, where what is compiled differs from
the keyword as written; a keyword the backend takes as it is leaves no record.

The names below are the whole vocabulary (machine-readable: clients may match on them). Each
record travels with the compiled constraint and its cache entries, so a cache hit reports what
the compile did.
"""

from __future__ import annotations

from typing import NamedTuple


class Rewritten(NamedTuple):
    """A keyword the analysis rewrote: where (JSON pointer of the keyword in the input schema),
    which keyword, and what it did (one of the names below)."""

    pointer: str
    keyword: str
    rewrite: str


NOT_NOT = "not not removed"
NOT_FOLDED = "not folded"
ONE_OF_DISJOINT = "oneOf->anyOf (branches disjoint)"
ONE_OF_NEGATED = "oneOf->anyOf (overlapping branches negated)"
ONE_OF_SINGLE = "oneOf->its only satisfiable branch"
ONE_OF_FALSE = "oneOf->false (branches overlap on every type)"
IF_ANY_OF = "if/then/else->anyOf"
DEPENDENCIES_ANY_OF = "dependencies->anyOf (key absent or dependency met)"
PROPERTY_NAMES_KEYS = "propertyNames->key set"
UNIQUE_ITEMS_DROPPED = "uniqueItems dropped (at most one item)"
UNIQUE_ITEMS_ENUM = "uniqueItems->enum of arrangements"
UNEVALUATED = {
    "unevaluatedProperties": "unevaluatedProperties->additionalProperties",
    "unevaluatedItems": "unevaluatedItems->items",
}
ITEMS_TUPLE = "items array->prefixItems"
REF_ALONE = "keywords beside $ref ignored (drafts 3 to 7)"
BOOLEAN_BOUND = "boolean exclusive bound->exclusive bound (drafts 3 and 4)"
FORMAT_PATTERN = "format->pattern"
PATTERN_LOOKAROUND = "pattern lookaround rewritten"
PATTERN_NARROWED = "pattern shorthand classes narrowed to ASCII"
PATTERN_NUL = "pattern class narrowed: NUL left out (the backend's JSON quoting)"
FOLDED_ENUM = "conjunction folded into enum"
DISTINCT_KEYS = "repeated keys checked at value boundaries"
FRACTION_CHECK = "not integer->fraction checked at value boundaries (plain decimal, 15 digits)"
UNIQUE_CHECK = "uniqueItems checked at value boundaries (open string items)"
UNIQUE_CHECK_LISTED = "uniqueItems checked at value boundaries (listed string items)"
UNIQUE_CHECK_OPEN = (
    "uniqueItems checked at value boundaries (open items; a number item in plain decimal)"
)
#: the rewrites that rely on a mark the matcher checks (``value_sites``)
VALUE_CHECKS = (FRACTION_CHECK, UNIQUE_CHECK, UNIQUE_CHECK_LISTED, UNIQUE_CHECK_OPEN)
ANY_ORDER = "optional properties in any order"
