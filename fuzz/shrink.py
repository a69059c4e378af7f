"""Delta debugging: the smallest schema and instance that still show a failure.

Greedy first-improvement search over edits that only make things smaller: hoist a subschema (and
the matching part of the instance) to the root, delete a keyword, a property or a branch, replace
a subschema with ``{}``, then trim the instance. Every candidate is judged by the caller's
``still_fails(schema, text)``; the search stops at a fixed point or when its budget runs out.

Schema copies: every schema edit is made on a deep copy, so the schema passed in is never changed
(a candidate that only trims the instance passes the schema on as it is).
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

from corral.fuzz.judge import ANNOTATIONS, dumps, iter_nodes

Pred = Callable[[Any, str], bool]
_NONEMPTY = {"anyOf", "oneOf", "allOf", "prefixItems", "enum", "type"}
_SIMPLE: tuple[Any, ...] = (None, 0, "", False, [], {})


def shrink(
    schema: Any,
    text: str,
    still_fails: Pred,
    *,
    max_evals: int = 400,
    max_seconds: float = 10.0,
    edit_instance: bool = True,
) -> tuple[Any, str, int]:
    """Shrink ``(schema, text)`` while ``still_fails`` holds; returns them and the eval count.

    ``edit_instance`` False keeps the instance as evidence: it only ever becomes a verbatim part
    of itself (a hoist takes the part under the hoisted subschema), never an edited value."""
    deadline, evals = time.monotonic() + max_seconds, 0
    seen: set[str] = set()
    improved = True
    while improved and evals < max_evals and time.monotonic() < deadline:
        improved = False
        size = _size(schema, text)
        for cand_schema, cand_text in _candidates(schema, text, edit_instance):
            key = json.dumps(cand_schema, sort_keys=True) + "\x00" + cand_text
            if key in seen or _size(cand_schema, cand_text) >= size:
                continue
            seen.add(key)
            evals += 1
            if _safe(still_fails, cand_schema, cand_text):
                schema, text, improved = cand_schema, cand_text, True
                break
            if evals >= max_evals or time.monotonic() >= deadline:
                break
    return schema, text, evals


def _safe(pred: Pred, schema: Any, text: str) -> bool:
    try:
        return bool(pred(schema, text))
    except Exception:  # a candidate the judge or engine cannot handle is simply not smaller
        return False


def _size(schema: Any, text: str) -> int:
    return len(json.dumps(schema)) + len(text)


def _candidates(schema: Any, text: str, edit_instance: bool) -> Iterator[tuple[Any, str]]:
    try:
        value = json.loads(text)
    except ValueError:
        value = _NO_VALUE
    if value is not _NO_VALUE:
        for sub, part in _hoists(schema, value):
            if (t := _dumps(part)) is not None:
                yield sub, t
    for s in _schema_edits(schema):
        yield s, text
    if value is not _NO_VALUE and edit_instance:
        for v in _value_edits(value):
            if (t := _dumps(v)) is not None:
                yield schema, t


def _dumps(value: Any) -> str | None:
    try:
        return dumps(value)
    except ValueError:  # a non-finite float has no JSON text
        return None


_NO_VALUE = object()


def _keep_defs(root: dict, sub: Any) -> Any:
    """``sub`` as a new root, still carrying the root's definitions its ``$ref``s may need."""
    defs = {k: root[k] for k in ("$defs", "definitions") if k in root}
    if not defs or not isinstance(sub, dict) or '"#/' not in json.dumps(sub):
        return copy.deepcopy(sub)
    return {**copy.deepcopy(defs), **copy.deepcopy(sub)}


def _hoists(schema: Any, value: Any) -> Iterator[tuple[Any, Any]]:
    """(subschema, sub-instance) pairs one level down from the root."""
    if not isinstance(schema, dict):
        return
    for key in ("anyOf", "oneOf", "allOf"):
        for branch in schema.get(key) or []:
            yield _keep_defs(schema, branch), value
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/") and "/" not in ref[8:]:
        target = schema.get("$defs", {}).get(ref[8:])
        if target is not None:
            yield _keep_defs(schema, target), value
    if isinstance(value, dict):
        for k, sub in (schema.get("properties") or {}).items():
            if k in value:
                yield _keep_defs(schema, sub), value[k]
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for k in value:
                yield _keep_defs(schema, extra), value[k]
    if isinstance(value, list):
        for j, sub in enumerate(schema.get("prefixItems") or []):
            if j < len(value):
                yield _keep_defs(schema, sub), value[j]
        if isinstance(schema.get("items"), dict):
            for element in value[:4]:
                yield _keep_defs(schema, schema["items"]), element


def _at(root: Any, pointer: str) -> Any:
    node = root
    for part in pointer.split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def _schema_edits(schema: Any) -> Iterator[Any]:
    if isinstance(schema, dict) and schema:
        yield {}
    for pointer, node in list(iter_nodes(schema)):
        for key in sorted(node, key=lambda k: (k not in ANNOTATIONS, k)):
            s = copy.deepcopy(schema)
            del _at(s, pointer)[key]
            yield s
            value = node[key]
            if isinstance(value, dict) and len(value) > 1 and key != "const":
                yield from _drop_entries(schema, pointer, key, list(value))
            elif isinstance(value, list) and len(value) > 1:
                for i in range(len(value)):
                    s = copy.deepcopy(schema)
                    del _at(s, pointer)[key][i]
                    yield s
            elif isinstance(value, list) and value and key not in _NONEMPTY:
                s = copy.deepcopy(schema)
                _at(s, pointer)[key] = []
                yield s
        if pointer and node:
            s = copy.deepcopy(schema)
            parent, last = pointer.rsplit("/", 1)
            container = _at(s, parent)
            last = last.replace("~1", "/").replace("~0", "~")
            container[int(last) if isinstance(container, list) else last] = {}
            yield s


def _drop_entries(schema: Any, pointer: str, key: str, names: list[str]) -> Iterator[Any]:
    """Delete half the entries of a named container at once, then one at a time."""
    groups = [names[: len(names) // 2], names[len(names) // 2 :]] if len(names) > 3 else []
    for group in [*groups, *([n] for n in names)]:
        s = copy.deepcopy(schema)
        container = _at(s, pointer)[key]
        for n in group:
            container.pop(n, None)
        yield s


def _value_edits(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for k in value:
            yield {kk: vv for kk, vv in value.items() if kk != k}
        for k in value:
            for short in (k[: len(k) // 2], k[1:]) if len(k) > 1 else ():
                if short not in value:
                    yield {(short if kk == k else kk): vv for kk, vv in value.items()}
        for k, v in value.items():
            for e in _value_edits(v):
                yield {**value, k: e}
    elif isinstance(value, list):
        for i in range(len(value)):
            yield value[:i] + value[i + 1 :]
        for i, v in enumerate(value):
            for e in _value_edits(v):
                yield [*value[:i], e, *value[i + 1 :]]
    else:
        yield from (s for s in _SIMPLE if s != value or type(s) is not type(value))
        if isinstance(value, str) and len(value) > 1:
            yield value[: len(value) // 2]
            yield value[1:]
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 9:
            yield int(str(value)[:-1])
        if isinstance(value, float) and math.isfinite(value):
            yield round(value)
            yield round(value, 1)
