"""A cheap estimate of how large the backend's grammar for an analysed schema grows.

llguidance builds an intersection (`allOf`, or keywords beside `anyOf`/`$ref`) by distributing
it over the alternatives of its parts: `allOf [anyOf [a, b], anyOf [c, d, e]]` becomes six
alternatives, each intersected separately. The rewrites of `oneOf`, `not` and `if` produce
exactly such conjunctions of disjunctions, so a few overlapping branches can multiply into
thousands of alternatives and seconds of compile time. `alternatives` counts them without
building anything, so the analysis can refuse up front with a message naming the keyword.

Copies: none; these helpers only read the schemas they are given.
"""

from __future__ import annotations

from collections.abc import Callable

#: Alternatives an intersection may expand to before the analysis refuses it. Chosen from the
#: MaskBench corpus: every schema that compiles within 2x of llguidance's own p95 stays below.
MAX_ALTERNATIVES = 256
_CAP = 1 << 40  # counts are only compared with the limit; keep the integers small
_MAX_REF_DEPTH = 8


def alternatives(
    s: object,
    lookup: Callable[[str], dict | bool | None],
    memo: dict[int, tuple[int, object]] | None = None,
    depth: int = 0,
) -> int:
    """How many alternatives the backend distributes `s` into when it intersects it.

    `memo` maps id(schema) to (count, schema); holding the schema keeps its id from being
    reused by another object while the memo lives.
    """
    if not isinstance(s, dict):
        return 1
    memo = {} if memo is None else memo
    if id(s) in memo:
        return memo[id(s)][0]
    memo[id(s)] = (1, s)  # a cycle through $ref counts once
    n = 1
    for member in s.get("allOf", ()):
        n = min(_CAP, n * alternatives(member, lookup, memo, depth))
    if "anyOf" in s:
        n = min(_CAP, n * sum(alternatives(b, lookup, memo, depth) for b in s["anyOf"]))
    if "$ref" in s and depth < _MAX_REF_DEPTH:
        target = lookup(s["$ref"])
        n = min(_CAP, n * alternatives(target, lookup, memo, depth + 1))
    memo[id(s)] = (n, s)
    return n


def worst_conjunct(
    node: dict,
    conjuncts: list,
    lookup: Callable[[str], dict | bool | None],
    memo: dict[int, tuple[int, object]],
) -> tuple[int, int] | None:
    """(total alternatives of `node`, index of its largest rewritten conjunct) when `node`
    expands past MAX_ALTERNATIVES; None when it stays within the limit."""
    total = alternatives(node, lookup, memo)
    if total <= MAX_ALTERNATIVES:
        return None
    counts = [alternatives(c, lookup, memo) for c in conjuncts]
    worst = max(range(len(counts)), key=counts.__getitem__)
    if counts[worst] <= 1:  # the schema's own branches, not a rewrite, make it large
        return None
    return total, worst
