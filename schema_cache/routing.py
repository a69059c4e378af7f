"""Which compiles run in process and which in a killable worker (``isolation="auto"``).

In process, a compile that passes its deadline is abandoned and the caller gets its error on
time — as long as the slow part lets go of the GIL. Python code does; llguidance's grammar
build (``LLMatcher``) and xgrammar's compiles do; llguidance's JSON-schema-to-grammar
conversion does not, and neither does any thread whose native code runs without bound.
So "auto" sends to a worker process what could be slow in those places:

* EBNF grammars: they may fall back to xgrammar, whose compile has no work limit;
* large sources (``inline_max_source_bytes``): conversion time grows with the source, and a
  deeply nested ``oneOf``/``anyOf`` written out in full grows exponentially with its depth;
* JSON schemas whose ``allOf`` multiplies ``anyOf``/``oneOf`` branches (llguidance expands the
  product: five ``allOf`` members of five branches each take over a second).

Everything else — nearly every real schema — compiles in process, fast.
"""

from __future__ import annotations

import json
from typing import Any

from corral.grammar import ConstraintKind, ConstraintSpec

#: ``allOf`` fan-out (product of branch counts) above which a schema compiles in a worker.
MAX_INLINE_FANOUT = 64
_FANOUT_CAP = 1 << 20  # stop multiplying once a schema is clearly risky


def needs_process(spec: ConstraintSpec, inline_max_source_bytes: int) -> bool:
    """True when ``spec`` should compile in a killable worker process."""
    if spec.kind is ConstraintKind.EBNF:
        return True
    if len(spec.source) > inline_max_source_bytes:
        return True
    if spec.kind is ConstraintKind.JSON_SCHEMA and '"allOf"' in spec.source:
        try:
            schema = json.loads(spec.source)
        except RecursionError:
            return True  # the compile refuses it (nesting_depth); no reason to do that here
        return combinator_fanout(schema) > MAX_INLINE_FANOUT
    return False


def combinator_fanout(schema: Any) -> int:
    """The largest number of alternatives any node expands to when ``allOf`` is distributed.

    ``anyOf``/``oneOf`` add their members' alternatives, ``allOf`` multiplies them; ``$ref``
    is not followed (a reference counts as one alternative).
    """
    worst = 1

    def visit(node: Any) -> int:
        nonlocal worst
        if isinstance(node, list):
            for x in node:
                visit(x)
            return 1
        if not isinstance(node, dict):
            return 1
        here = 1
        for key, value in node.items():
            if key in ("anyOf", "oneOf") and isinstance(value, list):
                here = min(_FANOUT_CAP, here * max(1, sum(visit(x) for x in value)))
            elif key == "allOf" and isinstance(value, list):
                for x in value:
                    here = min(_FANOUT_CAP, here * visit(x))
            else:
                visit(value)
        worst = max(worst, here)
        return here

    try:
        visit(schema)
    except RecursionError:
        return _FANOUT_CAP  # nested deeper than Python recurses: certainly not a quick compile
    return worst
