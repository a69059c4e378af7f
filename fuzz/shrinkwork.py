"""Shrinking a failure: one found by :mod:`corral.fuzz.casework`, with the failing target
itself; one found on a URL, with the judge alone (:func:`shrink_output`).

Schema copies: the shrinker edits copies of the failure's schema, never the schema itself, and
the target under test compiles a copy of each candidate, so an engine that rewrote its input
could not make the reported schema differ from the one that was shown to fail.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from corral.fuzz import case as K
from corral.fuzz.case import Failure
from corral.fuzz.judge import Judge, broken_keywords, dumps, parse_output, schema_keywords
from corral.fuzz.keyorder import schema_order
from corral.fuzz.probe import TokenView, check_tokens
from corral.fuzz.shrink import shrink
from corral.fuzz.stats import LogHistogram
from corral.fuzz.targets import Refused, Target

SHRINKABLE = (K.UNSOUND, K.INCOMPLETE)


def failure_predicate(kind: str, target: Target, view: TokenView, seed: dict[str, Any]) -> Any:
    """``still_fails(schema, text)`` for an unsound or incomplete finding.

    Unsound: the judge rejects ``text`` (or it is not JSON) and the target accepts it token by
    token, in schema key order or as written. Incomplete: the judge accepts it and the target
    refuses it even in schema key order. A schema the judge cannot read or the target refuses
    never reproduces the failure. ``seed`` maps canonical schema texts to compiled handles.
    """
    compiled: dict[str, Any] = dict(seed)

    def accepts(handle: Any, text: str) -> bool:
        return check_tokens(
            target.matcher(handle), view, view.encode(text), LogHistogram()
        ).accepted

    def still_fails(schema: Any, text: str) -> bool:
        judge = Judge(schema)
        value, problem = parse_output(text.encode())
        valid = not problem and judge.is_valid(value)
        if valid == (kind == K.UNSOUND):
            return False
        key = json.dumps(schema, sort_keys=True)
        if key not in compiled:
            try:
                compiled[key] = target.compile(copy.deepcopy(schema))
            except Refused:
                compiled[key] = None
        if compiled[key] is None:
            return False
        ordered = text if problem else dumps(schema_order(schema, value))
        if kind == K.INCOMPLETE:
            return not accepts(compiled[key], ordered)
        return accepts(compiled[key], ordered) or (ordered != text and accepts(compiled[key], text))

    return still_fails


def shrink_failure(
    f: Failure, target: Target, view: TokenView, seconds: float, handle: Any
) -> None:
    """Shrink ``f`` in place when it reproduces token by token; note it in ``detail`` if not.
    ``handle`` is the target's compiled form of ``f.schema`` (saves compiling it again)."""
    if f.kind not in SHRINKABLE or f.text is None or not f.shrinkable:
        return
    pred = failure_predicate(f.kind, target, view, {json.dumps(f.schema, sort_keys=True): handle})
    try:
        reproduces = pred(f.schema, f.text)
    except Exception:  # the judge or the engine cannot rerun it: keep the finding as found
        reproduces = False
    if not reproduces:
        f.detail += " (does not reproduce from its canonical tokenization; not shrunk)"
        return
    f.schema, f.text, _ = shrink(f.schema, f.text, pred, max_seconds=seconds)
    f.shrunk = True
    f.keywords = tuple(sorted(schema_keywords(f.schema)))


def shrink_output(f: Failure, seconds: float) -> None:
    """Shrink an unsound output of a URL target in place, with the judge alone, and name the
    keywords it breaks in ``f.dropped``.

    A server cannot replay an output token by token, so the output stays the evidence: only the
    schema shrinks, and the output only ever becomes a verbatim part of itself (the part under a
    hoisted subschema). A candidate is kept while the output still breaks some of the keywords
    it broke at first and no others, so the shrunk schema names what the server dropped. An
    output that is not JSON breaks no keyword and is kept as found."""
    assert f.text is not None
    first = set(broken_keywords(f.schema, f.text))
    f.dropped = tuple(sorted(first))
    if not first:
        return

    def still_breaks(schema: Any, text: str) -> bool:
        got = set(broken_keywords(schema, text))
        return bool(got) and got <= first

    schema, text, _ = shrink(
        f.schema, f.text, still_breaks, max_seconds=seconds, edit_instance=False
    )
    schema = _typed(schema, text, still_breaks)
    if schema != f.schema or text != f.text:
        f.schema, f.text, f.shrunk = schema, text, True
        f.keywords = tuple(sorted(schema_keywords(schema)))
        f.dropped = broken_keywords(schema, text)


def _typed(schema: Any, text: str, still_breaks: Any) -> Any:
    """``schema`` with the output's own JSON type added at the root when shrinking took it away
    (``{"type": "integer", "multipleOf": 7}`` rather than ``{"multipleOf": 7}``): sent again,
    the shrunk schema then asks for the same kind of value."""
    if not isinstance(schema, dict) or "type" in schema:
        return schema
    value, _ = parse_output(text.encode())
    kinds = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array"}
    kind = "object" if isinstance(value, dict) else "null" if value is None else kinds[type(value)]
    typed = {"type": kind, **schema}
    return typed if still_breaks(typed, text) else schema
