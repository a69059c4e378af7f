"""llguidance's runtime limits: defaults, the raise a probe may ask for, the test knob, and names.

llguidance bounds its own work per step (Earley items in a row and in a step, lexer fuel and
states, grammar size), so a mask can never run away; a matcher that would pass a bound enters a
sticky error state instead (its mask then allows only EOS, and EOS is refused). Corral finds
that at compile time (``probe``) and refuses the constraint, naming the bound.

``CORRAL_LLG_LIMITS`` (a JSON object whose keys are those of :data:`LIMITS`) overrides the limits
wherever a prototype is built (compile, probe, recover, loading a cached entry): tests use it to
drive a real matcher into llguidance's error state. Overrides win over raised limits.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping

#: llguidance's defaults, made explicit.
LIMITS: dict[str, int] = dict(
    max_items_in_row=2000,
    initial_lexer_fuel=1_000_000,
    step_lexer_fuel=200_000,
    step_max_items=50_000,
    max_lexer_states=250_000,
    max_grammar_size=500_000,
)

#: Limits a constraint may be rebuilt with when the probe finds the default too small. One row of
#: an object's optional properties holds about 4 items per property, so this admits objects with
#: about 1,000 optional properties (OpenAI allows 5,000): measured on Llama-3's tokenizer, masks of
#: such an object take 9-16 ms at the median and up to 40 ms (2,000 properties: 27 ms, up to 110 ms;
#: 5,000: 210 ms, up to 770 ms, and 6 s to build - too slow to serve). Step items stay bounded by
#: ``step_max_items``.
RAISED: dict[str, int] = dict(max_items_in_row=4_100)

LIMITS_ENV = "CORRAL_LLG_LIMITS"

# llguidance reports a limit only as text (quirks.LIMITS_ONLY_AS_TEXT), so its messages are
# matched here, in one table, against the fragments its sources emit. Order matters: the first
# fragment found wins.
_MESSAGES: tuple[tuple[str, str, str], ...] = (
    (
        "Current row has",
        "max_items_in_row",
        "too many alternatives are open at one point of the output (llguidance's Earley row "
        "limit); use fewer optional properties in one object, fewer anyOf/oneOf branches or "
        "grammar alternatives side by side, or split them into nested objects",
    ),
    (
        "Too many items",
        "step_max_items",
        "one step of the output needs too much parser work (llguidance's step item limit); "
        "shorten long forced runs (a large minItems of a fixed item, a long const) or use fewer "
        "alternatives side by side",
    ),
    (
        "too many expressions constructed",
        "lexer_fuel",
        "a token-level pattern is too large for the lexer (llguidance ran out of lexer fuel); "
        "use smaller repetition counts (such as a{1000000}) or shorter length bounds",
    ),
    (
        "too many states",
        "max_lexer_states",
        "the lexer automaton grew past llguidance's state limit; use simpler or fewer patterns",
    ),
    (
        "initial lexer configuration",
        "initial_lexer_fuel",
        "the grammar's tokens are too many or too complex to build a lexer for; use fewer or "
        "simpler patterns, enum values or literals",
    ),
    (
        "grammar size",
        "max_grammar_size",
        "the grammar is too large; use fewer rules, properties or alternatives",
    ),
    (
        "too deeply nested",
        "recursion_depth",
        "the grammar nests too deeply for llguidance's parser; flatten it into more rules",
    ),
    (
        "recursion limit exceeded",
        "recursion_depth",
        "the constraint is nested too deeply for llguidance (its recursion limit, reached at "
        "about 64 nested objects or 128 JSON levels); flatten it or use $defs and $ref",
    ),
)


def classify(message: str) -> tuple[str | None, str]:
    """(the limit a backend message reports, what the client can simplify); (None, "") if none."""
    for fragment, limit, advice in _MESSAGES:
        if fragment in message:
            return limit, advice
    return None, ""


_ROW_ITEMS = re.compile(r"Current row has (\d+) items")


def needed(limit: str | None, message: str) -> int | None:
    """The value ``limit`` would have needed at the point that failed, where the message says."""
    if limit == "max_items_in_row" and (m := _ROW_ITEMS.search(message)):
        return int(m.group(1))
    return None


def first_line(message: str) -> str:
    """The first line of a backend message (llguidance appends its state and the grammar)."""
    text = message.strip()
    return text.splitlines()[0][:1000] if text else ""


def effective_limits(raised: Mapping[str, int] | None = None) -> dict[str, int]:
    """The limits to build with: the defaults, then ``raised``, then ``CORRAL_LLG_LIMITS``."""
    out = dict(LIMITS)
    if raised:
        out.update(raised)
    out.update(_overrides(os.environ.get(LIMITS_ENV, "")))
    return out


def _overrides(text: str) -> dict[str, int]:
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{LIMITS_ENV} is not JSON: {e}") from None
    if not isinstance(value, dict) or not all(
        k in LIMITS and isinstance(v, int) and not isinstance(v, bool) and v > 0
        for k, v in value.items()
    ):
        raise ValueError(
            f"{LIMITS_ENV} must be a JSON object mapping some of {sorted(LIMITS)} to positive "
            f"integers, not {text!r}"
        )
    return dict(value)


def check_raised(raised: Mapping[str, int]) -> dict[str, int]:
    """``raised`` as stored in a cache entry, checked: only known keys, never above RAISED."""
    out = {}
    for k, v in raised.items():
        if k not in RAISED or not isinstance(v, int) or not LIMITS[k] <= v <= RAISED[k]:
            raise ValueError(f"limit {k}={v!r} is not one Corral raises to")
        out[k] = v
    return out
