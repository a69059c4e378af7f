"""Invalid instances made from valid ones: small edits the judge confirms break the schema.

Every edit is local (one value in the tree changes), so an engine that accepts the result shows
exactly which constraint it failed to enforce.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator
from typing import Any

from corral.fuzz.judge import Judge, Unjudgeable

Path = tuple[Any, ...]
_OTHER_TYPES: tuple[Any, ...] = (0, 1.5, "x", True, None, [], {})


def _paths(value: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*path, i))


def _replace(root: Any, path: Path, new: Any) -> Any:
    if not path:
        return new
    root = copy.deepcopy(root)
    node = root
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = new
    return root


def _edits(value: Any) -> Iterator[Any]:
    """Replacement values for one node: other types, nudged numbers and strings, resized
    containers."""
    for other in _OTHER_TYPES:
        if type(other) is not type(value):
            yield other
    if isinstance(value, bool):
        yield not value
    elif isinstance(value, int | float):
        yield from (value + 1, value - 1, value * 10 + 7, -value - 1, value + 0.5, 10**12)
    elif isinstance(value, str):
        yield from (value + "x", "", value[:-1], value * 3 + "Z", value + "\u00e9!", " " + value)
    elif isinstance(value, list):
        yield []
        if value:
            yield value[:-1]
            yield [*value, value[0]]  # a duplicate breaks uniqueItems
            yield value * 5
        yield [*value, None]
    elif isinstance(value, dict):
        yield {}
        for k in value:
            yield {kk: vv for kk, vv in value.items() if kk != k}
        yield {**value, "zz_extra": 1}


def mutations(judge: Judge, valid: Any, rng: random.Random, limit: int) -> list[Any]:
    """Up to ``limit`` distinct instances, each one edit away from ``valid``, all invalid."""
    candidates = [(p, e) for p, v in _paths(valid) for e in _edits(v)]
    rng.shuffle(candidates)
    out: list[Any] = []
    seen: set[str] = set()
    for path, edit in candidates:
        if len(out) >= limit:
            break
        inst = _replace(valid, path, edit)
        key = repr(inst)
        if key in seen:
            continue
        seen.add(key)
        try:
            if not judge.is_valid(inst):
                out.append(inst)
        except Unjudgeable:
            continue
    return out
